"""The two records that cancel a job (pure): an idempotency record and an outcome.

The idempotency record (state ``cancelled``) goes to
``<prefix>.idempotency.<queue>`` keyed by the job's idempotency key and
WITHOUT an explicit partition: the murmur2 partitioner then picks the same
partition as the job's exec record, because the exec and idempotency topics
of a queue are co-partitioned and the emitter keys exec records by the same
key. The worker that owns that partition therefore sees the cancellation and
skips the job. The outcome (state ``cancelled``) goes to the outcomes topic
keyed by job id, for the status view.
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.job_request import MAX_NAME_CHARS
from dueflow.schemas import codec
from dueflow.topics import TopicNames


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A record to produce; ``partition`` None lets the partitioner choose."""

    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone
    headers: list[tuple[str, bytes]]
    partition: int | None = None


def cancel_records(
    *,
    names: TopicNames,
    job_id: str,
    queue: str,
    idempotency_key: str,
    at_ms: int,
    task: str = "",
    due_ms: int | None = None,
    content_hash: str | None = None,
    schedule_id: str | None = None,
) -> tuple[OutgoingRecord, OutgoingRecord]:
    """The idempotency record and the outcome that cancel ``job_id``."""
    for field, value in (("job_id", job_id), ("idempotency_key", idempotency_key)):
        if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
            raise InvalidInput(
                field, value, f"a non-empty string of at most {MAX_NAME_CHARS} chars"
            )
    key = idempotency_key.encode()
    idem = OutgoingRecord(
        names.idempotency(queue),
        key,
        codec.encode(
            "idempotency",
            {
                "idempotency_key": idempotency_key,
                "job_id": job_id,
                "state": "cancelled",
                "at_ms": at_ms,
                "attempts": 0,
                "content_hash": content_hash,
            },
        ),
        [
            (hdr.JOB_ID, job_id.encode()),
            (hdr.QUEUE, queue.encode()),
            (hdr.SCHEMA, codec.schema_header("idempotency")),
        ],
    )
    outcome = OutgoingRecord(
        names.outcomes,
        job_id.encode(),
        codec.encode(
            "outcome",
            {
                "job_id": job_id,
                "queue": queue,
                "task": task,
                "idempotency_key": idempotency_key,
                "state": "cancelled",
                "attempt": 0,
                "at_ms": at_ms,
                "due_ms": due_ms,
                "schedule_id": schedule_id,
            },
        ),
        [
            (hdr.JOB_ID, job_id.encode()),
            (hdr.QUEUE, queue.encode()),
            (hdr.SCHEMA, codec.schema_header("outcome")),
        ],
    )
    return idem, outcome
