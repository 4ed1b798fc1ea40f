"""Which offsets a worker's batch sends (pure, no broker).

A partition whose committable offset moved sends it. A partition the batch
writes for sends its offset also when it did not move (a slow job ahead of a
finished one): the pending offset commit makes a new owner wait for this
transaction, the fence against a worker frozen inside its commit
(tests/integration/test_pending_offsets_fence.py). A partition the batch
neither moves nor writes for sends nothing, unless asked to (``resend``).
"""

from __future__ import annotations

from typing import Any

from dueflow.consumers.feeds import PartitionFeed
from dueflow.consumers.store import MemoryKeyStore
from dueflow.kafka.topics import names
from tests.support.attempts import SETTINGS, batch_recorder

TOPIC = names(SETTINGS).exec("jobs")


def feed(partition: int, *, committed: int, seen: list[int], finished: list[int]) -> PartitionFeed:
    f = PartitionFeed(TOPIC, partition, None, MemoryKeyStore(10**9))
    f.committed = committed
    f.tracker = type(f.tracker)(committed)
    f.tracker.extend(seen)
    for offset in finished:
        f.tracker.finish(offset)
    return f


def offsets(cut: Any) -> list[tuple[int, int]]:
    batch, _finals, _marks = cut
    return sorted((tp.partition, tp.offset) for tp in batch.offsets)


def test_a_partition_the_batch_writes_for_sends_its_offset_even_when_it_did_not_move() -> None:
    slow_ahead = feed(0, committed=10, seen=[10, 11], finished=[11])  # 10 still runs
    moved = feed(1, committed=5, seen=[5, 6], finished=[5, 6])
    idle = feed(2, committed=7, seen=[7], finished=[])  # nothing finished, nothing written
    recorder = batch_recorder()
    recorder.records = [
        (slow_ahead, "outcomes", 0, b"k11", b"v", []),
        (moved, "outcomes", 1, b"k5", b"v", []),
    ]
    cut = recorder.cut([slow_ahead, moved, idle])
    assert cut is not None
    assert offsets(cut) == [(0, 10), (1, 7)]
    _batch, _finals, marks = cut
    assert [(f.partition, at) for f, at in marks] == [(1, 7)]  # only a move is marked


def test_resend_sends_every_partitions_offset() -> None:
    idle = feed(2, committed=7, seen=[7], finished=[])
    cut = batch_recorder().cut([idle], resend=True)
    assert cut is not None
    assert offsets(cut) == [(2, 7)]


def test_nothing_written_and_nothing_moved_is_no_batch() -> None:
    idle = feed(2, committed=7, seen=[7], finished=[])
    assert batch_recorder().cut([idle]) is None


def test_records_without_a_partition_of_this_member_send_no_offset() -> None:
    idle = feed(2, committed=7, seen=[7], finished=[])
    recorder = batch_recorder()
    recorder.records = [(None, "outcomes", 3, b"k", b"v", [])]
    cut = recorder.cut([idle])
    assert cut is not None
    batch, _finals, _marks = cut
    assert (len(batch.records), batch.offsets) == (1, [])


def test_a_gone_partition_sends_nothing() -> None:
    gone = feed(0, committed=10, seen=[10, 11], finished=[11])
    recorder = batch_recorder()
    recorder.records = [(gone, "outcomes", 0, b"k11", b"v", [])]
    gone.advance(type(gone.state).GONE)
    recorder.lost()
    assert recorder.cut([gone]) is None
