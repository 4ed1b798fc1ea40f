"""``scheduled`` outcomes: what a client tells the status view about a new job.

On by default (``Scheduler(..., scheduled_outcomes=False)`` turns it off): one
more small record per job, so the status view, ``Scheduler.status`` and
``dueflow job`` know a job from the moment it is scheduled, with its due
time, and ``cancel``/``reschedule`` can find its queue. Without it they
learn of a job at its first worker outcome. What it costs is measured by
``benchmarks/scheduled_outcomes.py`` (docs/observability.md, "Where is my job?").

The outcome is written only after the timer record was acknowledged, so
a job whose timer was refused never shows as scheduled. It is not
transactional with the timer: a client that dies in between leaves a job
the view learns of later; and a fast job's worker outcome may land before
it, which the view handles (``scheduled`` never replaces a later state).
Its ``at_ms`` is when the job was scheduled: the time the client planned it
and wrote its timer (the job's ``created_ms``), so a job of a long call is
not stamped with the call's end, and a job that ran before a busy client
heard of the acknowledgement is not shown as scheduled after it ran.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, Message

from dueflow import headers as hdr
from dueflow.kafka.topics import TopicNames
from dueflow.observability.logs import event
from dueflow.producers.cancel import OutgoingRecord
from dueflow.records.worker_codec import OUTCOME_V1, encode_scheduled

log = logging.getLogger("dueflow.producers")

# Written with the hand-written encoder (version 1, byte for byte fastavro's):
# schedule_many writes one per job. Only the schema header, as workers' outcomes.
SCHEMA_HEADER = (hdr.SCHEMA, OUTCOME_V1)
HEADERS: list[tuple[str, bytes]] = [SCHEMA_HEADER]

# schedule_many builds a plain job's outcome from the pieces its timer record
# already has (dueflow.producers.bulk_plan): the job id, queue and task, and
# idempotency key as their Avro strings, then these bytes, the at_ms varint,
# PLAIN_DUE, the due_ms varint and PLAIN_END. Byte for byte encode_scheduled(
# job_id, queue, task, key, due_ms, at_ms, None, None) (tests/unit/test_bulk_plan.py).
PLAIN_STATE = b"\x00\x00"  # state scheduled (symbol 0), attempt 0
PLAIN_DUE = b"\x02"  # due_ms present
PLAIN_END = b"\x00" * 6  # no duration, error type, error, worker, trace id, schedule id


def scheduled_outcome(
    names: TopicNames,
    *,
    job_id: str,
    queue: str,
    task: str,
    idempotency_key: str,
    due_ms: int,
    at_ms: int,
    trace_id: str | None = None,
    schedule_id: str | None = None,
    content_hash: str | None = None,
) -> OutgoingRecord:
    """The outcome record (state ``scheduled``) of a job whose timer was written;
    ``content_hash`` goes in a header (:func:`scheduled_headers`)."""
    value = encode_scheduled(
        job_id, queue, task, idempotency_key, due_ms, at_ms, trace_id, schedule_id
    )
    return OutgoingRecord(names.outcomes, job_id.encode(), value, scheduled_headers(content_hash))


def scheduled_headers(content_hash: str | None) -> list[tuple[str, bytes]]:
    """The headers of a ``scheduled`` outcome: the schema, and the job's content hash
    (``df-content-hash``), which lets a client in another process tell a job id
    reused with other content (:mod:`dueflow.producers.existing`). A header, not a
    field: readers of every version ignore it."""
    if not content_hash:
        return list(HEADERS)
    return [*HEADERS, (hdr.CONTENT_HASH, content_hash.encode())]


class OutcomeReports:
    """Delivery callback of ``scheduled`` outcomes: nobody waits for them; failures are
    counted and logged (the job itself was scheduled)."""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            key: Any = msg.key()
            event(
                log,
                "scheduled outcome not written",
                logging.WARNING,
                job_id=key.decode("utf-8", "replace") if isinstance(key, bytes) else None,
                error=err.str(),
            )
