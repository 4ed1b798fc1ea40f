from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.rules.drain import (
    Checkpoint,
    already_handled,
    cascade_ready_ms,
    classify_timer,
    commit_due,
    feeds_heap,
    heap_horizon_ms,
    idle_until_ms,
    landed_late,
    latest_fired,
    newer_commit,
    next_drain_ms,
    read_ahead_ms,
    skew_tolerance_ms,
)
from dueflow.rules.open_offsets import OpenOffsets
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import NEAR_LEVEL, WheelGeometry, WheelLevel, place_timer

GEO = WheelGeometry().validate()
SMALL = WheelGeometry(
    levels=(WheelLevel(12, 250), WheelLevel(10, 2_000), WheelLevel(6, 16_000)),
    near_partitions=2,
    near_window_ms=500,
    lookahead_ms=100,
).validate()
EXEC = {b"default": "p.exec.default", b"billing": "p.exec.billing"}


# ------------------------------------------------------------- readiness


def _ready_of_placement(geo: WheelGeometry, due: int, now: int, skew: int = 0) -> None:
    p = place_timer(due_ms=due, now_ms=now, geometry=geo, spread=0)
    if p.level < 1:
        return
    _, index = geo.locate(p.partition)
    ready = cascade_ready_ms(
        geometry=geo, level=p.level, index=index, due_ms=due, append_ms=now + skew
    )
    assert ready == geo.window(p.level, p.slot).opens_ms
    assert ready > now, "a record is never handled at once by the visit it was written for"


@settings(max_examples=600, deadline=None)
@given(
    now=st.integers(0, 4_000_000_000_000),
    delta=st.integers(0, 400 * 86_400_000),
    skew_fraction=st.floats(-0.99, 0.99),
)
def test_placed_records_are_ready_when_their_slot_opens(
    now: int, delta: int, skew_fraction: float
) -> None:
    # The broker's append time may differ from the producer's clock by less than
    # the tolerance either way; parked timers (beyond the top) included.
    p = place_timer(due_ms=now + delta, now_ms=now, geometry=GEO, spread=0)
    skew = int(skew_fraction * skew_tolerance_ms(GEO, max(p.level, 0)))
    _ready_of_placement(GEO, now + delta, now, skew)


@settings(max_examples=600, deadline=None)
@given(now=st.integers(0, 10**9), delta=st.integers(0, 200_000))
def test_placed_records_are_ready_when_their_slot_opens_small(now: int, delta: int) -> None:
    _ready_of_placement(SMALL, now + delta, now)


@settings(max_examples=600, deadline=None)
@given(
    append=st.integers(0, 10**9),
    due=st.integers(-(10**6), 2 * 10**9),
    late=st.integers(0, 200_000),
    partition=st.integers(0, SMALL.total_partitions - 1),
)
def test_replacing_a_ready_record_never_loops(
    append: int, due: int, late: int, partition: int
) -> None:
    level, index = SMALL.locate(partition)
    if level < 1:
        return
    ready = cascade_ready_ms(geometry=SMALL, level=level, index=index, due_ms=due, append_ms=append)
    now = max(ready, append) + late  # handled at or after ready (drain clock <= now)
    if due <= now:
        return  # fires at once
    p = place_timer(due_ms=due, now_ms=now, geometry=SMALL, spread=0)
    if p.partition != partition:
        return
    _, idx = SMALL.locate(p.partition)
    again = cascade_ready_ms(geometry=SMALL, level=p.level, index=idx, due_ms=due, append_ms=now)
    assert again > now, "a record placed back into its own partition would be read again at once"


