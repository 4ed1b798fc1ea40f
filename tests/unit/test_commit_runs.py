"""A commit writes its records in runs of one topic and partition, each in its order."""

from __future__ import annotations

import time
from typing import Any

from dueflow.consumers.committer import Batch, TransactionalCommitter, by_destination


class RecordingProducer:
    """A producer that only notes what it was given."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, int, bytes]] = []
        self.committed = 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, value: bytes, key: bytes, *, partition: int, **_: Any) -> None:
        self.produced.append((topic, partition, value))

    def commit_transaction(self, _timeout: float) -> None:
        self.committed += 1


def _jobs(n: int) -> list[tuple[Any, ...]]:
    """What n successes add to a batch: each job's idempotency record (its exec
    partition) and then its outcome (the partitioner's), job after job."""
    records: list[tuple[Any, ...]] = []
    for i in range(n):
        key = f"k{i}".encode()
        records.append(("feed", "idem", i % 3, key, f"done {i}".encode(), []))
        records.append(("feed", "outcomes", -1, key, f"outcome {i}".encode(), []))
    return records


def test_runs_group_the_records_by_topic_and_partition_in_the_order_they_came() -> None:
    records = _jobs(7)
    runs = [list(run) for run in by_destination(records)]
    assert [(run[0][1], run[0][2]) for run in runs] == [
        ("idem", 0),
        ("outcomes", -1),
        ("idem", 1),
        ("idem", 2),
    ]
    assert [r[4] for r in runs[0]] == [b"done 0", b"done 3", b"done 6"]
    assert [r[4] for r in runs[1]] == [f"outcome {i}".encode() for i in range(7)]
    assert sorted(r for run in runs for r in run) == sorted(records)  # nothing lost or doubled


def test_a_commit_produces_each_partition_in_its_order_and_in_runs() -> None:
    producer = RecordingProducer()
    c: Any = object.__new__(TransactionalCommitter)
    c._producer = producer
    records = _jobs(50)
    TransactionalCommitter._commit_once(c, Batch(records, []), time.monotonic() + 10)
    assert producer.committed == 1
    assert len(producer.produced) == len(records)
    for destination in {(r[1], r[2]) for r in records}:
        wanted = [r[4] for r in records if (r[1], r[2]) == destination]
        assert [v for t, p, v in producer.produced if (t, p) == destination] == wanted
    # one change of destination per run, not one per record
    changes = sum(
        1 for a, b in zip(producer.produced, producer.produced[1:], strict=False) if a[:2] != b[:2]
    )
    assert changes == 3
