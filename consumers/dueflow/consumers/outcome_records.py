"""The records of a delivery's end other than a handler's success or retry.

Outcomes (``duplicate``, ``cancelled``, ``rescheduled``, ``expired``,
``skipped``, ``dead``), the key states they make final, and dead letters: DLQ
record (partition p) + idempotency ``dead`` + outcome ``dead``, trimmed to
fit the DLQ topic (:mod:`dueflow.records.set_aside`). Every idempotency record
of the batch is written by one helper, :meth:`OutcomeRecorder._key_record`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, identity, trace_id
from dueflow.consumers.outputs import (
    KEY_HEADERS,
    OUTCOME_HEADERS,
    OUTCOME_V2_HEADERS,
    OUTCOME_V3_HEADERS,
    dead_letter_fields,
    dead_letter_headers,
    dead_letter_version,
    outcome_headers,
    parse_origin,
)
from dueflow.consumers.oversized import WriteLimits
from dueflow.consumers.pending_batch import PendingBatch, key_name
from dueflow.consumers.progress import ProgressReporter
from dueflow.consumers.store import CANCELLED, DEAD
from dueflow.kafka.topics import names
from dueflow.observability.logs import JOB_DEAD_LETTER, job_event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.job_checks import ms_or
from dueflow.records.set_aside import SetAside, fit_dead_letter
from dueflow.records.worker_codec import (
    F_DUE_MS,
    F_SCHEDULE_ID,
    V2_STATES,
    encode_key_state,
    encode_outcome,
    encode_outcome_v3,
)

_LOG = logging.getLogger("dueflow.worker")


class OutcomeRecorder(PendingBatch):
    """Outcomes, key states and dead letters added to the batch being built."""

    def __init__(
        self,
        settings: Settings,
        queue: QueueSpec,
        *,
        worker_id: str,
        metrics: Metrics,
        tracer: JobTracer,
        limits: WriteLimits | None,
        progress: ProgressReporter | None,
        limit: int | None = None,
    ) -> None:
        super().__init__(queue.name, metrics=metrics, progress=progress, limit=limit)
        n = names(settings)
        # The limits retries, follow-ups and dead letters are measured against
        # (replaced by the runtime when it reads them).
        self.limits = limits or WriteLimits.defaults(settings, queue)
        self._tracer = tracer
        self._idem_topic = n.idempotency(queue.name)
        self._dlq_topic = n.dlq(queue.name)
        self._outcomes_topic = n.outcomes
        self._worker_id = worker_id

    def _count_cut(self, fitted: SetAside) -> None:
        if fitted.cut is not None:
            self._metrics.set_aside_trimmed.labels("worker", "dead_letter", fitted.cut).inc()

    def _key_record(
        self, d: Delivery, name: str, state: int, now_ms: int, *, attempts: int = 0
    ) -> None:
        """The idempotency record of ``d``'s key in state ``name`` (``state`` in the
        store once the batch commits, pending final until then)."""
        job_id, _task, key_text = identity(d)
        feed = d.feed
        value = encode_key_state(
            idempotency_key=key_text, job_id=job_id, state=name, at_ms=now_ms, attempts=attempts
        )
        self.records.append((feed, self._idem_topic, feed.partition, d.key, value, KEY_HEADERS))
        self.finals.append((feed, d.key, state, now_ms))
        self.pending_final[d.key] = state

    def dead(
        self,
        d: Delivery,
        reason: str,
        failure: Failure,
        now_ms: int,
        *,
        started: bool,
        seconds: float | None = None,
    ) -> None:
        """Dead letter: DLQ record + key ``dead`` + outcome ``dead``.

        ``seconds``: how long the last attempt ran (``None`` when none ran:
        undecodable record, unknown task)."""
        feed = d.feed
        job_id, task, _key_text = identity(d)
        attempts = d.attempt if started else d.attempt - 1
        fitted = self._dead_letter(d, reason, failure, now_ms, started=started)
        self._count_cut(fitted)
        self.records.append(
            (feed, self._dlq_topic, feed.partition, fitted.key, fitted.value, fitted.headers)
        )
        if d.key:
            self._key_record(d, "dead", DEAD, now_ms, attempts=attempts)
            if self.steering is not None:
                self.steering.ended(d, "dead", now_ms)
        if self.steering is not None and hdr.GROUP in d.hmap:
            self.steering.groups.member_ended(d, "dead", now_ms, error=failure.short_message)
        self._outcome(d, "dead", now_ms, failure=failure, seconds=seconds)
        self._metrics.dead_letters.labels(self._name, reason).inc()
        self._tally[(task, "dead")] += 1
        fields = d.fields
        job_event(
            _LOG,
            JOB_DEAD_LETTER,
            job_id=job_id,
            queue=self._name,
            task=task,
            attempt=attempts,
            duration_ms=None if seconds is None else seconds * 1000,
            outcome="dead",
            trace_id=trace_id(d),
            level=logging.ERROR,
            reason=reason,
            error=failure.summary,
            schedule_id=fields[F_SCHEDULE_ID] if fields else None,
        )

    def _dead_letter(
        self, d: Delivery, reason: str, failure: Failure, now_ms: int, *, started: bool
    ) -> SetAside:
        """The DLQ record of ``d``, trimmed to fit the DLQ topic, or the job's value by
        reference to the record that failed (set_aside.py)."""
        feed = d.feed
        hmap = d.hmap
        job_id, task, key_text = identity(d)
        origin_raw = hmap.get(hdr.ORIGIN)
        origin = (feed.topic, feed.partition, d.offset)
        if origin_raw:
            with contextlib.suppress(ValueError):
                origin = parse_origin(origin_raw.decode())
        attempts = d.attempt if started else d.attempt - 1
        raw_headers = d.msg.headers()
        if self._tracer.enabled:
            # The dead-letter step: a sibling of the attempts, linked to the last one.
            if d.span is not None:
                raw_headers = hdr.replace(raw_headers, d.span.headers)
            step = self._tracer.span_for_dead_letter(
                raw_headers, reason=reason, job_id=job_id, queue=self._name, attempts=attempts
            )
            raw_headers = hdr.replace(raw_headers, step.headers)
            step.end()
        dl_fields = dead_letter_fields(
            job_id=job_id,
            queue=self._name,
            task=task,
            idempotency_key=key_text,
            reason=reason,
            failure=failure,
            attempts=attempts,
            first_failure_ms=ms_or(hmap.get(hdr.FIRST_FAILURE), now_ms),
            last_failure_ms=ms_or(hmap.get(hdr.LAST_FAILURE), now_ms) if not started else now_ms,
            dead_ms=now_ms,
            origin=origin,
            trace_id=trace_id(d),
            value=d.msg.value() or b"",
            headers={k: v for k, v in (raw_headers or []) if v is not None},
        )
        return fit_dead_letter(
            dl_fields,
            key=d.key or None,
            headers=dead_letter_headers(
                raw_headers, failure=failure, attempts=attempts, reason=reason
            ),
            limit=self.limits.dead_letters,
            value_ref=f"{feed.topic}:{feed.partition}:{d.offset}",
            version=dead_letter_version(reason),
        )

    def skipped(self, d: Delivery, state: int, now_ms: int, *, steered: bool = False) -> None:
        """The key is final already (or the job's steering state says so, ``steered``):
        outcome ``cancelled`` or ``duplicate``, nothing else."""
        if state == CANCELLED:
            self._outcome(d, "cancelled", now_ms)
            self._tally[(identity(d)[1], "cancelled")] += 1
        else:
            self._outcome(d, "duplicate", now_ms)
            self._metrics.duplicates_skipped.labels(self._name).inc()
        if self.steering is not None and not steered:
            self.steering.ended(d, key_name(state), now_ms)
        if state == CANCELLED and self.steering is not None and hdr.GROUP in d.hmap:
            self.steering.groups.member_ended(d, "cancelled", now_ms)

    def superseded(self, d: Delivery, now_ms: int) -> None:
        """A reschedule moved the job: outcome ``rescheduled`` for this delivery (due at
        the old time), nothing else (the key is not final: the job is still to run)."""
        self._outcome(d, "rescheduled", now_ms)
        self._tally[(identity(d)[1], "rescheduled")] += 1

    def skipped_occurrence(self, d: Delivery, now_ms: int) -> None:
        """A cron occurrence skipped by its schedule's overlap policy: its key is final
        (``cancelled``: it did not and will not run) + outcome ``skipped``."""
        if d.key:
            self._key_record(d, "cancelled", CANCELLED, now_ms)
        self._outcome(d, "skipped", now_ms)
        self._tally[(identity(d)[1], "skipped")] += 1
        if self.steering is not None:
            self.steering.ended(d, "cancelled", now_ms)

    def expired(self, d: Delivery, now_ms: int) -> None:
        """Not started by its deadline: outcome ``expired``, nothing else (not a dead
        letter, the key not final: see :mod:`dueflow.rules.deadline`)."""
        self._outcome(d, "expired", now_ms)
        self._tally[(identity(d)[1], "expired")] += 1
        if self.steering is not None:
            self.steering.ended(d, "expired", now_ms)
            if hdr.GROUP in d.hmap:
                self.steering.groups.member_ended(d, "expired", now_ms)

    def _cancelled_attempt(
        self, d: Delivery, failure: Failure, seconds: float, now_ms: int
    ) -> None:
        """A cancelled job's attempt failed: key ``cancelled`` + outcome ``cancelled``,
        no retry."""
        if d.key:
            self._key_record(d, "cancelled", CANCELLED, now_ms)
        self._outcome(d, "cancelled", now_ms, failure=failure, seconds=seconds)
        self._tally[(identity(d)[1], "cancelled")] += 1
        if self.steering is not None:
            self.steering.ended(d, "cancelled", now_ms)
            if hdr.GROUP in d.hmap:
                self.steering.groups.member_ended(d, "cancelled", now_ms)

    def _outcome(
        self,
        d: Delivery,
        state: str,
        now_ms: int,
        *,
        failure: Failure | None = None,
        seconds: float | None = None,
        next_due_ms: int | None = None,
    ) -> None:
        """The attempt's outcome; ``next_due_ms`` (``retrying``): the retry's due time,
        in the ``df-next-due`` header (the outcome's ``due_ms`` is the attempt's, and
        the header keeps it a version 1 record, which every status view reads)."""
        job_id, task, key_text = identity(d)
        fields = d.fields
        values: dict[str, Any] = {
            "job_id": job_id,
            "queue": self._name,
            "task": task,
            "idempotency_key": key_text,
            "state": state,
            "attempt": d.attempt,
            "at_ms": now_ms,
            "due_ms": fields[F_DUE_MS] if fields else None,
            "duration_ms": None if seconds is None else seconds * 1000,
            "error_type": failure.error_type if failure else None,
            "error": failure.short_message if failure else None,
            "worker": self._worker_id,
            "trace_id": trace_id(d),
            "schedule_id": fields[F_SCHEDULE_ID] if fields else None,
        }
        progress = getattr(d, "progress", None)
        unsent = None if progress is None else progress.take_unsent()
        if unsent is not None:  # an ended attempt's progress not written yet
            value = encode_outcome_v3(
                progress=unsent.fraction, progress_detail=unsent.detail, **values
            )
            headers = outcome_headers(OUTCOME_V3_HEADERS, d.hmap)
        else:
            value = encode_outcome(**values)
            headers = outcome_headers(
                OUTCOME_HEADERS if state not in V2_STATES else OUTCOME_V2_HEADERS, d.hmap
            )
        if next_due_ms is not None:
            headers = [*headers, (hdr.NEXT_DUE, str(next_due_ms).encode())]
        self.records.append((d.feed, self._outcomes_topic, -1, job_id.encode(), value, headers))
