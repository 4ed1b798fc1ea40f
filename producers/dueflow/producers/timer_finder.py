"""Finding a pending job's timer record, to move it (I/O edge).

``reschedule`` writes a new timer with the job's own value, so it needs a
copy of that value: the job's timer record. :class:`WheelTimerFinder` reads
the few timer-topic partitions the timer can be in
(:func:`dueflow.rules.timer_search.timer_partitions`, from the top level down)
from their low watermark (consumed records are deleted) and, if the timer
has fired already but no worker has taken the job yet, the job's exec
partition from about its due time on. It matches the record key (the
idempotency key) and the ``df-job`` header. Reads are bounded
(``max_records`` per partition) and committed-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import kafka_error
from dueflow.kafka.reading import offsets_for_time, ops_consumer, watermarks
from dueflow.kafka.topics import names
from dueflow.rules.partitioning import partition_for_key
from dueflow.rules.timer_search import timer_partitions

# Exec records are written when the timer fires, at or after its due time; the
# broker stamps them with the emitter's clock, which may run a little behind.
EXEC_LOOKBACK_MS = 60_000


@dataclass(frozen=True, slots=True)
class FoundTimer:
    """A copy of a job's timer (or exec) record."""

    topic: str
    partition: int
    offset: int
    value: bytes
    headers: list[tuple[str, bytes]]
    fired: bool  # read from the exec topic: the timer has fired

    @classmethod
    def of_record(cls, record: Any, *, fired: bool) -> FoundTimer:
        """The copy of ``record`` (a Kafka message, or one of the in-memory log)."""
        return cls(
            topic=record.topic(),
            partition=record.partition(),
            offset=int(record.offset() or 0),
            value=record.value() or b"",
            headers=[(k, v) for k, v in _pairs(record) if v is not None],
            fired=fired,
        )


@dataclass(frozen=True, slots=True)
class WantedTimer:
    """The timer record a finder looks for: job ``job_id`` (record key ``key``, the
    idempotency key) of ``queue``, due at ``due_ms``; ``hint``, the timer partition
    it was written to, when known."""

    job_id: str
    key: str
    queue: str
    due_ms: int
    hint: int | None = None


class TimerFinder(Protocol):
    """Where a pending job's value is."""

    def find(self, wanted: WantedTimer, *, now_ms: int) -> FoundTimer | None:
        """A record holding the ``wanted`` job; None if none."""
        ...


class WheelTimerFinder:
    """:class:`TimerFinder` over the timer topic (and the exec topic of the job's queue)."""

    def __init__(
        self,
        settings: Settings,
        *,
        max_records: int = 1_000_000,
        timeout_s: float = 60.0,
        queue_spec: Callable[[str], QueueSpec] | None = None,
    ) -> None:
        self.settings = settings
        self.queue_spec = queue_spec or settings.queue  # static or registered
        self.max_records = max_records
        self.timeout_s = timeout_s

    def find(self, wanted: WantedTimer, *, now_ms: int) -> FoundTimer | None:
        n = names(self.settings)
        key = wanted.key.encode()
        job = wanted.job_id.encode()
        due_ms = wanted.due_ms
        consumer = ops_consumer(self.settings)
        try:
            for p in timer_partitions(
                due_ms=due_ms,
                now_ms=now_ms,
                key=key,
                geometry=self.settings.wheel,
                hint=wanted.hint,
            ):
                (low, high) = watermarks(consumer, n.timers, [p])[p]
                found = self._scan(consumer, n.timers, p, low, high, key, job)
                if found is not None:
                    return found
            topic = n.exec(wanted.queue)
            p = partition_for_key(key, self.queue_spec(wanted.queue).partitions)
            (low, high) = watermarks(consumer, topic, [p])[p]
            start = offsets_for_time(consumer, topic, [p], due_ms - EXEC_LOOKBACK_MS)[p]
            return self._scan(consumer, topic, p, low if start is None else start, high, key, job)
        finally:
            consumer.close()

    def _scan(
        self,
        consumer: Consumer,
        topic: str,
        partition: int,
        start: int,
        end: int,
        key: bytes,
        job_id: bytes,
    ) -> FoundTimer | None:
        """The newest record of ``[start, end)`` with ``key`` and header ``df-job`` =
        ``job_id`` (at most ``max_records`` of the newest are read)."""
        start = max(start, end - self.max_records)
        if end <= start:
            return None
        tp = TopicPartition(topic, partition, start)
        consumer.assign([tp])
        found: Any = None
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                if time.monotonic() > deadline:
                    raise KafkaOperationError(
                        f"reading {topic}[{partition}] {start}..{end} did not finish within "
                        f"{self.timeout_s:.0f} s"
                    )
                done = False
                for msg in consumer.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = True
                        continue
                    offset = int(msg.offset() or 0)
                    if offset >= end:
                        done = True
                        break
                    if msg.key() == key and hdr.header(_pairs(msg), hdr.JOB_ID) == job_id:
                        found = msg
                    if offset >= end - 1:
                        done = True
                if done:
                    break
                # Markers and aborted records at the end are never delivered.
                (pos,) = consumer.position([TopicPartition(topic, partition)])
                if pos.offset >= end:
                    break
        except KafkaException as exc:
            raise kafka_error(f"reading {topic}[{partition}]", exc) from exc
        finally:
            consumer.unassign()
        if found is None:
            return None
        return FoundTimer.of_record(found, fired=topic != names(self.settings).timers)


def _pairs(msg: Any) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in raw]
