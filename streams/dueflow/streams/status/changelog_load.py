"""Filling an empty job file from the jobs changelog in bulk (I/O edge).

faust's recovery hands a table's changelog to its store record by record
through its own consumer and event machinery: a few thousand records a
second on a loaded host, so a status view that lost its file (or starts for
the first time next to a big changelog) would take many minutes to answer.
:func:`load_changelog` reads the changelog with librdkafka instead, up to
the end offsets it saw when it started, and writes the rows and the offsets
they reach in large transactions; faust's recovery then reads only what came
after (:meth:`~dueflow.streams.status.job_store.JobStore.persisted_offset`).
It reads every partition: rows of partitions another view instance owns are
kept but not answered, and catch up from their offsets when assigned here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, TopicPartition

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import make_consumer
from dueflow.observability.logs import event
from dueflow.streams.status.job_file import JobRow, JobRows
from dueflow.streams.status.job_store import job_id_of_key

log = logging.getLogger("dueflow.status")

LOAD_BATCH = 20_000  # records per transaction of the file
STALL_S = 120.0  # no record for this long before the end offsets: give up (faust goes on)


def load_changelog(
    settings: Settings,
    topic: str,
    partitions: int,
    rows: JobRows,
    *,
    on_batch: Callable[[int], None] = lambda _n: None,
) -> int:
    """Read ``topic`` (``partitions`` partitions) from the rows' offsets (or its start)
    to its current end into ``rows``; returns how many records were applied."""
    consumer = make_consumer(
        settings,
        f"{topic}.load",  # assign mode: never joins, never commits
        **{
            "enable.partition.eof": True,
            "fetch.max.bytes": 50_000_000,
            "max.partition.fetch.bytes": 10_000_000,
            "isolation.level": "read_uncommitted",  # the changelog is not transactional
            "log_level": 3,
        },
    )
    t0 = time.monotonic()
    applied = 0
    try:
        ends: dict[int, int] = {}
        starts = []
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            start = max(low, rows.offsets.get(p, -1) + 1)
            if high > start:
                ends[p] = high
                starts.append(TopicPartition(topic, p, start))
        if not starts:
            return 0
        consumer.assign(starts)
        changes: list[tuple[str, JobRow | None]] = []
        offsets: dict[int, int] = {}
        last_progress = time.monotonic()
        while ends:
            messages = consumer.consume(10_000, 0.5)
            if not messages and time.monotonic() - last_progress > STALL_S:
                raise KafkaOperationError(f"reading {topic}: no record for {STALL_S:.0f} s")
            for msg in messages:
                err = msg.error()
                p = int(msg.partition() or 0)
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaOperationError(f"reading {topic}[{p}]: {err}")
                    if p in ends and (msg.offset() or 0) >= ends[p]:
                        del ends[p]
                    continue
                last_progress = time.monotonic()
                offset = int(msg.offset() or 0)
                key = msg.key()
                if key is not None and offset < ends.get(p, 0):
                    job_id = job_id_of_key(key)
                    value = msg.value()
                    changes.append((job_id, None if value is None else JobRow.of(job_id, p, value)))
                    offsets[p] = offset
                if offset >= ends.get(p, 0) - 1:
                    ends.pop(p, None)
            if len(changes) >= LOAD_BATCH or (not ends and (changes or offsets)):
                rows.write(changes, offsets)
                applied += len(changes)
                on_batch(len(changes))
                changes, offsets = [], {}
    finally:
        consumer.close()
    event(
        log,
        "status.job_file_loaded",
        topic=topic,
        records=applied,
        seconds=round(time.monotonic() - t0, 1),
    )
    return applied