def test_a_record_written_into_an_open_slot_is_ready_at_once() -> None:
    # level 1 of SMALL: 2 s slots. Slot 10 opens at 19_900; written at 21_200 (late).
    ready = cascade_ready_ms(
        geometry=SMALL, level=1, index=10 % 10, due_ms=21_000, append_ms=21_200
    )
    assert ready == 19_900
    assert landed_late(geometry=SMALL, level=1, due_ms=21_000, append_ms=21_200)
    assert not landed_late(geometry=SMALL, level=1, due_ms=21_000, append_ms=18_000)
    assert not landed_late(geometry=SMALL, level=NEAR_LEVEL, due_ms=0, append_ms=10**9)


def test_a_far_future_record_in_a_low_slot_waits_one_rotation_at_most() -> None:
    # Written at 1_000 into level-1 partition index 3 with a due time ten years out:
    # handled at the next visit of index 3 (slot 3 opens at 5_900), then placed again.
    ready = cascade_ready_ms(geometry=SMALL, level=1, index=3, due_ms=10**12, append_ms=1_000)
    assert ready == 3 * 2_000 - 100


@pytest.mark.parametrize(
    ("due", "append", "kept"),
    [
        (1_000, 1_000, True),
        (1_000, 5_000, True),  # overdue
        (1_000 + 12 * 250 * 0 + heap_horizon_ms(SMALL), 1_000, True),
        (1_001 + heap_horizon_ms(SMALL), 1_000, False),
    ],
)
def test_feeds_heap(due: int, append: int, kept: bool) -> None:
    assert feeds_heap(due_ms=due, append_ms=append, horizon_ms=heap_horizon_ms(SMALL)) is kept


@settings(max_examples=400, deadline=None)
@given(now=st.integers(0, 10**12), delta=st.integers(-(10**7), 10**7))
def test_every_placed_heap_feeder_record_is_kept(now: int, delta: int) -> None:
    p = place_timer(due_ms=now + delta, now_ms=now, geometry=GEO, spread=0)
    if p.level <= 0:
        assert feeds_heap(due_ms=now + delta, append_ms=now, horizon_ms=heap_horizon_ms(GEO))


def test_read_ahead() -> None:
    assert read_ahead_ms(SMALL, NEAR_LEVEL) == 750
    assert read_ahead_ms(SMALL, 0) == 350
    with pytest.raises(ValueError, match="does not feed"):
        read_ahead_ms(SMALL, 1)


@pytest.mark.parametrize(
    ("drain", "now", "top", "reading", "expected"),
    [
        (0, 10_000, None, None, 10_000),  # nothing pending: the wall clock
        (0, 10_000, 2_000, None, 3_000),  # a backlog: stay near its earliest timer
        (5_000, 10_000, 2_000, None, 5_000),  # never back
        (0, 10_000, 20_000, None, 10_000),  # never past now
        (0, 10_000, None, 4_000, 4_000),  # nothing read yet, a feeder still reading
        (0, 10_000, 9_500, 9_900, 10_000),  # anchored: reading feeders pause themselves
    ],
)
def test_next_drain(
    drain: int, now: int, top: int | None, reading: int | None, expected: int
) -> None:
    got = next_drain_ms(
        drain_ms=drain, now_ms=now, earliest_due_ms=top, lag_ms=1_000, reading_limit_ms=reading
    )
    assert got == expected


# ----------------------------------------------------------------- records


