"""The worker over the in-memory log: the real decisions, one delivery at a time.

For each exec or retry record, in order of its "not before" (``df-due``), at
or after it, never before: the worker's own code decides --
:func:`~dueflow.consumers.feeds.prepare` decodes the record, and
:func:`~dueflow.consumers.decision.decide`, the function
:mod:`dueflow.consumers.runtime` calls, gives the verdict: the key is final
already (``duplicate``, ``cancelled``), the job was moved or rescheduled to
another due time (``rescheduled``), undecodable, out of range or an unknown
task (dead letter), a first attempt past its deadline (``expired``), or run.
Each verdict is carried out as the worker does:
:func:`~dueflow.consumers.feeds.attempt_limits` gives the attempts and the
timeout, the handler runs, and the
:class:`~dueflow.consumers.recorder.BatchRecorder` writes what a commit
writes: idempotency ``done``/``dead``, the retry record in its tier with the
next attempt's due time (the task's backoff and jitter, drawn from the
pipeline's seeded random source), the dead letter with its reason, and the
outcome. Those records go back into the log, where the next poll reads them.

Differences from a worker on Kafka, by design: one delivery runs at a time
(no concurrency, so no replay waits for its key to finish, and a cron
schedule's overlap policy never finds a previous occurrence still running);
the key store has read every key record written before a delivery is
decided (so a redriven record needs no wait for it); a record runs at its
"not before" exactly, where on Kafka it may wait behind an earlier record of
its tier partition; rate limits are not applied (time does not pass by
itself); ``isolation="process"`` runs in-process (see
:mod:`dueflow.testing.attempts`).

Commands (cancel, move, update: :mod:`dueflow.records.command`) are applied
by the worker's own applier (:mod:`dueflow.consumers.commands`) as soon as
they are read, so ``cancel``/``reschedule``/``update`` answer at once; a
delivery of a steered job is judged by the same rule as on a worker
(superseded, cancelled, or written again with a move or update).

``ctx.schedule`` works as on a worker (:mod:`dueflow.consumers.follow_ups`):
the follow-ups of an attempt go into the log with its success, as timer
records the emitter fires at their due time, and a failed attempt's are
dropped. Failure hooks (``@on_failure``) run after each failed attempt.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.commands import CommandApplier, SteeringBook
from dueflow.consumers.context import TaskContext
from dueflow.consumers.decision import Kind, decide
from dueflow.consumers.failures import Failure
from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import (
    Delivery,
    PartitionFeed,
    WireLimits,
    attempt_limits,
    int_or,
    prepare,
)
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.hooks import will_retry
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.progress import ProgressBudget, ProgressReporter
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.steering_store import memory_steering_stores
from dueflow.consumers.store import MemoryKeyStore, is_final, state_of
from dueflow.consumers.verdict_ends import SETTLE
from dueflow.consumers.worker_process import select_queues
from dueflow.errors import UndecodableRecord
from dueflow.kafka.topics import names, tier_label
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records import codec, reschedule
from dueflow.records.follow_up import FollowUp
from dueflow.records.job_result import decode_result
from dueflow.records.timer_record import TimerPlacer
from dueflow.records.worker_codec import (
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_SCHEDULE_ID,
    F_TASK,
    decode_key_record,
    decode_key_state,
)
from dueflow.rules.wire_bounds import MAX_DUE_MS
from dueflow.testing.attempts import HandlerLoop, run_attempt
from dueflow.testing.hooks import MemoryHooks
from dueflow.testing.log import MemoryLog, MemoryRecord, as_message
from dueflow.testing.views import JobRun, PendingJob

WORKER_ID = "in-memory"


# Eager runs ignore due times: a record's times may lie anywhere ahead of the clock.
_EAGER_LIMITS = WireLimits(skew_ms=MAX_DUE_MS)


@dataclass
class _Queue:
    spec: QueueSpec
    recorder: BatchRecorder
    feeds: list[PartitionFeed]
    tiers: dict[str, int]  # retry topic -> tier ms
    planner: FollowUpPlanner  # ctx.schedule of its jobs
    limits: WireLimits  # what its records' times may be (prepare's checks)
    steering: CommandApplier  # commands and steered jobs


class InMemoryWorker:
    """Runs the registry's handlers for its queues from the in-memory log."""

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry,
        log: MemoryLog,
        *,
        clock: Callable[[], int],
        rng: random.Random,
        metrics: Metrics,
        queues: Sequence[str] | None = None,
    ) -> None:
        self._log = log
        self._clock = clock
        self._rng = rng
        self._metrics = metrics
        self._tracer = JobTracer()
        self._loop = HandlerLoop()
        self._current: Delivery | None = None  # the attempt running now
        self._follow_ups: tuple[FollowUp, ...] = ()  # the last successful attempt's
        self.hooks = MemoryHooks(registry.hooks, metrics=metrics, loop=self._loop.loop)
        self._queues: dict[str, _Queue] = {}
        self._feeds: dict[tuple[str, int], PartitionFeed] = {}
        self._stores: dict[tuple[str, int], MemoryKeyStore] = {}
        self._read: dict[str, int] = {}  # topic -> records read
        self._heap: list[tuple[int, int, Delivery]] = []
        self._seq = itertools.count()
        self._overlap = OverlapGuard()
        self._asked = None if queues is None else list(queues)
        self.configure(settings, registry)

    @property
    def queues(self) -> list[str]:
        """The queues this worker consumes."""
        return list(self._queues)

    def configure(self, settings: Settings, registry: TaskRegistry) -> None:
        """Take the settings and registry as they are now: consume the queues
        ``dueflow worker`` would consume with them (a queue left is read again from
        its start if it comes back, as a partition assigned anew)."""
        selected = select_queues(settings, registry, self._asked)
        self._settings = settings
        self._registry = registry
        self._names = names(settings)
        for queue in self._queues.values():  # their follow-ups may name new queues
            queue.planner.configure(settings, registry.declared_queues)
        for name in [q for q in self._queues if q not in selected]:
            self._drop_queue(name)
        for name in selected:
            if name not in self._queues:
                self._add_queue(settings.queue(name))

    def _drop_queue(self, name: str) -> None:
        queue = self._queues.pop(name)
        topics = {self._names.exec(name), self._names.idempotency(name), *queue.tiers}
        self._heap = [e for e in self._heap if e[2].feed.topic not in topics]
        heapq.heapify(self._heap)
        for topic in topics:
            self._read.pop(topic, None)
        for key in [k for k in self._feeds if k[0] in topics]:
            del self._feeds[key]
        for key in [k for k in self._stores if k[0] == name]:
            del self._stores[key]

    def _add_queue(self, spec: QueueSpec) -> None:
        n = self._names
        planner = FollowUpPlanner(
            self._settings,
            declared=self._registry.declared_queues,
            clock=self._clock,
            running=lambda d: d is self._current,
        )
        # ctx.progress: one delivery runs at a time and no cut happens while it runs,
        # so an attempt's newest value goes with its final outcome.
        reporter = ProgressReporter(
            queue=spec.name,
            outcomes_topic=self._names.outcomes,
            worker_id=WORKER_ID,
            interval_ms=self._settings.worker.progress_interval_ms,
            running_after_ms=0,
            budget=ProgressBudget(self._settings.worker.progress_max_per_s, now_ms=0),
            clock=lambda: float(self._clock()),
        )
        recorder = BatchRecorder(
            self._settings,
            spec,
            worker_id=WORKER_ID,
            metrics=self._metrics,
            tracer=self._tracer,
            rng=self._rng,
            follow_ups=planner,
            progress=reporter,
        )
        tiers = {n.retry(spec.name, t): t for t in spec.retry_tiers_ms}
        book = SteeringBook(
            spec.name, self._settings.worker.steering_grace(spec), memory_steering_stores()
        )
        pending_final = recorder.pending_final
        steering = CommandApplier(
            queue=spec.name,
            book=book,
            recorder=recorder,
            topics=n,
            placer=TimerPlacer(self._settings.wheel),
            worker_id=WORKER_ID,
            metrics=self._metrics,
            key_state=lambda feed, key: pending_final.get(key, feed.keys.get(key)),
        )
        recorder.steering = steering
        steering.groups.book.owns_all = True
        feeds = []
        for p in range(spec.partitions):
            book.attach(p)  # the only owner: its state is in memory from the start
            store = self._stores[(spec.name, p)] = MemoryKeyStore(spec.idempotency_retention_ms)
            for topic, tier in [(n.exec(spec.name), None), *tiers.items()]:
                feed = self._feeds[(topic, p)] = PartitionFeed(topic, p, tier, store, planner)
                feed.reporter = reporter
                feed.advance(FeedState.LOADING)  # the keys are in memory: loaded at once
                feed.advance(FeedState.LOADED)
                feeds.append(feed)
        limits = WireLimits(
            skew_ms=self._settings.worker.max_clock_skew_ms, tiers_ms=tuple(spec.retry_tiers_ms)
        )
        self._queues[spec.name] = _Queue(spec, recorder, feeds, tiers, planner, limits, steering)

    def close(self) -> None:
        self._loop.close()

    # ------------------------------------------------------------ reading
    def poll(self, now_ms: int) -> None:
        """Read what was written since the last poll: key states, then deliveries.
        Keys older than their queue's ``idempotency_retention_ms`` are forgotten, as
        the worker's stores (and the topic's retention) forget them."""
        n = self._names
        for store in self._stores.values():
            store.expire(now_ms)
        for name, queue in self._queues.items():
            for record in self._new(n.idempotency(name)):
                self._apply_key(record)
            for topic in (n.exec(name), *queue.tiers):
                for record in self._new(topic):
                    feed = self._feeds[(topic, record.partition())]
                    d = Delivery(feed, as_message(record), record.offset())
                    feed.tracker.add(record.offset())
                    if hdr.is_command(record.headers()):
                        self._apply_command(queue, d, now_ms)
                        continue
                    due = int_or(hdr.header(record.headers(), hdr.DUE), 0)
                    heapq.heappush(self._heap, (due, next(self._seq), d))

    def _new(self, topic: str) -> list[MemoryRecord]:
        records = self._log.read(topic, self._read.get(topic, 0))
        self._read[topic] = self._read.get(topic, 0) + len(records)
        return records

    def _apply_key(self, record: MemoryRecord) -> None:
        """What the key tail does with a record of the idempotency topic."""
        store = self._stores.get((self._queue_of_idempotency(record.topic()), record.partition()))
        key = record.key()
        if store is None or key is None:
            return
        value = record.value()
        if value is None:  # a tombstone forgets the key (a redrive clears `dead`)
            store.apply([(key, None, 0)], None)
            return
        about = reschedule.key_of(key)
        if about is not None:  # a reschedule of key `about`
            try:
                _state, at_ms, due_ms = decode_key_record(
                    value, hdr.header(record.headers(), hdr.SCHEMA)
                )
            except UndecodableRecord:
                return  # the real tail quarantines it
            if due_ms is not None:
                store.reschedule([(about, due_ms, at_ms)])
            return
        known = store.get(key)
        if known is not None and is_final(known):
            return  # final already (most often: this worker's own record read back)
        try:
            state, at_ms, attempts = decode_key_state(
                value, hdr.header(record.headers(), hdr.SCHEMA)
            )
        except UndecodableRecord:
            return  # the real tail quarantines it
        store.apply([(key, state_of(state, attempts), at_ms)], None)

    def _apply_command(self, queue: _Queue, d: Delivery, now_ms: int) -> None:
        """A command, applied as soon as it is read (the real worker applies it when it
        reaches the head of its partition: here nothing is ahead of it for long)."""
        prepare(d, self._registry, now_ms=now_ms, limits=queue.limits)
        running = () if self._current is None else (self._current.key,)
        queue.steering.command(d, now_ms, running=running)  # not a command: ignored
        d.feed.tracker.finish(d.offset)
        cut = queue.recorder.cut(queue.feeds)
        if cut is not None:
            batch, finals, marks = cut
            for _feed, topic, partition, key, value, headers in batch.records:
                self._log.append(topic, key, value, headers, partition if partition >= 0 else None)
            queue.recorder.committed(finals, marks)
        queue.recorder.flush_metrics()

    def _queue_of_idempotency(self, topic: str) -> str:
        return topic[len(self._names.idempotency("")) :]

    # ------------------------------------------------------------ running
    def next_due(self) -> int | None:
        """The earliest "not before" of a delivery not taken yet, or None."""
        return self._heap[0][0] if self._heap else None

    def pending(self) -> list[PendingJob]:
        """Deliveries not taken yet, by "not before"."""
        out = []
        for due, _, d in sorted(self._heap, key=lambda e: (e[0], e[1])):
            h = dict(d.msg.headers() or [])
            out.append(
                PendingJob(
                    job_id=_text(h.get(hdr.JOB_ID)),
                    task=_text(h.get(hdr.TASK)),
                    queue=_text(h.get(hdr.QUEUE)),
                    due_ms=due,
                    where="exec" if d.feed.tier_ms is None else "retry",
                    attempt=max(1, int_or(h.get(hdr.ATTEMPT), 1)),
                    topic=d.feed.topic,
                    cron=h.get(hdr.KIND) == hdr.KIND_CRON.encode(),
                    schedule_id=_text(h.get(hdr.SCHEDULE)) or None,
                )
            )
        return out

    def run_next(self, now_ms: int, *, ignore_due: bool = False) -> JobRun | None:
        """Decide the earliest delivery due at ``now_ms`` (any, with ``ignore_due``)."""
        while self._heap and (self._heap[0][0] <= now_ms or ignore_due):
            not_before, _, d = heapq.heappop(self._heap)
            run = self._decide(d, not_before, now_ms, eager=ignore_due)
            if run is not None:
                return run
        return None

    def _decide(self, d: Delivery, not_before: int, now_ms: int, *, eager: bool) -> JobRun | None:
        """The worker's dispatch and start of one delivery, synchronously:
        :func:`~dueflow.consumers.decision.decide`'s verdict, carried out as the
        worker does (``eager``: run before its due time, so its times are checked
        for their ranges only, not against the clock). None when it is not due yet
        (held: back in the heap at its "not before")."""
        queue = self._queues[self._queue_of(d.feed.topic)]
        recorder = queue.recorder
        prepare(d, self._registry, now_ms=now_ms, limits=_EAGER_LIMITS if eager else queue.limits)
        if d.task is not None and d.fields is not None:  # also for a delivery that is skipped
            d.max_attempts = attempt_limits(d.task, d.fields, self._settings.worker)[0]
        if eager:
            d.not_before = min(d.not_before, now_ms)  # eager: its due time is not waited for
        while True:
            verdict = decide(
                d,
                store=d.feed.keys,
                pending=recorder.pending_final,
                running=_NOTHING_RUNS,
                occurrences=self._overlap,
                now_ms=now_ms,
                steering=queue.steering.book,
            )
            if verdict.kind is not Kind.RECHECK:
                break
            # A redriven record whose key is final: the worker waits until its key
            # store has read that far. Here the store has read every key record
            # written before this delivery (poll): it is up to date, decide again.
            d.rechecked = True
        kind = verdict.kind
        if kind is Kind.HOLD:  # not due yet: the worker holds its partition until then
            heapq.heappush(self._heap, (verdict.until_ms, next(self._seq), d))
            return None
        if kind is Kind.RUN:
            return self._attempt(queue, d, not_before, now_ms)
        settle = SETTLE.get(kind)
        if settle is None:  # pragma: no cover - see _NEVER_HERE
            raise AssertionError(f"{verdict} in memory: {_NEVER_HERE.get(kind, kind)}")
        settle(queue.recorder, queue.steering, d, verdict, now_ms)
        failure = verdict.failure if kind is Kind.DEAD_LETTER else None
        return self._commit(queue, d, not_before, now_ms, now_ms, ran=False, failure=failure)

    def _attempt(self, queue: _Queue, d: Delivery, not_before: int, now_ms: int) -> JobRun:
        """A :attr:`~dueflow.consumers.decision.Kind.RUN`: the handler runs, and its end is
        recorded as the worker's ``_start`` and ``_record`` do."""
        recorder = queue.recorder
        task, fields = d.task, d.fields
        assert task is not None
        assert fields is not None
        d.max_attempts, timeout_s = attempt_limits(task, fields, self._settings.worker)
        source = (d.feed.topic, d.feed.partition, d.offset)
        ctx = TaskContext(fields, d.attempt, d.max_attempts, d.hmap, source, None, d)
        overlap = hdr.OVERLAP in d.hmap
        self._current = d
        if overlap:
            self._overlap.started(d)
        try:
            failure, seconds, returned = run_attempt(task, d.payload, ctx, timeout_s, self._loop)
        finally:
            self._current = None  # ended: a late ctx.schedule raises
            if overlap:
                self._overlap.finished(d)  # nothing waits: no occurrence is buffered here
        finished_ms = max(now_ms, self._clock())  # a handler may have moved the clock
        self._follow_ups = queue.planner.pending(d) if failure is None else ()
        if failure is None:
            recorder.succeeded(d, seconds, finished_ms, returned)
        else:
            recorder.failed(d, failure, seconds, finished_ms)
            retry = will_retry(
                permanent=failure.permanent, attempt=d.attempt, max_attempts=d.max_attempts
            )
            self.hooks.failed(
                TaskContext(fields, d.attempt, d.max_attempts, d.hmap, source), failure, retry
            )
        return self._commit(
            queue, d, not_before, now_ms, finished_ms, ran=True, failure=failure, seconds=seconds
        )

    def _queue_of(self, topic: str) -> str:
        for name, queue in self._queues.items():
            if topic == self._names.exec(name) or topic in queue.tiers:
                return name
        raise KeyError(topic)

    def _commit(
        self,
        queue: _Queue,
        d: Delivery,
        not_before: int,
        at_ms: int,
        finished_ms: int,
        *,
        ran: bool,
        failure: Failure | None = None,
        seconds: float = 0.0,
    ) -> JobRun:
        """What a commit does: the batch's records into the log, its keys final."""
        d.feed.tracker.finish(d.offset)
        recorder = queue.recorder
        cut = recorder.cut(queue.feeds)
        written: list[tuple[str, bytes | None, Any]] = []
        if cut is not None:
            batch, finals, marks = cut
            for _feed, topic, partition, key, value, headers in batch.records:
                self._log.append(topic, key, value, headers, partition if partition >= 0 else None)
                written.append((topic, value, headers))
            recorder.committed(finals, marks)
        recorder.flush_metrics()
        return self._run_of(
            queue, d, not_before, at_ms, finished_ms, ran, failure, seconds, written
        )

    def _run_of(
        self,
        queue: _Queue,
        d: Delivery,
        not_before: int,
        at_ms: int,
        finished_ms: int,
        ran: bool,
        failure: Failure | None,
        seconds: float,
        written: list[tuple[str, bytes | None, Any]],
    ) -> JobRun:
        n = self._names
        outcome: dict[str, Any] = {}
        retry_at = tier = reason = None
        for topic, value, headers in written:
            if topic == n.outcomes and value is not None and not outcome:
                # the job's own (a follow-up's `scheduled` outcome comes after it)
                version = codec.parse_schema_header(
                    hdr.header(headers, hdr.SCHEMA), expected="outcome"
                )
                outcome = codec.decode("outcome", value, writer_version=version)
            elif topic in queue.tiers:
                retry_at = int_or(hdr.header(headers, hdr.DUE), 0)
                tier = tier_label(queue.tiers[topic])
            elif topic == n.dlq(queue.spec.name) and value is not None:
                version = codec.parse_schema_header(
                    hdr.header(headers, hdr.SCHEMA), expected="dead_letter"
                )
                reason = codec.decode("dead_letter", value, writer_version=version)["reason"]
        fields = d.fields
        h = d.hmap
        return JobRun(
            job_id=str(fields[F_JOB_ID]) if fields else _text(h.get(hdr.JOB_ID)),
            task=str(fields[F_TASK]) if fields else _text(h.get(hdr.TASK)),
            queue=queue.spec.name,
            idempotency_key=str(fields[F_KEY]) if fields else d.key.decode("utf-8", "replace"),
            attempt=d.attempt,
            max_attempts=d.max_attempts,
            outcome=outcome.get("state", "dead"),
            ran=ran,
            due_ms=int(fields[F_DUE_MS]) if fields else None,
            not_before_ms=not_before,
            at_ms=at_ms,
            finished_ms=finished_ms,
            seconds=seconds,
            payload=d.payload,
            failure=failure,
            retry_at_ms=retry_at,
            retry_tier=tier,
            dead_reason=reason,
            schedule_id=fields[F_SCHEDULE_ID] if fields else None,
            source=(d.feed.topic, d.feed.partition, d.offset),
            follow_ups=self._follow_ups if ran and failure is None else (),
            result=decode_result(outcome.get("result")),
            result_error=outcome.get("result_error"),
        )


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "replace")


# ------------------------------------------------------------ verdicts
# A verdict that does not run the delivery is carried out by the worker's own
# table (dueflow.consumers.verdict_ends.SETTLE); the delivery is then finished
# and its batch committed (_commit).

# Verdicts the worker can give that never reach a delivery decided here, and why.
_NEVER_HERE = {
    # One delivery runs at a time and none runs while another is decided: no key
    # runs here (no replay waits), and no cron occurrence runs beside another (an
    # overlap policy always admits it, so none is buffered; SKIP_OCCURRENCE is
    # carried out above all the same).
    Kind.WAIT: "no attempt runs while a delivery is decided",
    Kind.BUFFER_OCCURRENCE: "no occurrence runs while a delivery is decided",
    # Commands are applied as soon as they are read (poll), never queued.
    Kind.COMMAND: "commands are applied when read",
}
_NOTHING_RUNS: frozenset[bytes] = frozenset()
