"""``scheduled`` outcomes: what a client tells the status view about a new job.

On by default (``Scheduler(..., scheduled_outcomes=False)`` turns it off): one
more small record per job, so the status view, ``Scheduler.status`` and
``dueflow job`` know a job from the moment it is scheduled, with its due
time, and ``cancel``/``reschedule`` can find its queue. Without it they
learn of a job at its first worker outcome. What it costs is measured by
``benchmarks/scheduled_outcomes.py`` (README, "Where is my job").

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
from dueflow.kafka.topics import TopicNames
from dueflow.observability.logs import event
from dueflow.producers.cancel import OutgoingRecord
from dueflow.records.fast import OUTCOME_V1, encode_scheduled

log = logging.getLogger("dueflow.producers")

# Written with the hand-written encoder (version 1, byte for byte fastavro's):
# schedule_many writes one per job. Only the schema header, as workers' outcomes.
HEADERS: list[tuple[str, bytes]] = [(hdr.SCHEMA, OUTCOME_V1)]


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
    value = encode_scheduled(
        job_id, queue, task, idempotency_key, due_ms, at_ms, trace_id, schedule_id
    )
    return OutgoingRecord(names.outcomes, job_id.encode(), value, list(HEADERS))


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
