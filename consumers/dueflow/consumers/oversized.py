"""What a worker writes when a record would not fit its topic.

A job the scheduling client accepted fits every hop (its size budget,
:mod:`dueflow.records.size_budget`), but a record written by another client,
or limits lowered since, can make a retry, a follow-up or a dead letter too
large. A worker never lets such a record fail its transaction (which would
replay the job for ever); it measures each of them exactly against the
limits of its queue (:class:`WriteLimits`, read when the queue starts and
again after a commit was refused as too large):

- a retry record (retry tier, or a retry timer in the wheel) that would not
  fit: the job is dead-lettered instead, reason ``other``, the failure's
  error kept and its message beginning with ``not retried:`` and why;
- a follow-up (``ctx.schedule``) whose timer would not fit: it is
  dead-lettered in its own queue instead of scheduled (reason ``other``,
  error type ``dueflow.RecordTooLarge``, 0 attempts; its key ``dead``, so
  ``dueflow dlq redrive`` runs it, once the limits allow);
- a dead letter: trimmed to fit, or the job's value by reference
  (:func:`dueflow.records.set_aside.fit_dead_letter`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from dueflow.config import QueueSpec, Settings
from dueflow.consumers.failures import Failure
from dueflow.consumers.outputs import (
    KEY_HEADERS,
    OUTCOME_HEADERS,
    dead_letter_fields,
    dead_letter_headers,
    dead_letter_version,
)
from dueflow.kafka.topic_limits import default_limits
from dueflow.kafka.topics import names
from dueflow.observability.tracing import trace_id_of
from dueflow.reasons import OTHER
from dueflow.records.follow_up import PlannedFollowUp
from dueflow.records.record_size import producer_size, record_size
from dueflow.records.set_aside import RecordLimit, SetAside, fit_dead_letter
from dueflow.records.size_budget import QueueLimits, TopicLimit
from dueflow.records.worker_codec import encode_key_state, encode_outcome
from dueflow.rules.partitioning import partition_for_key

RECORD_TOO_LARGE_TYPE = "dueflow.RecordTooLarge"
OutRecord = tuple[str, int, bytes | None, bytes, Sequence[tuple[str, bytes]]]


class WriteLimits:
    """The limits a queue's worker writes against (replaced as a whole when read again)."""

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self.timers = limits.timers
        self.tiers = {t.topic: t for t in limits.retries}
        self.producer_max_bytes = limits.producer_max_bytes
        self.dead_letters = RecordLimit(
            limits.dlq.topic, limits.dlq.max_bytes, limits.producer_max_bytes
        )

    @classmethod
    def defaults(cls, settings: Settings, spec: QueueSpec) -> WriteLimits:
        return cls(default_limits(settings, spec))

    def too_large(
        self,
        topic: TopicLimit,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        *,
        what: str,
    ) -> str | None:
        """Why a record for ``topic`` would be refused, or None when it fits."""
        size = record_size(key, value, headers)
        if size > topic.max_bytes:
            return (
                f"the {what} would be {size} bytes, over max.message.bytes "
                f"{topic.max_bytes} of {topic.topic}"
            )
        psize = producer_size(key, value, headers)
        if psize > self.producer_max_bytes:
            return (
                f"the {what} would be {psize} bytes to the worker's producer, over its "
                f"message.max.bytes {self.producer_max_bytes}"
            )
        return None

    def tier(self, topic: str) -> TopicLimit:
        return self.tiers.get(topic) or TopicLimit(topic, self.limits.exec.max_bytes)

    def dead_letters_of(self, queue_dlq: str) -> RecordLimit:
        """The limit of another queue's DLQ (not read: this queue's counts)."""
        return dataclasses.replace(self.dead_letters, topic=queue_dlq)


def not_retried(failure: Failure, why: str) -> Failure:
    """The failure of an attempt whose retry would not fit: its message says so."""
    return dataclasses.replace(
        failure,
        message=f"not retried: {why}; the attempt failed with: {failure.message}",
    )


def follow_up_dead_letter(
    planned: PlannedFollowUp,
    why: str,
    *,
    settings: Settings,
    spec_of: Callable[[str], QueueSpec | None],
    limits: WriteLimits,
    origin: tuple[str, int, int],
    now_ms: int,
    worker_id: str,
) -> tuple[list[OutRecord], SetAside | None]:
    """The records that set a follow-up aside whose timer would not fit: its dead
    letter, its key ``dead`` and its ``dead`` outcome, in its own queue (on the
    partition its key hashes to, where its exec record would have gone). No
    records (and None) when the queue's spec is not known."""
    fu, rec = planned.follow_up, planned.record
    spec = spec_of(fu.queue)
    if spec is None:
        return [], None
    n = names(settings)
    partition = partition_for_key(rec.key, spec.partitions)
    failure = Failure(RECORD_TOO_LARGE_TYPE, f"not scheduled: {why}", permanent=True)
    fields = dead_letter_fields(
        job_id=fu.job_id,
        queue=fu.queue,
        task=fu.task,
        idempotency_key=fu.idempotency_key,
        reason=OTHER,
        failure=failure,
        attempts=0,
        first_failure_ms=now_ms,
        last_failure_ms=now_ms,
        dead_ms=now_ms,
        origin=origin,
        trace_id=trace_id_of(rec.headers),
        value=rec.value,
        headers=dict(rec.headers),
    )
    dlq = n.dlq(fu.queue)
    fitted = fit_dead_letter(
        fields,
        key=rec.key,
        headers=dead_letter_headers(rec.headers, failure=failure, attempts=0),
        limit=limits.dead_letters_of(dlq),
        value_ref=f"{n.timers}:-1:-1",  # never written: nothing to refer to
        version=dead_letter_version(OTHER),
    )
    key_state = encode_key_state(
        idempotency_key=fu.idempotency_key,
        job_id=fu.job_id,
        state="dead",
        at_ms=now_ms,
        attempts=0,
    )
    outcome = encode_outcome(
        job_id=fu.job_id,
        queue=fu.queue,
        task=fu.task,
        idempotency_key=fu.idempotency_key,
        state="dead",
        attempt=0,
        at_ms=now_ms,
        due_ms=fu.due_ms,
        error_type=failure.error_type,
        error=failure.short_message,
        worker=worker_id,
        trace_id=trace_id_of(rec.headers),
    )
    records: list[OutRecord] = [
        (dlq, partition, fitted.key, fitted.value, fitted.headers),
        (n.idempotency(fu.queue), partition, rec.key, key_state, KEY_HEADERS),
        (n.outcomes, -1, fu.job_id.encode(), outcome, OUTCOME_HEADERS),
    ]
    return records, fitted
