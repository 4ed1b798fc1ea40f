"""``scheduled`` outcomes: what a client may tell the status view about a new job.

Off by default (``Scheduler(..., scheduled_outcomes=True)`` turns it on): it
doubles the records a client writes per job. Without it the status view
learns of a job at its first worker outcome, and answers "unknown /
pending" until then.

The outcome is written only after the timer record was acknowledged, so
a job whose timer was refused never shows as scheduled. It is not
transactional with the timer: a client that dies in between leaves a job
the view learns of later; and a fast job's worker outcome may land before
it, which the view handles (``scheduled`` never replaces a later state).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, Message

from dueflow import headers as hdr
from dueflow.logs import event
from dueflow.producers.cancel import OutgoingRecord
from dueflow.schemas import codec
from dueflow.topics import TopicNames

log = logging.getLogger("dueflow.producers")

_SCHEMA = codec.schema_header("outcome")


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
) -> OutgoingRecord:
    """The outcome record (state ``scheduled``) of a job whose timer was written."""
    value = codec.encode(
        "outcome",
        {
            "job_id": job_id,
            "queue": queue,
            "task": task,
            "idempotency_key": idempotency_key,
            "state": "scheduled",
            "attempt": 0,
            "at_ms": at_ms,
            "due_ms": due_ms,
            "trace_id": trace_id,
            "schedule_id": schedule_id,
        },
    )
    headers = [(hdr.JOB_ID, job_id.encode()), (hdr.QUEUE, queue.encode()), (hdr.SCHEMA, _SCHEMA)]
    return OutgoingRecord(names.outcomes, job_id.encode(), value, headers)


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