@pytest.mark.parametrize(
    ("headers", "key", "expected"),
    [
        ([("df-due", b"123"), ("df-queue", b"default")], b"k", (123, "p.exec.default", False, -1)),
        (
            [("df-due", b"1"), ("df-queue", b"billing"), ("df-kind", b"cron")],
            b"k",
            (1, "p.exec.billing", True, -1),
        ),
        (
            [("df-due", b"1"), ("df-queue", b"default"), ("df-kind", b"job")],
            b"k",
            (1, "p.exec.default", False, -1),
        ),
        (
            [("df-due", b"1"), ("df-due", b"2"), ("df-queue", b"default")],
            b"k",
            (2, "p.exec.default", False, -1),
        ),
        ([("df-queue", b"default")], b"k", "missing df-due header"),
        (None, b"k", "missing df-due header"),
        (
            [("df-due", b"soon"), ("df-queue", b"default")],
            b"k",
            "df-due is not an integer: b'soon'",
        ),
        ([("df-due", b"1")], b"k", "missing df-queue header"),
        ([("df-due", b"1"), ("df-queue", b"nope")], b"k", "unknown queue: 'nope'"),
        ([("df-due", b"1"), ("df-queue", b"default")], None, "missing key (the idempotency key)"),
        ([("df-due", b"1"), ("df-queue", b"default")], b"", "missing key (the idempotency key)"),
        (
            [("df-due", b"1"), ("df-queue", b"default"), ("df-kind", b"x")],
            b"k",
            "unknown df-kind: b'x'",
        ),
    ],
)
def test_classify_timer(
    headers: list[tuple[str, bytes]] | None, key: bytes | None, expected: object
) -> None:
    assert classify_timer(headers, key, EXEC) == expected


PARTITIONS = {b"default": 6, b"billing": 2}


@pytest.mark.parametrize(
    ("kind", "partition", "expected"),
    [
        (None, b"0", (5, "p.exec.default", False, 0)),
        (b"job", b"5", (5, "p.exec.default", False, 5)),
        (b"cron", b"3", (5, "p.exec.default", True, -1)),  # occurrences fire by key
        (None, b"6", "bad df-partition: not a partition of p.exec.default: b'6'"),
        (None, b"-1", "bad df-partition: not a partition of p.exec.default: b'-1'"),
        (None, b"x", "bad df-partition: not a partition of p.exec.default: b'x'"),
        (None, b"", "bad df-partition: not a partition of p.exec.default: b''"),
        (
            None,
            b"9" * 5000,
            "bad df-partition: not a partition of p.exec.default: b'" + "9" * 40 + "'",
        ),
    ],
)
def test_classify_timer_reads_the_exec_partition_of_a_job_timer(
    kind: bytes | None, partition: bytes, expected: object
) -> None:
    headers = [("df-due", b"5"), ("df-queue", b"default"), ("df-partition", partition)]
    if kind is not None:
        headers.append(("df-kind", kind))
    assert classify_timer(headers, b"k", EXEC, PARTITIONS) == expected


# ------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(
    "checkpoint",
    [Checkpoint(0), Checkpoint(17, (1_700_000_000_000, 3, 42)), Checkpoint(5, (-5, 0, 0))],
)
def test_checkpoint_round_trip(checkpoint: Checkpoint) -> None:
    assert Checkpoint.decode(checkpoint.encode()) == checkpoint


@pytest.mark.parametrize("text", [None, "", "x", "df1", "df1:a", "df1:1:2", "df2:1", "df1:1:2:3:x"])
def test_foreign_metadata_is_no_checkpoint(text: str | None) -> None:
    assert Checkpoint.decode(text) is None


CK = Checkpoint(read_to=100, fired=(5_000, 2, 40))


@pytest.mark.parametrize(
    ("offset", "key", "otherwise", "handled"),
    [
        (50, (4_000, 2, 50), False, True),  # fired before
        (50, (5_000, 2, 40), False, True),  # the last one fired
        (50, (5_000, 3, 0), False, False),  # same due, later key: still in the heap
        (50, (6_000, 2, 50), False, False),
        (50, (9_999, 2, 50), True, True),  # placed again / quarantined before
        (100, (1, 2, 100), False, False),  # never read: a new record
        (100, (1, 2, 100), True, False),
    ],
)
def test_already_handled(
    offset: int, key: tuple[int, int, int], otherwise: bool, handled: bool
) -> None:
    assert (
        already_handled(offset=offset, key=key, checkpoint=CK, handled_otherwise=otherwise)
        is handled
    )


def test_nothing_is_handled_without_a_checkpoint() -> None:
    assert not already_handled(offset=0, key=(0, 0, 0), checkpoint=None, handled_otherwise=True)
    assert not already_handled(
        offset=0, key=(0, 0, 0), checkpoint=Checkpoint(5), handled_otherwise=False
    )


