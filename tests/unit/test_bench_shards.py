"""benchmarks.shards: the pure parts (configurations, the balanced assignment, rates,
the outage split and the printed table)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.shards import (
    Config,
    error_code,
    fair_split,
    is_spread,
    parse_configs,
    per_s,
    split_by_outage,
    table_rows,
    us_per,
)


def test_configs_parse_shards_by_processes() -> None:
    assert parse_configs("1x1, 2x2,4X2") == (Config(1, 1), Config(2, 2), Config(4, 2))
    assert Config(4, 2).name == "4x2"


@pytest.mark.parametrize("bad", ["2", "x2", "2x", "0x1", "2x0", "65x1", "a x b", ""])
def test_a_bad_configuration_is_named_in_the_error(bad: str) -> None:
    with pytest.raises(ValueError, match="--configs"):
        parse_configs(f"1x1,{bad}")


@pytest.mark.parametrize(
    ("shards", "processes", "split"),
    [(1, 1, [1]), (4, 4, [1, 1, 1, 1]), (4, 2, [2, 2]), (5, 2, [3, 2]), (2, 3, [1, 1, 0])],
)
def test_fair_split(shards: int, processes: int, split: list[int]) -> None:
    assert fair_split(shards, processes) == split


@pytest.mark.parametrize(
    ("held", "shards", "spread"),
    [
        ([{0}, {1}], 2, True),
        ([{0, 1}, set()], 2, False),  # the first one holds both: not settled yet
        ([{0}, {0, 1}], 2, False),  # one shard held twice (a handover in flight)
        ([{0}, set()], 2, False),  # shard 1 held by no one
        ([{0, 3}, {1, 2}], 4, True),
        ([{0}, {1}, set()], 2, True),  # a third process holds none
    ],
)
def test_is_spread(held: list[set[int]], shards: int, spread: bool) -> None:
    assert is_spread(held, shards) is spread


def test_rates_and_cpu_per_item() -> None:
    assert per_s(1_000, 10.0, 12.0) == 500
    assert per_s(1_000, None, 12.0) is None
    assert per_s(1_000, 12.0, 12.0) is None  # one sighting: no span
    assert us_per(0.5, 100_000) == 5.0
    assert us_per(None, 100_000) is None
    assert us_per(0.5, 0) is None


def test_split_by_outage_by_due_time() -> None:
    fires = [(90, 1), (100, 2), (150, 3), (200, 4), (201, 5)]
    assert split_by_outage(fires, killed_ms=100, taken_ms=200) == {
        "before": [1],
        "during": [2, 3, 4],
        "after": [5],
    }


def _late(p50: float) -> dict[str, float | None]:
    return {"p50": p50, "p95": p50, "p99": p50, "max": p50}


def test_table_rows_one_per_configuration_and_the_failover() -> None:
    result: dict[str, Any] = {
        "baseline": {
            "records_per_s": 40_000,
            "client_us_per_record": 20.0,
            "broker_us_per_record": None,
        },
        "drain": [
            {
                "config": "2x2",
                "fires_per_s": 30_000,
                "ratio": 0.75,
                "per_shard": [{"fires_per_s": 16_000}, {"fires_per_s": None}],
                "emitter_us_per_fire": 21.5,
                "broker_us_per_fire": 60.0,
                "commit_to_last_s": 8.0,
                "drain_per_s": 25_000,
                "drain_ratio": 0.625,
                "first_fire_after_commit_s": 1.3,
                "emitter_errors": {"emitter error: CONCURRENT_TRANSACTIONS": 2},
            }
        ],
        "failover": {
            "takeover_s": 3.4,
            "shard0_fire_lateness_ms": {"before": _late(1), "during": _late(2)},
            "shard0_seen_lateness_ms": {"before": _late(3), "during": _late(4)},
            "lost": 0,
            "copies": 12,
            "refires": 40.0,
            "timers": 24_000,
        },
    }
    rows = table_rows(result)
    assert rows["baseline (raw)"] == "40,000/s; µs CPU/record client 20.0, broker -"
    assert rows["drain 2x2"] == (
        "30,000/s first-last (x0.75 raw; shards 16,000 -); 25,000/s commit-last "
        "(x0.62, 8.0 s, first fire 1.3 s); µs CPU/fire emitters 21.5, broker 60.0"
    )
    assert rows["drain 2x2 errors"] == "2 x emitter error: CONCURRENT_TRANSACTIONS"
    assert rows["shard 0 fired-due outage"] == "p50 2 / p95 2 / p99 2 / max 2 ms"
    assert rows["shard 0 seen-due outage"] == "p50 4 / p95 4 / p99 4 / max 4 ms"
    assert rows["failover lost / copies (refires)"] == "0 / 12 (40) of 24,000"
    del result["failover"]
    result["drain"][0]["emitter_errors"] = {}
    assert list(table_rows(result)) == ["baseline (raw)", "drain 2x2"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (
            'open the next transaction: KafkaError{code=CONCURRENT_TRANSACTIONS,val=51,str="x"}',
            "CONCURRENT_TRANSACTIONS",
        ),
        ("the lease went while taking over", "the lease went while taking over"),
        ("", ""),
    ],
)
def test_error_code_of_a_logged_error(text: str, code: str) -> None:
    assert error_code(text) == code
