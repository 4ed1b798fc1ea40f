"""Read the control topic whole: the one reader of its record kinds (pause
commands, queue features), each kind bringing its own decoder and fold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer

from dueflow.config import Settings
from dueflow.errors import UndecodableRecord
from dueflow.kafka.reading import Span, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names

Record = TypeVar("Record")
Folded = TypeVar("Folded")


def read_control(
    settings: Settings,
    consumer: Consumer,
    decode: Callable[[bytes | None, bytes | None], Record | None],
    fold: Callable[[list[Record]], Folded],
    timeout_s: float = 30.0,
) -> tuple[Folded, list[str]]:
    """``fold`` of the control topic's records that ``decode`` reads, in offset
    order, and the problems (``partition:offset: reason``) of the records it
    cannot read.

    ``decode`` takes a record's key and value; it returns ``None`` for a record of
    another kind, which is skipped, and raises :class:`UndecodableRecord` for one
    of its kind that it cannot read. The read ends at each partition's high
    watermark as the read starts (the last stable offset for a read_committed
    ``consumer``).
    """
    topic = names(settings).control
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    found: list[Record] = []
    problems: list[str] = []

    def take(msg: Any) -> None:
        try:
            record = decode(msg.key(), msg.value())
        except UndecodableRecord as exc:
            problems.append(f"{msg.partition()}:{msg.offset()}: {exc}")
            return
        if record is not None:
            found.append(record)

    read_spans(
        consumer,
        [Span(topic, p, low, high) for p, (low, high) in marks.items()],
        take,
        timeout_s=timeout_s,
    )
    return fold(found), problems