def test_latest_fired() -> None:
    assert latest_fired([None, Checkpoint(3)]) is None
    assert latest_fired([Checkpoint(1, (5, 1, 1)), None, Checkpoint(2, (5, 2, 0))]) == (5, 2, 0)


# ------------------------------------------------------------- machines


def test_open_offsets_commit_point_follows_the_lowest_unfinished() -> None:
    oo = OpenOffsets()
    assert oo.lowest(7) == 7
    for off in (10, 11, 12, 13):
        oo.add(off)
    oo.finish(12)
    assert (oo.lowest(99), len(oo)) == (10, 3)
    oo.finish(10)
    assert oo.lowest(99) == 11
    oo.finish(11)
    assert (oo.lowest(99), len(oo)) == (13, 1)
    oo.finish(13)
    assert (oo.lowest(99), len(oo)) == (99, 0)


def test_token_bucket() -> None:
    b = TokenBucket(1.0, capacity=10, now=0)  # 1 000 a second, time in ms
    assert b.available(0) == 10
    b.take(10)
    assert b.available(0) == 0
    assert b.wait(0) == 2
    assert b.available(5) == 5
    assert b.available(1_000) == 10  # capped at the capacity
    with pytest.raises(ValueError, match="rate must be >= 0"):
        TokenBucket(-1.0, capacity=1, now=0)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        TokenBucket(1.0, capacity=0.5, now=0)


@pytest.mark.parametrize(
    ("records", "age", "busy", "due"),
    [
        (0, 500, False, False),  # nothing written: nothing to commit
        (1, 0, False, True),  # caught up: commit at once
        (1, 0, True, False),  # a backlog: keep filling the transaction ...
        (3, 99, True, False),
        (3, 100, True, True),  # ... for max_ms at most
        (1_000, 1, True, True),  # ... or max_records
    ],
)
def test_commit_due(records: int, age: int, busy: bool, due: bool) -> None:
    assert commit_due(records=records, age_ms=age, busy=busy, max_records=1_000, max_ms=100) is due


@pytest.mark.parametrize(
    ("age", "behind", "due"),
    [
        (5, 20, True),  # a little behind: max_ms
        (5, 900, False),  # 0.9 s behind: a transaction may stay open 90 ms
        (89, 900, False),
        (90, 900, True),
        (249, 60_000, False),  # capped
        (250, 60_000, True),
    ],
)
def test_commit_due_grows_with_the_backlog(age: int, behind: int, due: bool) -> None:
    assert (
        commit_due(records=10, age_ms=age, busy=True, max_records=1_000, max_ms=5, behind_ms=behind)
        is due
    )
    # never past max_records, and at once when caught up
    assert commit_due(
        records=1_000, age_ms=0, busy=True, max_records=1_000, max_ms=5, behind_ms=behind
    )
    assert commit_due(records=1, age_ms=0, busy=False, max_records=1_000, max_ms=5, behind_ms=0)


@pytest.mark.parametrize(
    ("records", "age", "busy", "due"),
    [
        (1, 0, False, False),  # caught up: the transaction stays open min_ms ...
        (1, 19, False, False),
        (1, 20, False, True),  # ... then commits
        (1_000, 0, False, True),  # max_records still wins
        (3, 99, True, False),  # a backlog: max_ms as before
        (3, 100, True, True),
    ],
)
def test_commit_due_min_ms_spaces_commits_when_caught_up(
    records: int, age: int, busy: bool, due: bool
) -> None:
    assert (
        commit_due(records=records, age_ms=age, busy=busy, max_records=1_000, max_ms=100, min_ms=20)
        is due
    )


