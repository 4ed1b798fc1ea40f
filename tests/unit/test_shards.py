"""Shards of the timer wheel (pure): layout, placement, topics and checks."""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.config import load_settings
from dueflow.errors import ConfigError
from dueflow.kafka.cluster_view import GroupMember, shard_holders
from dueflow.kafka.topics import TopicNames, TopicSpec, topic_layout
from dueflow.observability.metrics import Metrics
from dueflow.records.timer_record import TimerPlacer
from dueflow.rules.timer_search import timer_partitions
from dueflow.rules.wheel import NEAR_LEVEL, WheelGeometry, WheelLevel, place_timer, shard_for
from dueflow.streams.emitter.housekeeping import PendingTotals
from dueflow.streams.emitter.shape import shape_problem

SMALL = WheelGeometry(
    levels=(WheelLevel(8, 100), WheelLevel(8, 500)),
    near_partitions=2,
    near_window_ms=300,
    lookahead_ms=100,
)


def test_shards_sit_side_by_side_in_the_timer_topic() -> None:
    geo = WheelGeometry(shards=3)
    assert geo.shard_partitions == 260
    assert geo.total_partitions == 780
    assert [geo.of_shard(s).partitions for s in range(3)] == [
        range(0, 260),
        range(260, 520),
        range(520, 780),
    ]
    two = geo.of_shard(2)
    assert two.level_base(0) == 520 + 4
    assert two.partition_of(1, 65) == 520 + 4 + 64 + 1
    # locate reads any shard's partition as its level and index
    assert geo.locate(520 + 2) == (NEAR_LEVEL, 2)
    assert geo.locate(260 + 4 + 64 + 3) == (1, 3)
    assert [geo.shard_of(p) for p in (0, 259, 260, 779)] == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="outside"):
        geo.locate(780)
    with pytest.raises(ValueError, match="shard 3"):
        geo.of_shard(3)


def test_one_shard_is_the_wheel_as_it_always_was() -> None:
    geo = WheelGeometry()
    assert geo.total_partitions == geo.shard_partitions == 260
    assert geo.partitions == range(260)
    assert shard_for(123456789, 1) == 0
    assert TopicNames("p").emitter_transactional_ids(2) == ["p.emitter", "p.emitter.1"]


@given(
    due=st.integers(0, 10**7),
    ahead=st.integers(-5_000, 10**6),
    spread=st.integers(0, 2**32 - 1),
    shard=st.integers(0, 3),
)
def test_placement_never_leaves_its_shard(due: int, ahead: int, spread: int, shard: int) -> None:
    geo = replace(SMALL, shards=4).of_shard(shard)
    placed = place_timer(due_ms=due, now_ms=due - ahead, geometry=geo, spread=spread)
    assert placed.partition in geo.partitions
    base = place_timer(due_ms=due, now_ms=due - ahead, geometry=SMALL, spread=spread)
    assert placed.partition - geo.base == base.partition  # the same wheel, moved
    assert (placed.level, placed.slot) == (base.level, base.slot)


@given(
    due=st.integers(0, 10**7),
    ahead=st.integers(-5_000, 10**6),
    key=st.binary(min_size=1, max_size=40),
)
def test_the_client_placer_agrees_with_place_timer_in_the_keys_shard(
    due: int, ahead: int, key: bytes
) -> None:
    geo = replace(SMALL, shards=4)
    spread = zlib.crc32(key)
    want = place_timer(
        due_ms=due,
        now_ms=due - ahead,
        geometry=geo.of_shard(shard_for(spread, 4)),
        spread=spread,
    )
    got = TimerPlacer(geo).partition(due_ms=due, now_ms=due - ahead, spread=spread)
    assert got == want.partition


def test_keys_spread_evenly_over_shards_and_independently_of_the_near_partition() -> None:
    spreads = [zlib.crc32(f"job-{i}".encode()) for i in range(40_000)]
    by_shard = Counter(shard_for(s, 4) for s in spreads)
    assert set(by_shard) == {0, 1, 2, 3}
    assert max(by_shard.values()) / min(by_shard.values()) < 1.1, by_shard
    # every (shard, near partition) pair is used about as often
    pairs = Counter((shard_for(s, 4), s % 4) for s in spreads)
    assert len(pairs) == 16
    assert max(pairs.values()) / min(pairs.values()) < 1.2, pairs


