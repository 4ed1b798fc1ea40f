"""The records a finished attempt writes: retry, dead letter and their headers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dueflow import headers as hdr
from dueflow.consumers.failures import Failure
from dueflow.reasons import DEAD_LETTER_REASONS, OTHER, OUT_OF_RANGE
from dueflow.records import codec
from dueflow.records.worker_codec import IDEMPOTENCY_V2, OUTCOME_V1, OUTCOME_V2, OUTCOME_V3
from dueflow.rules.wire_bounds import MAX_INT32, MAX_LONG

KEY_HEADERS = [(hdr.SCHEMA, IDEMPOTENCY_V2)]
OUTCOME_HEADERS = [(hdr.SCHEMA, OUTCOME_V1)]
# The states only outcome version 2 has (rescheduled, expired, skipped): same layout.
OUTCOME_V2_HEADERS = [(hdr.SCHEMA, OUTCOME_V2)]
# Results and progress (the fields version 3 appends).
OUTCOME_V3_HEADERS = [(hdr.SCHEMA, OUTCOME_V3)]
# A DeadLetter is written as version 1 (what the previous release reads) unless its
# reason is one only version 2 has.
DEAD_LETTER_V1 = codec.schema_header("dead_letter", 1)
DEAD_LETTER_V2 = codec.schema_header("dead_letter", 2)


def dead_letter_version(reason: str) -> int:
    """The oldest DeadLetter schema version that holds ``reason``."""
    return 2 if reason == OUT_OF_RANGE else 1


def outcome_headers(
    base: list[tuple[str, bytes]], hmap: Mapping[str, bytes]
) -> list[tuple[str, bytes]]:
    """A worker outcome's headers: ``base`` (its schema) and the delivery's ``df-fired``,
    so ``dueflow job`` and the status view can show when the emitter fired the job."""
    fired = hmap.get(hdr.FIRED)
    return base if fired is None else [*base, (hdr.FIRED, fired)]


def retry_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
    *,
    attempt: int,
    due_ms: int,
    first_failure_ms: int,
    failed_ms: int,
    failure: Failure,
    origin: str,
    trace: Sequence[tuple[str, bytes | None]] = (),
) -> hdr.Headers:
    """The failed record's headers with the retry's attempt, due time and failure.

    ``trace``: the headers of the failed attempt's trace step (the link to it,
    see :mod:`dueflow.observability.tracing`); empty keeps the job's own trace headers.
    """
    updates: list[tuple[str, str | int | bytes | None]] = [
        (hdr.ATTEMPT, attempt),
        (hdr.DUE, due_ms),
        (hdr.FIRST_FAILURE, first_failure_ms),
        (hdr.LAST_FAILURE, failed_ms),
        (hdr.ERROR, failure.summary.encode("utf-8", "replace")),
        (hdr.ORIGIN, origin),
    ]
    updates.extend(trace)
    return hdr.replace(headers, updates)


def dead_letter_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
    *,
    failure: Failure,
    attempts: int,
    reason: str = "",
) -> hdr.Headers:
    """Headers of a DLQ record: the job's own, its last error, and the DeadLetter schema
    (of :func:`dead_letter_version` of ``reason``)."""
    return hdr.replace(
        headers,
        [
            (hdr.SCHEMA, DEAD_LETTER_V2 if dead_letter_version(reason) == 2 else DEAD_LETTER_V1),
            (hdr.ATTEMPT, attempts),
            (hdr.ERROR, failure.summary.encode("utf-8", "replace")),
        ],
    )


def parse_origin(origin: str) -> tuple[str, int, int]:
    """``topic:partition:offset`` -> parts (topic names may not contain ':');
    ``ValueError`` unless the partition is an Avro int and the offset a long, both >= 0."""
    topic, partition, offset = origin.rsplit(":", 2)
    if not (partition.isdigit() and offset.isdigit() and len(partition) + len(offset) <= 29):
        raise ValueError(f"not topic:partition:offset: {origin[:120]!r}")
    part, off = int(partition), int(offset)
    if part > MAX_INT32 or off > MAX_LONG:
        raise ValueError(f"partition or offset out of range: {origin[:120]!r}")
    return topic, part, off


def dead_letter_fields(
    *,
    job_id: str,
    queue: str,
    task: str,
    idempotency_key: str,
    reason: str,
    failure: Failure,
    attempts: int,
    first_failure_ms: int,
    last_failure_ms: int,
    dead_ms: int,
    origin: tuple[str, int, int],
    trace_id: str | None,
    value: bytes,
    headers: Mapping[str, bytes],
) -> dict[str, Any]:
    """The Avro fields of a DeadLetter: everything an operator needs to judge and
    redrive the job."""
    topic, partition, offset = origin
    return {
        "job_id": job_id,
        "queue": queue,
        "task": task,
        "idempotency_key": idempotency_key,
        "reason": reason if reason in DEAD_LETTER_REASONS else OTHER,
        "error_type": failure.error_type,
        "error_message": failure.message,
        "traceback": failure.traceback,
        "attempts": attempts,
        "first_failure_ms": first_failure_ms,
        "last_failure_ms": last_failure_ms,
        "dead_ms": dead_ms,
        "original_topic": topic,
        "original_partition": partition,
        "original_offset": offset,
        "trace_id": trace_id,
        "job_value": value,
        "job_headers": dict(headers),
    }


def dead_letter_value(**fields: Any) -> bytes:
    """Avro DeadLetter of :func:`dead_letter_fields` (written whole, as the oldest
    version that holds its reason)."""
    record = dead_letter_fields(**fields)
    return codec.encode("dead_letter", record, version=dead_letter_version(record["reason"]))