def test_open_offsets_match_a_model_when_finished_in_any_order() -> None:
    rng = random.Random(7)
    oo = OpenOffsets()
    added: list[int] = []
    done: set[int] = set()
    nxt = 100
    for _ in range(2_000):
        if rng.random() < 0.5 or len(done) == len(added):
            nxt += rng.randint(1, 3)  # offsets increase, with gaps
            oo.add(nxt)
            added.append(nxt)
        else:
            off = rng.choice([o for o in added if o not in done])
            oo.finish(off)
            done.add(off)
        if rng.random() < 0.2:  # a commit asks
            unfinished = [o for o in added if o not in done]
            assert oo.lowest(-1) == (unfinished[0] if unfinished else -1)
            assert len(oo) == len(unfinished)


TINY = WheelGeometry(
    levels=(WheelLevel(12, 250), WheelLevel(10, 2_000)),
    near_partitions=2,
    near_window_ms=500,
    lookahead_ms=100,
).validate()


@pytest.mark.parametrize(
    ("level", "index", "drain_ms", "expected"),
    [
        # level 0 (12 x 250 ms, a round is 3 s): the start of the next visit whose
        # opening (start - 100 ms lookahead) comes after the drain clock
        (0, 5, 10_000, 10_250),  # slot 41 = 12*3 + 5 starts at 10 250
        (0, 4, 10_000, 13_000),  # slot 40 opened at 9 900: the next round's, slot 52
        (0, 4, 9_899, 10_000),  # ... unless it has not opened yet
        # level 1 (10 x 2 s): when the next visit opens, counted from the drain clock
        # less the skew tolerance (1 s), so a visit opened under a second ago still counts
        (1, 5, 10_000, 9_900),  # slot 5 opened at 9 900, within the tolerance
        (1, 5, 11_000, 29_900),  # more than a second after: the next round's
        (1, 6, 11_000, 11_900),
    ],
)
def test_idle_until_is_the_next_visit_a_record_written_now_can_belong_to(
    level: int, index: int, drain_ms: int, expected: int
) -> None:
    assert idle_until_ms(geometry=TINY, level=level, index=index, drain_ms=drain_ms) == expected


@given(due=st.integers(0, 10**7), at=st.integers(0, 10**7))
def test_a_record_placed_by_the_rules_is_never_needed_before_its_partition_is_idle_until(
    due: int, at: int
) -> None:
    """Whatever the drain clock was when the partition was found at its end (at or
    before the record's append time), the record's partition is not due to be read
    before idle_until (level 0: its heap entry is needed at its due time; level 1 up:
    at cascade_ready_ms)."""
    placement = place_timer(due_ms=due, now_ms=at, geometry=TINY, spread=0)
    if placement.level == NEAR_LEVEL:
        return
    level, index = TINY.locate(placement.partition)
    for drain in (at - 1_000, at - 1, at):
        until = idle_until_ms(geometry=TINY, level=level, index=index, drain_ms=drain)
        if level == 0:
            assert due >= until
        else:
            ready = cascade_ready_ms(
                geometry=TINY, level=level, index=index, due_ms=due, append_ms=at
            )
            assert ready >= until


@pytest.mark.parametrize(
    ("a", "b", "newer"),
    [
        ((-1, None), (5, Checkpoint(7)), (5, Checkpoint(7))),  # one group never committed
        ((5, Checkpoint(7)), (-1, None), (5, Checkpoint(7))),
        ((5, Checkpoint(7, (10, 1, 6))), (9, Checkpoint(9)), (9, Checkpoint(9))),
        ((5, Checkpoint(9, (10, 1, 8))), (5, Checkpoint(7)), (5, Checkpoint(9, (10, 1, 8)))),
        ((4, None), (4, None), (4, None)),  # a slot of level 1 up: the offset alone
    ],
)
def test_the_newer_of_two_groups_commits_is_the_later_one_in_the_partition(
    a: tuple[int, Checkpoint | None],
    b: tuple[int, Checkpoint | None],
    newer: tuple[int, Checkpoint | None],
) -> None:
    assert newer_commit(a, b) == newer
