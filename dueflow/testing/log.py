"""dueflow's topics in memory: records with the bytes and headers Kafka would hold.

The in-memory pipeline runs the real producers' and workers' code; only the
transport is replaced. :class:`MemoryLog` holds every record written, by topic
and partition, with an offset each; a record whose partition is not given
goes where Kafka's default partitioner would put it (murmur2 of the key), so
a cancellation lands next to the job it cancels, as on a cluster.
:class:`MemoryRecord` answers what a ``confluent_kafka.Message`` answers;
:class:`MemoryProducer` takes what a ``Producer`` takes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from confluent_kafka import Message

from dueflow.config import Settings
from dueflow.kafka.topics import topic_layout
from dueflow.rules.partitioning import partition_for_key

Headers = list[tuple[str, bytes]]
TIMESTAMP_CREATE_TIME = 1


class MemoryRecord:
    """One record of a topic (the methods of ``confluent_kafka.Message`` that dueflow
    calls). Headers are copied on every read: whoever changes them changes a copy."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | str | None]] | None,
        timestamp_ms: int,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        # librdkafka sends a str header value as its UTF-8 bytes
        self._headers = tuple(
            (k, v.encode() if isinstance(v, str) else v)
            for k, v in (headers or ())
            if v is not None
        )
        self._timestamp = timestamp_ms

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Headers:
        return list(self._headers)

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self._timestamp

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._value or b"")

    def __repr__(self) -> str:
        return f"MemoryRecord({self._topic}[{self._partition}]@{self._offset})"


def as_messages(records: Sequence[MemoryRecord]) -> list[Message]:
    """Records where dueflow's code expects ``confluent_kafka.Message`` s (they answer
    the same calls)."""
    return cast(list[Message], list(records))


def as_message(record: MemoryRecord) -> Message:
    return cast(Message, record)


class MemoryLog:
    """Every record written, by topic and partition.

    Readers keep a position per topic (:meth:`read`): records of a topic come
    in the order they were written, which keeps every partition's own order.
    """

    def __init__(self, settings: Settings, *, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._partitions = {t.name: t.partitions for t in topic_layout(settings)}
        self._by_partition: dict[str, list[list[MemoryRecord]]] = {}
        self._by_topic: dict[str, list[MemoryRecord]] = {}
        self._lock = threading.RLock()

    def configure(self, settings: Settings) -> None:
        """Take the topic layout of new settings (queues added); records stay."""
        with self._lock:
            self._partitions.update({t.name: t.partitions for t in topic_layout(settings)})

    def partitions(self, topic: str) -> int:
        return self._partitions.get(topic, 1)

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        partition: int | None = None,
    ) -> MemoryRecord:
        """Write one record; ``partition`` None (or -1): the key's, as Kafka's default
        partitioner picks it."""
        with self._lock:
            count = self.partitions(topic)
            if partition is None or partition < 0:
                partition = partition_for_key(key, count) if key else 0
            if not 0 <= partition < count:
                raise ValueError(f"{topic} has {count} partitions, not {partition + 1}")
            parts = self._by_partition.setdefault(topic, [])
            while len(parts) < count:
                parts.append([])
            log = parts[partition]
            record = MemoryRecord(
                topic, partition, len(log), key, value, headers, timestamp_ms=self._clock()
            )
            log.append(record)
            self._by_topic.setdefault(topic, []).append(record)
            return record

    def read(self, topic: str, position: int = 0) -> list[MemoryRecord]:
        """The records of ``topic`` written after the first ``position`` ones."""
        with self._lock:
            return self._by_topic.get(topic, [])[position:]

    def records(self, topic: str) -> list[MemoryRecord]:
        """Every record of ``topic``, in the order written."""
        return self.read(topic)

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._by_topic)


class MemoryProducer:
    """What the scheduling client calls on a ``confluent_kafka.Producer``: records go
    to a :class:`MemoryLog` at once; delivery reports are served by ``poll``/``flush``."""

    def __init__(
        self, log: MemoryLog, *, on_record: Callable[[MemoryRecord], None] | None = None
    ) -> None:
        self._log = log
        self._on_record = on_record
        self._reports: list[tuple[Callable[..., None], MemoryRecord]] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Callable[..., None] | None = None,
        callback: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
    ) -> None:
        record = self._log.append(topic, key, value, headers, partition)
        if self._on_record is not None:
            self._on_record(record)
        report = on_delivery or callback
        if report is not None:
            self._reports.append((report, record))

    def poll(self, timeout: float | None = None) -> int:
        reports, self._reports = self._reports, []
        for report, record in reports:
            report(None, record)
        return len(reports)

    def flush(self, timeout: float | None = None) -> int:
        self.poll(0)
        return 0

    def __len__(self) -> int:
        return len(self._reports)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the in-memory pipeline has no cluster metadata")
