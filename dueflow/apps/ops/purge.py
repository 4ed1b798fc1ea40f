"""Purge a dead-letter topic: delete the records below an offset, per partition.

DLQ topics keep records forever (no time retention), so an operator removes
what was handled with the admin DeleteRecords call. Kafka deletes only a
*prefix* of a partition: everything below an offset. So a purge is chosen by
a time (records written before it, per partition the first offset at or
after that time, ``offsets_for_times``), an explicit ``partition:offset``
(that record and everything before it) or everything; filters by task or
reason cannot be honoured and are not offered.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.errors import InvalidInput
from dueflow.kafka.clients import kafka_error, make_admin
from dueflow.kafka.reading import Span, offsets_for_time, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names


@dataclass(frozen=True, slots=True)
class PurgeCut:
    """Delete offsets ``[low, before)`` of one partition: ``records`` dead letters (the
    other offsets are transaction markers)."""

    partition: int
    low: int
    before: int
    records: int


def plan_purge(
    settings: Settings,
    consumer: Consumer,
    queue: str,
    *,
    before_ms: int | None = None,
    through: tuple[int, int] | None = None,
    everything: bool = False,
) -> list[PurgeCut]:
    """What a purge of ``queue``'s DLQ would delete (exactly one way of choosing)."""
    settings.queue(queue)
    chosen = [before_ms is not None, through is not None, everything]
    if sum(chosen) != 1:
        raise InvalidInput(
            "purge", chosen, "exactly one of --before TIME, --through PARTITION:OFFSET, --all"
        )
    topic = names(settings).dlq(queue)
    parts = partitions_of(consumer, topic)
    if through is not None:
        if through[0] not in parts:
            raise InvalidInput("through", through, f"a partition of {topic} ({parts})")
        parts = [through[0]]
    marks = watermarks(consumer, topic, parts)
    cuts = []
    for p in parts:
        low, high = marks[p]
        if before_ms is not None:
            found = offsets_for_time(consumer, topic, [p], before_ms)[p]
            end = high if found is None else found
        elif through is not None:
            end = min(high, through[1] + 1)
        else:
            end = high
        if end > low:
            counted = read_spans(consumer, [Span(topic, p, low, end)], lambda _msg: None)
            cuts.append(PurgeCut(p, low, end, counted))
    return cuts


def purge(settings: Settings, queue: str, cuts: list[PurgeCut]) -> dict[int, int]:
    """Delete the records of ``cuts``; per partition the new low watermark."""
    if not cuts:
        return {}
    topic = names(settings).dlq(queue)
    admin = make_admin(settings)
    futures = admin.delete_records(
        [TopicPartition(topic, c.partition, c.before) for c in cuts], operation_timeout=30
    )
    out = {}
    for tp, fut in futures.items():
        try:
            result = fut.result()
        except KafkaException as exc:
            raise kafka_error(f"deleting records of {topic}[{tp.partition}]", exc) from exc
        out[tp.partition] = int(result.low_watermark)
    return out
