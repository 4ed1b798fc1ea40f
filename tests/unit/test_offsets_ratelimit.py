"""Offset tracker and token bucket (pure)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.consumers.offsets import OffsetTracker
from dueflow.consumers.ratelimit import rate_bucket, share_of


def test_commit_position_is_the_lowest_unfinished_offset() -> None:
    t = OffsetTracker(start=10)
    assert t.committable() == 10
    for o in (10, 11, 12, 15):  # gaps: compaction or transaction markers
        t.add(o)
    assert t.committable() == 10
    t.finish(12)
    t.finish(11)
    assert t.committable() == 10  # 10 still runs
    t.finish(10)
    assert t.committable() == 15
    t.finish(15)
    assert t.committable() == 16
    assert t.unfinished == 0


def test_unknown_start_and_out_of_order_delivery() -> None:
    t = OffsetTracker()
    assert t.committable() is None
    t.add(5)
    with pytest.raises(ValueError, match="delivered after"):
        t.add(4)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=60), st.randoms())
def test_never_commits_past_an_unfinished_offset(gaps: list[int], rnd: random.Random) -> None:
    offsets, o = [], 0
    for g in gaps:
        o += g
        offsets.append(o)
    t = OffsetTracker(start=0)
    for off in offsets:
        t.add(off)
    order = offsets[:]
    rnd.shuffle(order)
    finished: set[int] = set()
    for off in order:
        t.finish(off)
        finished.add(off)
        pos = t.committable()
        assert pos is not None
        assert all(x in finished for x in offsets if x < pos)
        unfinished = [x for x in offsets if x not in finished]
        assert pos == (min(unfinished) if unfinished else offsets[-1] + 1)


def test_token_bucket_rate_and_waits() -> None:
    b = rate_bucket(10.0, now=0.0)  # capacity 1 (burst of 0.1 s)
    assert b.try_take(0.0) == 0.0
    assert b.try_take(0.0) == pytest.approx(0.1)
    assert b.try_take(0.05) == pytest.approx(0.05)
    assert b.try_take(0.1) == 0.0
    # over 10 simulated seconds, taking whenever allowed gives ~10/s
    now, taken = 0.1, 0
    while now < 10.1:
        wait = b.try_take(now)
        if wait == 0.0:
            taken += 1
        else:
            now += wait
    assert 99 <= taken <= 101


def test_token_bucket_rate_change_and_zero_rate() -> None:
    b = rate_bucket(100.0, now=0.0)  # capacity 10
    for _ in range(10):
        assert b.try_take(0.0) == 0.0
    b.set_rate(0.0, capacity=1.0, now=0.0)
    assert b.try_take(5.0) == 1.0  # no partitions: nothing to give, check again later
    b.set_rate(50.0, capacity=5.0, now=5.0)
    assert b.try_take(5.0) > 0.0
    assert b.try_take(5.1) == 0.0


@pytest.mark.parametrize(
    ("owned", "total", "share"), [(3, 6, 50.0), (6, 6, 100.0), (0, 6, 0.0), (1, 3, 100 / 3)]
)
def test_share_of_a_group_rate(owned: int, total: int, share: float) -> None:
    assert share_of(100.0, owned=owned, total=total) == pytest.approx(share)


def test_queue_rates_scale_every_bucket_by_partition_share() -> None:
    from dueflow.consumers.ratelimit import QueueRates

    rates = QueueRates(60.0, task_rates={"send": 30.0}, partitions=6, now=0.0)
    assert rates.limited
    assert rates.task("other") is None
    rates.set_owned(2, now=0.0)
    assert rates.queue is not None
    assert rates.queue.rate == pytest.approx(20.0)
    send = rates.task("send")
    assert send is not None
    assert send.rate == pytest.approx(10.0)
    rates.set_owned(6, now=1.0)
    assert send.rate == pytest.approx(30.0)
    assert not QueueRates(None, task_rates={}, partitions=6, now=0.0).limited
