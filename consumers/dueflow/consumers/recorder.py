"""What finished since the last commit, as the records of one transaction.

Every attempt that ends adds its records here, in memory; the runtime cuts
a :class:`~dueflow.consumers.committer.Batch` every commit interval:

- success: idempotency ``done`` (explicit partition p) + outcome ``succeeded``
- retriable failure: the record again in its retry tier (partition p, the
  value unchanged, headers with the next attempt and its due time) +
  outcome ``retrying`` (its ``df-next-due`` header: the retry's due time); a
  delay longer than the top tier goes back through the timer wheel instead (a
  timer record that fires into exec partition p at the due time, see
  :func:`dueflow.rules.backoff.retry_route`)
- permanent failure, exhausted attempts, unknown task, undecodable record:
  DLQ record (partition p) + idempotency ``dead`` + outcome ``dead``
- skipped (key final already): outcome ``duplicate`` or ``cancelled``
- superseded (a reschedule moved the job): outcome ``rescheduled``
- expired (a first attempt past its deadline): outcome ``expired``
- a cron occurrence skipped by its overlap policy: idempotency ``cancelled``
  + outcome ``skipped``
- a command, and a delivery of a steered job: what
  :class:`~dueflow.consumers.commands.CommandApplier` adds (the job's state in
  the steering topic, timers written again, outcomes answering commands); every
  end of a steered job's delivery updates its state in the same batch

A successful attempt's follow-ups (``ctx.schedule``) join its records: their
timer records and ``scheduled`` outcomes (:mod:`dueflow.consumers.follow_ups`).
A failed attempt's are dropped.

Records that could exceed their topic's limit are measured first
(:mod:`dueflow.consumers.oversized`): a retry that would not fit is a dead
letter instead, a follow-up that would not fit is dead-lettered in its own
queue, and a dead letter is trimmed to fit.

A handler's return value is the job's result: its JSON goes into the
``succeeded`` outcome (version 3), in the transaction with ``done`` and the
offset, so a job that runs again after a crash before its commit writes one
result. A value that is not JSON or is over the cap gives ``result_error``
instead; the job still succeeded. A handler that returns None writes the
version 1 outcome. Progress (``ctx.progress``) is added at each cut
by the queue's :class:`~dueflow.consumers.progress.ProgressReporter`; an
attempt's value not written yet goes with its final outcome.

A key finished here is "pending final" until its batch commits, so a
replayed record of the same key is skipped even before the store knows.

:class:`BatchRecorder` writes a handler's success and retry here; the ends
that no success or retry writes (skips, expiries, dead letters) are
:mod:`dueflow.consumers.outcome_records`'s, and the batch itself (its records,
its cut, its commit) is :mod:`dueflow.consumers.pending_batch`'s.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, identity, trace_id
from dueflow.consumers.follow_ups import FollowUpPlanner, follow_up_records
from dueflow.consumers.outcome_records import OutcomeRecorder
from dueflow.consumers.outputs import (
    KEY_HEADERS,
    OUTCOME_HEADERS,
    OUTCOME_V3_HEADERS,
    outcome_headers,
    parse_origin,
    retry_headers,
)
from dueflow.consumers.oversized import (
    WriteLimits,
    follow_up_dead_letter,
    not_retried,
)
from dueflow.consumers.pending_batch import (
    Final,
    Finals,
    Mark,
    SteerFinal,
    key_name,
)
from dueflow.consumers.progress import ProgressReporter
from dueflow.consumers.store import DONE, RETRYING, retried
from dueflow.kafka.topics import names, tier_label
from dueflow.observability.logs import (
    JOB_DEAD_LETTER,
    JOB_FAILED,
    JOB_RESULT_NOT_KEPT,
    JOB_RETRY,
    JOB_SUCCEEDED,
    job_event,
)
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.reasons import EXHAUSTED, OTHER, PERMANENT_ERROR, TIMEOUT
from dueflow.records.follow_up import PlannedFollowUp
from dueflow.records.job_checks import ms_or
from dueflow.records.job_result import JobResult, limit_result, to_json
from dueflow.records.size_budget import TopicLimit
from dueflow.records.timer_record import TimerPlacer, retry_timer
from dueflow.records.worker_codec import (
    F_BACKOFF,
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_SCHEDULE_ID,
    F_TASK,
    encode_success,
    result_tail,
)
from dueflow.rules.backoff import WHEEL, compute_backoff, retry_route
from dueflow.rules.wire_bounds import MAX_DUE_MS

__all__ = ["BatchRecorder", "Final", "Finals", "Mark", "SteerFinal", "key_name"]

_LOG = logging.getLogger("dueflow.worker")


class BatchRecorder(OutcomeRecorder):
    """What each end of a delivery adds to the batch being built."""

    def __init__(
        self,
        settings: Settings,
        queue: QueueSpec,
        *,
        worker_id: str,
        metrics: Metrics,
        tracer: JobTracer,
        rng: random.Random,
        follow_ups: FollowUpPlanner | None = None,
        limits: WriteLimits | None = None,
        progress: ProgressReporter | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(
            settings,
            queue,
            worker_id=worker_id,
            metrics=metrics,
            tracer=tracer,
            limits=limits,
            progress=progress,
            limit=limit,
        )
        n = names(settings)
        self._settings = settings
        self._queue = queue
        self._tiers = queue.retry_tiers_ms
        self._tier_topics = {tier: n.retry(queue.name, tier) for tier in queue.retry_tiers_ms}
        self._timers_topic = n.timers
        self._placer = TimerPlacer(settings.wheel)
        self._rng = rng
        # Per-job success lines (observability.job_log); failures are always logged.
        self._log_successes = settings.observability.job_log == "all"
        # ctx.schedule: the attempts' follow-ups (an empty dict while none has any)
        self._follow_up_planner = follow_ups
        self._follow_up_buffers = {} if follow_ups is None else follow_ups.buffers
        for result in ("written", "dropped"):  # its series exist from the start
            metrics.follow_ups.labels(queue.name, result)
        self._result_max_bytes = settings.worker.result_max_bytes

    # ------------------------------------------------------------------ outcomes

    def succeeded(self, d: Delivery, seconds: float, now_ms: int, returned: Any = None) -> None:
        """An attempt succeeded; ``returned``: what its handler returned (a child
        process's as a :class:`~dueflow.records.job_result.JobResult`)."""
        # The hot path: one call per job at tens of thousands per second.
        fields = d.fields
        assert fields is not None
        feed = d.feed
        job_id = fields[F_JOB_ID]
        task = fields[F_TASK]
        key_state, outcome = encode_success(
            job_id,
            fields[F_KEY],
            self._name,
            task,
            d.attempt,
            now_ms,
            fields[F_DUE_MS],
            seconds * 1000,
            self._worker_id,
            trace_id(d),
            fields[F_SCHEDULE_ID],
        )
        schema_headers = OUTCOME_HEADERS
        result = None if returned is None else self._result_of(d, returned)
        progress = d.progress
        unsent = None if progress is None else progress.take_unsent()
        if result is not None or unsent is not None:  # Outcome v3: its fields after v1's
            outcome += result_tail(
                None if result is None else result.json,
                None if result is None else result.error,
                None if unsent is None else unsent.fraction,
                None if unsent is None else unsent.detail,
            )
            schema_headers = OUTCOME_V3_HEADERS
        records = self.records
        key = d.key
        if key:
            records.append((feed, self._idem_topic, feed.partition, key, key_state, KEY_HEADERS))
            self.finals.append((feed, key, DONE, now_ms))
            self.pending_final[key] = DONE
        records.append(
            (
                feed,
                self._outcomes_topic,
                -1,
                job_id.encode(),
                outcome,
                outcome_headers(schema_headers, d.hmap),
            )
        )
        if self._follow_up_buffers:
            self._follow_ups(d, now_ms, result)
        steering = self.steering
        if steering is not None:
            steering.ended(d, "done", now_ms)
            if hdr.GROUP in d.hmap:  # a group's member: its end goes to the group's owner
                steering.groups.member_ended(
                    d, "succeeded", now_ms, result=None if result is None else result.json
                )
        ok = self._succeeded
        ok[task] = ok.get(task, 0) + 1
        self._durations.append((task, seconds))
        if self._log_successes and _LOG.isEnabledFor(logging.INFO):
            job_event(
                _LOG,
                JOB_SUCCEEDED,
                job_id=job_id,
                queue=self._name,
                task=task,
                attempt=d.attempt,
                duration_ms=seconds * 1000,
                outcome="succeeded",
                trace_id=trace_id(d),
            )

    def _result_of(self, d: Delivery, returned: Any) -> JobResult:
        """The attempt's return value as the outcome carries it: JSON within the cap,
        or why not (logged and counted; the job still succeeded)."""
        assert d.task is not None
        cap = d.task.spec.result_max_bytes or self._result_max_bytes
        if isinstance(returned, JobResult):  # a child process's, encoded there
            result = limit_result(returned, max_bytes=cap)
        else:
            result = limit_result(to_json(returned), max_bytes=cap)
        if result.error is not None:
            job_id, task, _key = identity(d)
            self._metrics.result_errors.labels(self._name, task).inc()
            job_event(
                _LOG,
                JOB_RESULT_NOT_KEPT,
                job_id=job_id,
                queue=self._name,
                task=task,
                attempt=d.attempt,
                outcome="succeeded",
                trace_id=trace_id(d),
                level=logging.WARNING,
                error=result.error,
            )
        return result

    def _follow_ups(self, d: Delivery, now_ms: int, result: JobResult | None) -> None:
        """The follow-ups of a successful attempt, in its transaction."""
        assert self._follow_up_planner is not None
        planned = self._follow_up_planner.take(d)
        feed = d.feed
        planned = self._fitting_follow_ups(d, planned, now_ms)
        for topic, partition, key, value, headers in follow_up_records(
            planned,
            now_ms=now_ms,
            placer=self._placer,
            timers_topic=self._timers_topic,
            outcomes_topic=self._outcomes_topic,
            outcome_headers=OUTCOME_HEADERS,
            worker_id=self._worker_id,
            result=result,
            budget=self._follow_up_planner.budget_of,
        ):
            self.records.append((feed, topic, partition, key, value, headers))
        if planned:
            self._metrics.follow_ups.labels(self._name, "written").inc(len(planned))

    def _fitting_follow_ups(
        self, d: Delivery, planned: list[PlannedFollowUp], now_ms: int
    ) -> list[PlannedFollowUp]:
        """The follow-ups whose timer fits the timer topic; the others are dead-lettered
        in their own queues (oversized.py)."""
        limits = self.limits
        keep = []
        for p in planned:
            rec = p.record
            why = limits.too_large(
                limits.timers, rec.key, rec.value, rec.headers, what="timer record"
            )
            if why is None:
                keep.append(p)
                continue
            assert self._follow_up_planner is not None
            records, fitted = follow_up_dead_letter(
                p,
                why,
                settings=self._settings,
                spec_of=self._follow_up_planner.spec_of,
                limits=limits,
                origin=(d.feed.topic, d.feed.partition, d.offset),
                now_ms=now_ms,
                worker_id=self._worker_id,
            )
            self._metrics.too_large.labels("worker", "follow-up timer").inc()
            if fitted is not None:
                self._count_cut(fitted)
            for topic, partition, key, value, headers in records:
                self.records.append((d.feed, topic, partition, key, value, headers))
            job_event(
                _LOG,
                JOB_DEAD_LETTER,
                job_id=p.follow_up.job_id,
                queue=p.follow_up.queue,
                task=p.follow_up.task,
                attempt=0,
                duration_ms=None,
                outcome="dead" if records else "lost",
                trace_id=trace_id(d),
                level=logging.ERROR,
                reason=OTHER,
                error=f"follow-up not scheduled: {why}",
                parent_job_id=identity(d)[0],
            )
        return keep

    def drop_follow_ups(self, d: Delivery) -> int:
        """The attempt ended without success (or was abandoned): forget its follow-ups."""
        if self._follow_up_planner is None or not self._follow_up_buffers:
            return 0
        return len(self._follow_up_planner.take(d))

    def failed(self, d: Delivery, failure: Failure, seconds: float, now_ms: int) -> None:
        """A handler failed: retry tier, or dead letter when it cannot be retried.
        Its follow-ups are dropped (the attempt that succeeds schedules them)."""
        fields = d.fields
        assert fields is not None
        task = fields[F_TASK]
        self._durations.append((task, seconds))
        if failure.timed_out:
            self._metrics.job_timeouts.labels(self._name, task).inc()
        self._log_failed(d, failure, seconds)
        if failure.permanent:
            self.dead(d, PERMANENT_ERROR, failure, now_ms, started=True, seconds=seconds)
            return
        if self.steering is not None and self.steering.cancelled(d):
            # Cancelled while it ran: no other attempt starts.
            self._cancelled_attempt(d, failure, seconds, now_ms)
            return
        if d.attempt >= d.max_attempts:
            reason = TIMEOUT if failure.timed_out else EXHAUSTED
            self.dead(d, reason, failure, now_ms, started=True, seconds=seconds)
            return
        self._retry(d, failure, seconds, now_ms)

    def _log_failed(self, d: Delivery, failure: Failure, seconds: float) -> None:
        """The failed attempt's log line (its follow-ups dropped are counted in it)."""
        fields = d.fields
        assert fields is not None
        extra: dict[str, Any] = {}
        if self._follow_up_buffers:
            dropped = self.drop_follow_ups(d)
            if dropped:
                extra["follow_ups_dropped"] = dropped
                self._metrics.follow_ups.labels(self._name, "dropped").inc(dropped)
        job_event(
            _LOG,
            JOB_FAILED,
            job_id=fields[F_JOB_ID],
            queue=self._name,
            task=fields[F_TASK],
            attempt=d.attempt,
            duration_ms=seconds * 1000,
            outcome="failed",
            trace_id=trace_id(d),
            level=logging.WARNING,
            error_type=failure.error_type,
            error=failure.summary,
            timed_out=failure.timed_out,
            permanent=failure.permanent,
            **extra,
        )

    def _retry(self, d: Delivery, failure: Failure, seconds: float, now_ms: int) -> None:
        """The attempt is handed on to its next one: a retry record (a retry tier's, or
        a timer through the wheel) + key ``retrying`` + outcome ``retrying``."""
        fields = d.fields
        assert fields is not None
        assert d.task is not None
        policy = d.task.spec.backoff or fields[F_BACKOFF]
        delay = compute_backoff(
            attempt=d.attempt, policy=policy, tiers_ms=self._tiers, rand=self._rng.random()
        )
        due_ms = min(now_ms + delay, MAX_DUE_MS)  # a policy's cap may lie past year 9999
        retry, what, limit, label = self._retry_record(d, failure, now_ms, delay, due_ms)
        limits = self.limits
        why = limits.too_large(limit, retry[3], retry[4], retry[5], what=what)
        if why is not None:
            # A retry that would not fit its topic is a dead letter now: it can never
            # be written (it would fail every commit of its batch).
            self._metrics.too_large.labels("worker", what).inc()
            self.dead(d, OTHER, not_retried(failure, why), now_ms, started=True, seconds=seconds)
            return
        self.records.append(retry)
        if d.key:
            # The attempt is handed on: a redelivery of it (read again from an
            # offset committed behind it, after a rebalance) must not run it again.
            self._key_record(d, RETRYING, retried(d.attempt), now_ms, attempts=d.attempt)
            if self.steering is not None:
                self.steering.ended(d, None, now_ms)
        self._outcome(d, "retrying", now_ms, failure=failure, seconds=seconds, next_due_ms=due_ms)
        self._metrics.retries.labels(self._name, label).inc()
        task = fields[F_TASK]
        self._tally[(task, "retrying")] += 1
        job_event(
            _LOG,
            JOB_RETRY,
            job_id=fields[F_JOB_ID],
            queue=self._name,
            task=task,
            attempt=d.attempt,
            duration_ms=seconds * 1000,
            outcome="retrying",
            trace_id=trace_id(d),
            retry_in_ms=delay,
            tier=label,
            error=failure.summary,
        )

    def _retry_record(
        self, d: Delivery, failure: Failure, now_ms: int, delay: int, due_ms: int
    ) -> tuple[tuple[Any, ...], str, TopicLimit, str]:
        """The record of the attempt's retry, what it is, the limit of its topic and the
        route's label: a retry tier's record, or for a delay longer than the top tier
        a timer that fires into the exec partition (:func:`retry_route`)."""
        feed = d.feed
        hmap = d.hmap
        route = retry_route(delay, self._tiers)
        headers = retry_headers(
            d.msg.headers(),
            attempt=d.attempt + 1,
            due_ms=due_ms,
            first_failure_ms=ms_or(hmap.get(hdr.FIRST_FAILURE), now_ms),
            failed_ms=now_ms,
            failure=failure,
            origin=_origin_text(hmap.get(hdr.ORIGIN))
            or f"{feed.topic}:{feed.partition}:{d.offset}",
            trace=d.span.headers if d.span is not None else (),
        )
        key = d.msg.key()
        if key is None:
            key = d.key
        value = d.msg.value()
        limits = self.limits
        if route == WHEEL and key:
            rec = retry_timer(
                key=key,
                value=value or b"",
                headers=headers,
                queue=self._name,
                exec_partition=feed.partition,
                due_ms=due_ms,
                now_ms=now_ms,
                placer=self._placer,
            )
            retry = (feed, self._timers_topic, rec.partition, rec.key, rec.value, rec.headers)
            return retry, "retry timer", limits.timers, WHEEL
        # (a record without a key cannot be a timer: it waits in the top tier)
        tier = self._tiers[-1] if route == WHEEL else int(route)
        topic = self._tier_topics[tier]
        retry = (feed, topic, feed.partition, key, value, headers)
        return retry, "retry record", limits.tier(topic), tier_label(tier)


def _origin_text(raw: bytes | None) -> str | None:
    """``df-origin`` of a record, when it is one (else the record itself is the origin)."""
    if not raw:
        return None
    try:
        text = raw.decode()
        parse_origin(text)
    except ValueError:
        return None
    return text