def test_a_timer_is_searched_for_in_its_keys_shard() -> None:
    geo = replace(SMALL, shards=3)
    key = b"some-job"
    shard = geo.of_shard(shard_for(zlib.crc32(key), 3))
    found = timer_partitions(due_ms=10_000, now_ms=9_000, key=key, geometry=geo)
    assert found
    assert all(p in shard.partitions for p in found)


def test_each_shard_has_its_own_transactional_ids() -> None:
    n = TopicNames("p")
    assert n.emitter_transactional_ids(3, 2) == ["p.emitter.s2", "p.emitter.s2.1", "p.emitter.s2.2"]
    every = {t for s in range(4) for t in n.emitter_transactional_ids(4, s)}
    assert len(every) == 16


def test_the_layout_has_a_wheel_and_a_lease_partition_per_shard() -> None:
    s = load_settings(env={"DUEFLOW_WHEEL_SHARDS": "4"})
    specs = {t.role: t for t in topic_layout(s)}
    assert specs["timers"].partitions == 4 * 260
    assert specs["lease"].partitions == 4


@pytest.mark.parametrize(
    ("have", "wanted", "by", "growth"),
    [
        (260, 520, 260, 260),  # one shard more
        (260, 1040, 260, 780),
        (520, 520, 260, None),  # as needed
        (780, 520, 260, None),  # fewer: never
        (300, 520, 260, None),  # not whole shards: another wheel
        (1, 4, 1, 3),  # the lease
        (4, 4, 0, None),  # a topic that never grows
    ],
)
def test_topics_grow_by_whole_shards_only(
    have: int, wanted: int, by: int, growth: int | None
) -> None:
    assert TopicSpec("t", "timers", wanted, grows_by=by).growth_from(have) == growth


@pytest.mark.parametrize(
    ("timers", "lease", "problem"),
    [
        (520, 2, None),
        (None, None, None),  # not created yet: the emitter waits as before
        (260, 1, "has 260 partitions (1 shards of 260) but these settings need 520"),
        (780, 3, "has 780 partitions (3 shards of 260)"),
        (520, 1, "lease has 1 partitions but wheel.shards is 2"),
    ],
)
def test_an_emitter_refuses_topics_of_another_shard_count(
    timers: int | None, lease: int | None, problem: str | None
) -> None:
    s = load_settings(env={"DUEFLOW_WHEEL_SHARDS": "2"})
    got = shape_problem(timer_partitions=timers, lease_partitions=lease, settings=s)
    if problem is None:
        assert got is None
    else:
        assert got is not None
        assert problem in got


def test_shard_counts_are_checked_and_the_shard_is_not_a_setting() -> None:
    with pytest.raises(ConfigError, match=r"wheel\.shards"):
        load_settings(env={"DUEFLOW_WHEEL_SHARDS": "0"})
    with pytest.raises(ConfigError, match=r"wheel\.shards"):
        load_settings(env={"DUEFLOW_WHEEL_SHARDS": "65"})
    with pytest.raises(ConfigError, match=r"wheel\.shard\b"):
        load_settings(env={}, overrides={"wheel": {"shard": 1}})


def test_pending_timers_of_the_shards_a_process_drives_add_up() -> None:
    metrics = Metrics()
    totals = PendingTotals(metrics)

    def gauge(level: str) -> float | None:
        return metrics.registry.get_sample_value("dueflow_timers_pending", {"level": level})

    totals.report(0, {"near": 3, "0": 10})
    totals.report(2, {"near": 4, "0": 1})
    assert (gauge("near"), gauge("0")) == (7, 11)
    totals.report(0, {"near": 0, "0": 5})
    assert (gauge("near"), gauge("0")) == (4, 6)
    totals.forget(2)  # another emitter drives it now
    assert (gauge("near"), gauge("0")) == (0, 5)
    totals.forget(0)
    assert gauge("near") is None


def test_the_status_names_each_shards_active_emitter() -> None:
    a = GroupMember("m1", "emitter-a", "h", (("p.emitter.lease", 0), ("p.emitter.lease", 2)))
    b = GroupMember("m2", "emitter-b", "h", (("p.emitter.lease", 1),))
    assert shard_holders("p.emitter.lease", [a, b], 4) == {
        0: "emitter-a",
        1: "emitter-b",
        2: "emitter-a",
        3: None,
    }
