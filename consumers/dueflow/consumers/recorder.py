"""What finished since the last commit, as the records of one transaction.

Every attempt that ends adds its records here, in memory; the runtime cuts
a :class:`~dueflow.consumers.committer.Batch` every commit interval:

- success: idempotency ``done`` (explicit partition p) + outcome ``succeeded``
- retriable failure: the record again in its retry tier (partition p, the
  value unchanged, headers with the next attempt and its due time) +
  outcome ``retrying``; a delay longer than the top tier goes back through
  the timer wheel instead (a timer record that fires into exec partition p at
  the due time, see :func:`dueflow.rules.backoff.retry_route`)
- permanent failure, exhausted attempts, unknown task, undecodable record:
  DLQ record (partition p) + idempotency ``dead`` + outcome ``dead``
- skipped (key final already): outcome ``duplicate`` or ``cancelled``
- superseded (a reschedule moved the job): outcome ``rescheduled``
- expired (a first attempt past its deadline): outcome ``expired``
- a cron occurrence skipped by its overlap policy: idempotency ``cancelled``
  + outcome ``skipped``

A successful attempt's follow-ups (``ctx.schedule``) join its records: their
timer records and ``scheduled`` outcomes (:mod:`dueflow.consumers.follow_ups`).
A failed attempt's are dropped.

A key finished here is "pending final" until its batch commits, so a
replayed record of the same key is skipped even before the store knows.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import Counter as Tally
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.committer import Batch
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, PartitionFeed, identity, int_or, trace_id
from dueflow.consumers.follow_ups import FollowUpPlanner, follow_up_records
from dueflow.consumers.outputs import (
    KEY_HEADERS,
    OUTCOME_HEADERS,
    OUTCOME_V2_HEADERS,
    dead_letter_headers,
    dead_letter_value,
    parse_origin,
    retry_headers,
)
from dueflow.consumers.store import CANCELLED, DEAD, DONE, RETRYING, retried
from dueflow.kafka.topics import names, tier_label
from dueflow.observability.logs import (
    JOB_DEAD_LETTER,
    JOB_FAILED,
    JOB_RETRY,
    JOB_SUCCEEDED,
    job_event,
)
from dueflow.observability.metrics import Metrics, observe_many
from dueflow.observability.tracing import JobTracer
from dueflow.reasons import EXHAUSTED, PERMANENT_ERROR, TIMEOUT
from dueflow.records.fast import (
    F_BACKOFF,
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_SCHEDULE_ID,
    F_TASK,
    V2_STATES,
    encode_key_state,
    encode_outcome,
    encode_success,
)
from dueflow.records.timer_record import TimerPlacer, retry_timer
from dueflow.rules.backoff import WHEEL, compute_backoff, retry_route

_LOG = logging.getLogger("dueflow.worker")

Final = tuple[PartitionFeed, bytes, int, int]  # feed, key, state, at_ms
Mark = tuple[PartitionFeed, int]  # feed, offset committed with the batch


class BatchRecorder:
    """Records, final key states and metrics of the batch being built."""

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
    ) -> None:
        n = names(settings)
        self._tracer = tracer
        self._queue = queue
        self._name = queue.name
        self._tiers = queue.retry_tiers_ms
        self._tier_topics = {tier: n.retry(queue.name, tier) for tier in queue.retry_tiers_ms}
        self._timers_topic = n.timers
        self._placer = TimerPlacer(settings.wheel)
        self._idem_topic = n.idempotency(queue.name)
        self._dlq_topic = n.dlq(queue.name)
        self._outcomes_topic = n.outcomes
        self._worker_id = worker_id
        self._metrics = metrics
        self._rng = rng
        # Per-job success lines (observability.job_log); failures are always logged.
        self._log_successes = settings.observability.job_log == "all"
        self.records: list[tuple[Any, ...]] = []  # (feed, topic, partition, key, value, headers)
        self.finals: list[Final] = []
        self.pending_final: dict[bytes, int] = {}
        self._dirty = False
        self._tally: Tally[tuple[str, str]] = Tally()
        self._succeeded: dict[str, int] = {}  # task -> successes (the hot counter)
        self._durations: list[tuple[str, float]] = []
        # ctx.schedule: the attempts' follow-ups (an empty dict while none has any)
        self._follow_up_planner = follow_ups
        self._follow_up_buffers = {} if follow_ups is None else follow_ups.buffers
        for result in ("written", "dropped"):  # its series exist from the start
            metrics.follow_ups.labels(queue.name, result)

    def __len__(self) -> int:
        return len(self.records)

    # ------------------------------------------------------------------ outcomes

    def succeeded(self, d: Delivery, seconds: float, now_ms: int) -> None:
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
        records = self.records
        key = d.key
        if key:
            records.append((feed, self._idem_topic, feed.partition, key, key_state, KEY_HEADERS))
            self.finals.append((feed, key, DONE, now_ms))
            self.pending_final[key] = DONE
        records.append((feed, self._outcomes_topic, -1, job_id.encode(), outcome, OUTCOME_HEADERS))
        if self._follow_up_buffers:
            self._follow_ups(d, now_ms)
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

    def _follow_ups(self, d: Delivery, now_ms: int) -> None:
        """The follow-ups of a successful attempt, in its transaction."""
        assert self._follow_up_planner is not None
        planned = self._follow_up_planner.take(d)
        feed = d.feed
        for topic, partition, key, value, headers in follow_up_records(
            planned,
            now_ms=now_ms,
            placer=self._placer,
            timers_topic=self._timers_topic,
            outcomes_topic=self._outcomes_topic,
            outcome_headers=OUTCOME_HEADERS,
            worker_id=self._worker_id,
        ):
            self.records.append((feed, topic, partition, key, value, headers))
        if planned:
            self._metrics.follow_ups.labels(self._name, "written").inc(len(planned))

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
        assert d.task is not None
        task = fields[F_TASK]
        self._durations.append((task, seconds))
        if failure.timed_out:
            self._metrics.job_timeouts.labels(self._name, task).inc()
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
            task=task,
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
        if failure.permanent:
            self.dead(d, PERMANENT_ERROR, failure, now_ms, started=True, seconds=seconds)
            return
        if d.attempt >= d.max_attempts:
            reason = TIMEOUT if failure.timed_out else EXHAUSTED
            self.dead(d, reason, failure, now_ms, started=True, seconds=seconds)
            return
        feed = d.feed
        policy = d.task.spec.backoff or fields[F_BACKOFF]
        delay = compute_backoff(
            attempt=d.attempt, policy=policy, tiers_ms=self._tiers, rand=self._rng.random()
        )
        route = retry_route(delay, self._tiers)
        hmap = d.hmap
        origin = hmap.get(hdr.ORIGIN)
        due_ms = now_ms + delay
        headers = retry_headers(
            d.msg.headers(),
            attempt=d.attempt + 1,
            due_ms=due_ms,
            first_failure_ms=int_or(hmap.get(hdr.FIRST_FAILURE), now_ms),
            failed_ms=now_ms,
            failure=failure,
            origin=origin.decode() if origin else f"{feed.topic}:{feed.partition}:{d.offset}",
            trace=d.span.headers if d.span is not None else (),
        )
        key = d.msg.key()
        if key is None:
            key = d.key
        value = d.msg.value()
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
            self.records.append(
                (feed, self._timers_topic, rec.partition, rec.key, rec.value, rec.headers)
            )
            label = WHEEL
        else:
            # (a record without a key cannot be a timer: it waits in the top tier)
            tier = self._tiers[-1] if route == WHEEL else int(route)
            self.records.append(
                (feed, self._tier_topics[tier], feed.partition, key, value, headers)
            )
            label = tier_label(tier)
        if d.key:
            # The attempt is handed on: a redelivery of it (read again from an
            # offset committed behind it, after a rebalance) must not run it again.
            self.records.append(
                (
                    feed,
                    self._idem_topic,
                    feed.partition,
                    d.key,
                    encode_key_state(
                        idempotency_key=fields[F_KEY],
                        job_id=fields[F_JOB_ID],
                        state=RETRYING,
                        at_ms=now_ms,
                        attempts=d.attempt,
                    ),
                    KEY_HEADERS,
                )
            )
            state = retried(d.attempt)
            self.finals.append((feed, d.key, state, now_ms))
            self.pending_final[d.key] = state
        self._outcome(d, "retrying", now_ms, failure=failure, seconds=seconds)
        self._metrics.retries.labels(self._name, label).inc()
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
        value = dead_letter_value(
            job_id=job_id,
            queue=self._name,
            task=task,
            idempotency_key=key_text,
            reason=reason,
            failure=failure,
            attempts=attempts,
            first_failure_ms=int_or(hmap.get(hdr.FIRST_FAILURE), now_ms),
            last_failure_ms=int_or(hmap.get(hdr.LAST_FAILURE), now_ms) if not started else now_ms,
            dead_ms=now_ms,
            origin=origin,
            trace_id=trace_id(d),
            value=d.msg.value() or b"",
            headers={k: v for k, v in (raw_headers or []) if v is not None},
        )
        self.records.append(
            (
                feed,
                self._dlq_topic,
                feed.partition,
                d.key or None,
                value,
                dead_letter_headers(raw_headers, failure=failure, attempts=attempts),
            )
        )
        if d.key:
            self.records.append(
                (
                    feed,
                    self._idem_topic,
                    feed.partition,
                    d.key,
                    encode_key_state(
                        idempotency_key=key_text,
                        job_id=job_id,
                        state="dead",
                        at_ms=now_ms,
                        attempts=attempts,
                    ),
                    KEY_HEADERS,
                )
            )
            self.finals.append((feed, d.key, DEAD, now_ms))
            self.pending_final[d.key] = DEAD
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

    def skipped(self, d: Delivery, state: int, now_ms: int) -> None:
        """The key is final already: outcome ``cancelled`` or ``duplicate``, nothing else."""
        if state == CANCELLED:
            self._outcome(d, "cancelled", now_ms)
            self._tally[(identity(d)[1], "cancelled")] += 1
        else:
            self._outcome(d, "duplicate", now_ms)
            self._metrics.duplicates_skipped.labels(self._name).inc()

    def superseded(self, d: Delivery, now_ms: int) -> None:
        """A reschedule moved the job: outcome ``rescheduled`` for this delivery (due at
        the old time), nothing else (the key is not final: the job is still to run)."""
        self._outcome(d, "rescheduled", now_ms)
        self._tally[(identity(d)[1], "rescheduled")] += 1

    def skipped_occurrence(self, d: Delivery, now_ms: int) -> None:
        """A cron occurrence skipped by its schedule's overlap policy: its key is final
        (``cancelled``: it did not and will not run) + outcome ``skipped``."""
        job_id, task, key_text = identity(d)
        if d.key:
            self.records.append(
                (
                    d.feed,
                    self._idem_topic,
                    d.feed.partition,
                    d.key,
                    encode_key_state(
                        idempotency_key=key_text, job_id=job_id, state="cancelled", at_ms=now_ms
                    ),
                    KEY_HEADERS,
                )
            )
            self.finals.append((d.feed, d.key, CANCELLED, now_ms))
            self.pending_final[d.key] = CANCELLED
        self._outcome(d, "skipped", now_ms)
        self._tally[(task, "skipped")] += 1

    def expired(self, d: Delivery, now_ms: int) -> None:
        """Not started by its deadline: outcome ``expired``, nothing else (not a dead
        letter, the key not final: see :mod:`dueflow.rules.deadline`)."""
        self._outcome(d, "expired", now_ms)
        self._tally[(identity(d)[1], "expired")] += 1

    def _outcome(
        self,
        d: Delivery,
        state: str,
        now_ms: int,
        *,
        failure: Failure | None = None,
        seconds: float | None = None,
    ) -> None:
        job_id, task, key_text = identity(d)
        fields = d.fields
        self.records.append(
            (
                d.feed,
                self._outcomes_topic,
                -1,
                job_id.encode(),
                encode_outcome(
                    job_id=job_id,
                    queue=self._name,
                    task=task,
                    idempotency_key=key_text,
                    state=state,
                    attempt=d.attempt,
                    at_ms=now_ms,
                    due_ms=fields[F_DUE_MS] if fields else None,
                    duration_ms=None if seconds is None else seconds * 1000,
                    error_type=failure.error_type if failure else None,
                    error=failure.short_message if failure else None,
                    worker=self._worker_id,
                    trace_id=trace_id(d),
                    schedule_id=fields[F_SCHEDULE_ID] if fields else None,
                ),
                OUTCOME_HEADERS if state not in V2_STATES else OUTCOME_V2_HEADERS,
            )
        )

    # ------------------------------------------------------------------ batches

    def lost(self) -> None:
        """Some partitions were lost: drop their records at the next cut."""
        self._dirty = True

    def clear(self) -> None:
        self.records, self.finals = [], []
        self.pending_final.clear()

    def cut(
        self, feeds: list[PartitionFeed], *, resend: bool = False
    ) -> tuple[Batch, list[Final], list[Mark]] | None:
        """Take the batch: records so far and the committable offset of each feed
        (``resend``: of every feed that has one, also when it did not move).

        A feed the batch writes for sends its offset also when it did not move (a
        slow job ahead of finished ones holds it). The pending offset commit is
        the fence against a zombie: a worker frozen inside the commit may finish
        it after its partition moved, and the new owner's read of the committed
        offsets waits for that transaction (read_committed, KIP-447) and then
        finds its records in the key store, instead of running them again
        (tests/integration/test_pending_offsets_fence.py)."""
        records, finals = self.records, self.finals
        if self._dirty:
            records = [r for r in records if not r[0].gone]
            for feed, key, _state, _at in finals:
                if feed.gone:
                    self.pending_final.pop(key, None)
            finals = [f for f in finals if not f[0].gone]
            self._dirty = False
        offsets: list[TopicPartition] = []
        marks: list[Mark] = []
        # (feed, its committed offset) that did not move: sent if the batch writes for it
        still: list[tuple[PartitionFeed, int]] = []
        for feed in feeds:
            if feed.gone:
                continue
            position = feed.tracker.committable()
            if position is not None and position != feed.committed:
                offsets.append(TopicPartition(feed.topic, feed.partition, position))
                marks.append((feed, position))
            elif feed.committed is not None:
                if resend:
                    offsets.append(TopicPartition(feed.topic, feed.partition, feed.committed))
                else:
                    still.append((feed, feed.committed))
        if still and records:
            writing = {id(r[0]) for r in records}
            offsets.extend(
                TopicPartition(f.topic, f.partition, at) for f, at in still if id(f) in writing
            )
        self.records, self.finals = [], []
        if not records and not offsets:
            return None
        return Batch(records, offsets, _gone_check(records, marks)), finals, marks

    def committed(self, finals: list[Final], marks: list[Mark]) -> None:
        """The batch is committed: its keys are final in the stores now."""
        for feed, position in marks:
            feed.committed = position
        by_store: dict[int, tuple[Any, list[tuple[bytes, int | None, int]]]] = {}
        pending = self.pending_final
        for feed, key, state, at_ms in finals:
            entry = by_store.get(id(feed.keys))
            if entry is None:
                entry = by_store[id(feed.keys)] = (feed.keys, [])
            entry[1].append((key, state, at_ms))
            if pending.get(key) == state:
                del pending[key]
        for store, items in by_store.values():
            store.apply(items, None)

    def flush_metrics(self) -> None:
        """Counters and durations are added up per batch, not per job (hot path)."""
        m = self._metrics
        q = self._name
        if self._succeeded:
            for task, count in self._succeeded.items():
                self._tally[(task, "succeeded")] += count
            self._succeeded.clear()
        if self._tally:
            for (task, outcome), count in self._tally.items():
                m.jobs.labels(q, task, outcome).inc(count)
                if outcome in ("succeeded", "retrying", "dead"):
                    m.attempts.labels(q, task).inc(count)
            self._tally.clear()
        if self._durations:
            per_task: dict[str, list[float]] = {}
            for task, seconds in self._durations:
                per_task.setdefault(task, []).append(seconds)
            for task, values in per_task.items():
                observe_many(m.job_duration.labels(q, task), values)
            self._durations.clear()


def _gone_check(records: list[tuple[Any, ...]], marks: list[Mark]) -> Callable[[], bool]:
    """Whether a feed the batch writes for is gone (asked before the offsets are
    sent, before the commit, and before a replay)."""
    feeds: list[Any] | None = None

    def gone() -> bool:
        nonlocal feeds
        if feeds is None:  # the distinct feeds, once: a batch has thousands of records
            distinct = {id(f): f for f, _ in marks}
            distinct.update((id(r[0]), r[0]) for r in records if r[0] is not None)
            feeds = list(distinct.values())
        return any(f.gone for f in feeds)

    return gone
