"""What a redrive writes for each dead letter: the job's value and headers, checked.

A dead letter holds the job's value (``job_value``) and headers, or, when they
did not fit the DLQ topic, a reference to the record that failed: the header
:data:`~dueflow.records.size_budget.VALUE_REF` (``topic:partition:offset``) in
``job_headers`` (:mod:`dueflow.records.set_aside`). :func:`resolve` reads the
records referred to; a reference whose record is gone (deleted by its topic's
retention) is reported, as is a redriven record that would not fit the exec
topic (:func:`redrive_verdict_of_size`). Neither stops the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer

from dueflow.apps.ops.dlq import DeadLetterEntry
from dueflow.errors import DueflowError
from dueflow.kafka.reading import Span, read_spans, watermarks
from dueflow.records.record_size import producer_size, record_size
from dueflow.records.size_budget import VALUE_REF

Ref = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class JobBytes:
    """The job a dead letter stands for: its value and headers (as dead)."""

    value: bytes
    headers: dict[str, bytes]


def value_ref(entry: DeadLetterEntry) -> Ref | None:
    """Where the job's value is, when the dead letter keeps it by reference."""
    rec = entry.record
    if rec is None:
        return None
    raw = (rec.get("job_headers") or {}).get(VALUE_REF)
    if raw is None:
        return None
    try:
        topic, partition, offset = raw.decode("utf-8", "replace").rsplit(":", 2)
        return topic, int(partition), int(offset)
    except ValueError:
        return ("?", -1, -1)


def resolve(
    consumer: Consumer, entries: Sequence[DeadLetterEntry]
) -> dict[tuple[int, int], JobBytes | str]:
    """Per dead letter (partition, offset): the job's value and headers, or why they
    cannot be had (a reference whose record is gone)."""
    out: dict[tuple[int, int], JobBytes | str] = {}
    wanted: dict[Ref, list[DeadLetterEntry]] = {}
    for e in entries:
        rec = e.record
        if rec is None:
            continue
        ref = value_ref(e)
        headers = {k: v for k, v in (rec.get("job_headers") or {}).items() if k != VALUE_REF}
        if ref is None:
            out[(e.partition, e.offset)] = JobBytes(rec.get("job_value") or b"", headers)
        else:
            wanted.setdefault(ref, []).append(e)
    for ref, group in wanted.items():
        found = _read_one(consumer, ref)
        for e in group:
            if isinstance(found, str):
                out[(e.partition, e.offset)] = found
                continue
            assert e.record is not None
            kept = {k: v for k, v in (e.record.get("job_headers") or {}).items() if k != VALUE_REF}
            out[(e.partition, e.offset)] = JobBytes(found.value, kept or found.headers)
    return out


def _read_one(consumer: Consumer, ref: Ref) -> JobBytes | str:
    topic, partition, offset = ref
    where = f"{topic}:{partition}:{offset}"
    gone = (
        f"its value was kept by reference to {where}, which is gone (deleted by the "
        "topic's retention, or the topic was deleted): it cannot be redriven"
    )
    if partition < 0 or offset < 0:
        return gone
    try:
        low, high = watermarks(consumer, topic, [partition])[partition]
    except DueflowError:
        return gone
    if not low <= offset < high:
        return gone
    got: list[Any] = []
    try:
        read_spans(consumer, [Span(topic, partition, offset, offset + 1)], got.append, timeout_s=30)
    except DueflowError as exc:
        return f"its value was kept by reference to {where}, which could not be read: {exc}"
    for msg in got:
        if msg.offset() == offset:
            raw = msg.headers() or []
            pairs = raw.items() if isinstance(raw, Mapping) else raw
            return JobBytes(msg.value() or b"", {k: v for k, v in pairs if isinstance(v, bytes)})
    return gone


def size_verdict(
    topic: str,
    max_bytes: int,
    producer_max_bytes: int,
    key: bytes | None,
    value: bytes,
    headers: Sequence[tuple[str, bytes]],
) -> str | None:
    """Why the redriven record would not be written (too large), or None (pure)."""
    size = record_size(key, value, headers)
    if size > max_bytes:
        return (
            f"the redriven record would be {size} bytes, over max.message.bytes {max_bytes} "
            f"of {topic}: raise the topic's limit to redrive it"
        )
    psize = producer_size(key, value, headers)
    if psize > producer_max_bytes:
        return (
            f"the redriven record would be {psize} bytes to the producer, over its "
            f"message.max.bytes {producer_max_bytes}"
        )
    return None
