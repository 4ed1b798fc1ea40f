"""The records a finished attempt writes: retry, dead letter and their headers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dueflow import headers as hdr
from dueflow.consumers.failures import Failure
from dueflow.reasons import DEAD_LETTER_REASONS, OTHER
from dueflow.records import codec
from dueflow.records.fast import IDEMPOTENCY_V2, OUTCOME_V1, OUTCOME_V2

KEY_HEADERS = [(hdr.SCHEMA, IDEMPOTENCY_V2)]
OUTCOME_HEADERS = [(hdr.SCHEMA, OUTCOME_V1)]
# The states only outcome version 2 has (rescheduled, expired, skipped): same layout.
OUTCOME_V2_HEADERS = [(hdr.SCHEMA, OUTCOME_V2)]
DEAD_LETTER_SCHEMA = codec.schema_header("dead_letter")


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
    headers: Sequence[tuple[str, bytes | None]] | None, *, failure: Failure, attempts: int
) -> hdr.Headers:
    """Headers of a DLQ record: the job's own, its last error, and the DeadLetter schema."""
    return hdr.replace(
        headers,
        [
            (hdr.SCHEMA, DEAD_LETTER_SCHEMA),
            (hdr.ATTEMPT, attempts),
            (hdr.ERROR, failure.summary.encode("utf-8", "replace")),
        ],
    )


def parse_origin(origin: str) -> tuple[str, int, int]:
    """``topic:partition:offset`` -> parts (topic names may not contain ':')."""
    topic, partition, offset = origin.rsplit(":", 2)
    return topic, int(partition), int(offset)


def dead_letter_value(
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
) -> bytes:
    """Avro DeadLetter: everything an operator needs to judge and redrive the job."""
    topic, partition, offset = origin
    return codec.encode(
        "dead_letter",
        {
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
        },
    )
