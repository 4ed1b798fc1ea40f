"""Read committed records of offset ranges, for the operator tools (I/O edge).

A :class:`Span` is ``[start, end)`` of one partition. The reader is an
assign-only, read_committed consumer that never joins a group and never
commits; it stops at the end of every span, also when the last offsets of a
span are transaction markers or aborted records (which a read_committed
consumer never delivers): the consumer's position tells.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.errors import InvalidInput, KafkaOperationError
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names


@dataclass(frozen=True, slots=True)
class Span:
    """Offsets ``[start, end)`` of ``topic`` partition ``partition``."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def ops_consumer(settings: Settings) -> Consumer:
    """The operator tools' reader: read_committed, assign-only, no commits."""
    return make_consumer(
        settings,
        f"{names(settings).prefix}.ops",  # never joined
        **{"enable.partition.eof": True, "fetch.wait.max.ms": 100, "log_level": 3},
    )


def partitions_of(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> list[int]:
    """The partition numbers of ``topic``; :class:`InvalidInput` when it does not exist."""
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise kafka_error(f"metadata of {topic}", exc) from exc
    found = md.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise InvalidInput("topic", topic, "an existing topic (run `dueflow topics ensure`)")
    return sorted(found.partitions)


def topic_exists(client: Any, topic: str, timeout_s: float = 10.0) -> bool:
    """Whether the cluster's metadata names ``topic`` (a partition without a leader for
    now still counts); raises the client's error when the metadata cannot be read."""
    found = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None:
        return False
    return found.error is None or found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART


def watermarks(
    consumer: Consumer, topic: str, partitions: Iterable[int], timeout_s: float = 10.0
) -> dict[int, tuple[int, int]]:
    """``partition -> (low, high)``; for this read_committed consumer high is the last
    stable offset."""
    out: dict[int, tuple[int, int]] = {}
    for p in partitions:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout_s, cached=False
            )
        except KafkaException as exc:
            raise kafka_error(f"watermarks of {topic}[{p}]", exc) from exc
        out[p] = (int(low), int(high))
    return out


def offsets_for_time(
    consumer: Consumer, topic: str, partitions: Iterable[int], at_ms: int, timeout_s: float = 10.0
) -> dict[int, int | None]:
    """Per partition, the first offset whose timestamp is >= ``at_ms`` (None: none is)."""
    request = [TopicPartition(topic, p, at_ms) for p in partitions]
    try:
        found = consumer.offsets_for_times(request, timeout=timeout_s)
    except KafkaException as exc:
        raise kafka_error(f"offsets for a time in {topic}", exc) from exc
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}


def read_spans(
    consumer: Consumer,
    spans: Sequence[Span],
    on_record: Callable[[Any], None],
    *,
    timeout_s: float = 120.0,
) -> int:
    """Call ``on_record(message)`` for every committed record of ``spans``, in offset
    order per partition; return how many. :class:`KafkaOperationError` when the
    spans are not read within ``timeout_s``."""
    ends = {(s.topic, s.partition): s.end for s in spans if s.size > 0}
    if not ends:
        return 0
    consumer.assign([TopicPartition(s.topic, s.partition, s.start) for s in spans if s.size > 0])
    remaining = set(ends)
    count = 0
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + 0.5
    try:
        while remaining:
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"reading {sorted(remaining)[:5]} did not finish within {timeout_s:.0f} s"
                )
            for msg in consumer.consume(500, 0.2):
                where = (msg.topic(), msg.partition())
                if where not in remaining:
                    continue
                end = ends[where]
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and (msg.offset() or 0) >= end:
                        remaining.discard(where)
                    continue
                offset = int(msg.offset() or 0)
                if offset < end:
                    on_record(msg)
                    count += 1
                if offset >= end - 1:
                    remaining.discard(where)
            if remaining and time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.5
                # Markers and aborted records at the end are never delivered.
                for tp in consumer.position([TopicPartition(t, p) for t, p in remaining]):
                    if tp.offset >= 0 and tp.offset >= ends[(tp.topic, tp.partition)]:
                        remaining.discard((tp.topic, tp.partition))
    finally:
        consumer.unassign()
    return count
