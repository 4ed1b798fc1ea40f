"""benchmarks.spread: nearest-rank percentiles, the spread of the p99 over runs, the
broker's state and the printed rows."""

from __future__ import annotations

import pytest

from benchmarks.spread import broker_state, describe, percentiles, spread, spread_rows


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (range(1, 101), {"p50": 51.0, "p95": 96.0, "p99": 100.0, "max": 100.0}),
        ([7.0], {"p50": 7.0, "p95": 7.0, "p99": 7.0, "max": 7.0}),
        ([3.0, 1.0, 2.0], {"p50": 2.0, "p95": 3.0, "p99": 3.0, "max": 3.0}),
        ([0.123, 0.456], {"p50": 0.46, "p95": 0.46, "p99": 0.46, "max": 0.46}),
        ([], {"p50": None, "p95": None, "p99": None, "max": None}),
    ],
)
def test_percentiles_are_nearest_rank_and_none_when_empty(
    values: list[float], expected: dict[str, float | None]
) -> None:
    assert percentiles(values) == expected


def test_one_slow_job_in_a_hundred_is_the_p99() -> None:
    assert percentiles([10.0] * 99 + [500.0])["p99"] == 500.0
    assert percentiles([10.0] * 199 + [500.0])["p99"] == 10.0


@pytest.mark.parametrize(
    ("p99s", "expected"),
    [
        ([50.0], {"min": 50.0, "median": 50.0, "max": 50.0}),
        ([282.0, 50.0, 69.0], {"min": 50.0, "median": 69.0, "max": 282.0}),
        ([40.0, 60.0], {"min": 40.0, "median": 50.0, "max": 60.0}),
        ([None, 30.0], {"min": 30.0, "median": 30.0, "max": 30.0}),
        ([None], {"min": None, "median": None, "max": None}),
    ],
)
def test_spread_is_min_median_max_of_the_runs_p99(
    p99s: list[float | None], expected: dict[str, float | None]
) -> None:
    assert spread([{"p50": 1.0, "p99": p} for p in p99s]) == expected


@pytest.mark.parametrize(
    ("started_here", "load_before_s", "state"),
    [(True, 0.0, "cold"), (True, 40.0, "warmed"), (False, 0.0, "external")],
)
def test_broker_state(started_here: bool, load_before_s: float, state: str) -> None:
    assert broker_state(started_here=started_here, load_before_s=load_before_s) == state


def test_the_printed_rows_give_each_run_and_the_spread() -> None:
    runs = [
        {
            "lateness_ms": {"p50": 13.0, "p95": 30.0, "p99": p99, "max": 152.0},
            "jobs": 115_000,
            "load_s": 23.0,
            "broker_state": state,
        }
        for p99, state in ((50.0, "warmed"), (282.0, "warmed"), (69.0, "warmed"))
    ]
    rows = spread_rows(runs)
    assert rows["run 1"] == (
        "p50 13 / p95 30 / p99 50 / max 152 ms; 115,000 jobs, 23 s of load, broker warmed"
    )
    assert rows["p99 over 3 runs"] == "min 50 / median 69 / max 282 ms"
    assert describe({"p50": None, "p95": None, "p99": None, "max": None}) == (
        "p50 - / p95 - / p99 - / max - ms"
    )


def test_one_run_prints_no_spread_row() -> None:
    run = {"lateness_ms": {"p50": 1.0}, "timers": 10, "load_s": 5.0, "broker_state": "cold"}
    assert list(spread_rows([run], count="timers")) == ["run 1"]
