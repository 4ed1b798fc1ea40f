"""Running attempts: start one, and add its records to the batch when it ends.

:class:`Attempts` starts an attempt once the dispatcher decided it runs (the
slot is taken only when nothing is left that can fail before the handler
runs), and when it ends, frees its key for the replays held behind it and
records its outcome in the batch. An attempt whose handler blocks the event
loop past its deadline is taken by the watchdog's thread and committed from
there (:meth:`Attempts.take_blocked`, :mod:`dueflow.consumers.taken`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.commit_loop import CommitLoop
from dueflow.consumers.context import TaskContext
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.failures import Failure, blocked_failure, failure_of
from dueflow.consumers.feeds import Delivery, attempt_limits, trace_id
from dueflow.consumers.hooks import HookRunner
from dueflow.consumers.intake import Intake
from dueflow.consumers.loop_watch import LoopWatch, Step
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.run_state import RunState
from dueflow.consumers.slots import Slots
from dueflow.consumers.spans import end_attempt, start_attempt
from dueflow.consumers.taken import commit_taken
from dueflow.kafka.blocking import ClientWedged
from dueflow.observability.logs import JOB_STARTED, event, job_event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.worker_codec import F_JOB_ID, F_TASK

_LOG = logging.getLogger("dueflow.worker")


class Attempts:
    """The queue's attempts from their start to their records in the batch."""

    def __init__(
        self,
        settings: Settings,
        queue: QueueSpec,
        *,
        life: RunState,
        intake: Intake,
        slots: Slots,
        executor: JobExecutor,
        recorder: BatchRecorder,
        commits: CommitLoop,
        running: dict[bytes, Delivery],
        overlap: OverlapGuard,
        metrics: Metrics,
        tracer: JobTracer,
        hooks: HookRunner | None,
        worker_id: str,
        stamp_now: Callable[[], int],
        schedule_pump: Callable[[], None],
        restart_soon: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._spec = queue
        self._queue = queue.name
        self._ws = settings.worker
        self._life = life
        self._intake = intake
        self._held = intake.held  # replays waiting for a running key (changed in place)
        self._slots = slots
        self._executor = executor
        self._batch = recorder
        self._commits = commits
        self._commit_soon = commits.soon
        self._running = running
        self._overlap = overlap
        self._metrics = metrics
        self._tracer = tracer
        self._tracing = tracer.enabled
        self._log_starts = settings.observability.job_log == "all"
        self._hooks = hooks if hooks is not None and hooks.has_failure_hooks else None
        self._worker_id = worker_id
        self._stamp_now = stamp_now
        self._schedule_pump = schedule_pump
        self._restart_soon = restart_soon
        self._loop = asyncio.get_running_loop()
        # Set when an attempt of a revoked partition ends (the revoke waits for them).
        self.inflight_changed = asyncio.Event()

    def start(self, d: Delivery) -> None:
        """Start an attempt of ``d``. Everything that reads the record comes first
        (it was checked by :func:`~dueflow.consumers.feeds.prepare`, and logging
        never raises): the slot is taken only when nothing is left that can fail
        before the handler runs."""
        feed = d.feed
        task = d.task
        fields = d.fields
        assert task is not None
        assert fields is not None
        d.max_attempts, timeout_s = attempt_limits(task, fields, self._ws)
        otel = None
        if self._tracing:
            d.span, otel = start_attempt(
                self._tracer,
                headers=d.msg.headers(),
                attempt=d.attempt,
                job_id=fields[F_JOB_ID],
                queue=self._queue,
                task=fields[F_TASK],
            )
        if self._log_starts and _LOG.isEnabledFor(logging.INFO):
            job_event(
                _LOG,
                JOB_STARTED,
                job_id=fields[F_JOB_ID],
                queue=self._queue,
                task=fields[F_TASK],
                attempt=d.attempt,
                trace_id=trace_id(d),
                max_attempts=d.max_attempts,
            )
        source = (feed.topic, feed.partition, d.offset)
        ctx = TaskContext(fields, d.attempt, d.max_attempts, d.hmap, source, otel, d)
        self._slots.free -= 1
        feed.inflight += 1
        self._running[d.key] = d
        if hdr.OVERLAP in d.hmap:
            self._overlap.started(d)
        ended = False

        def finished(d: Delivery, failure: Failure | None, seconds: float, returned: Any) -> None:
            nonlocal ended
            ended = True
            self._finished(d, failure, seconds, returned)

        try:
            self._executor.run(d, task, d.payload, ctx, timeout_s, finished)
        except Exception as exc:
            if ended:
                raise  # it ended already: the error is in what its end wrote
            self._finished(d, failure_of(exc), 0.0, None)  # it could not start: a failed attempt

    def _finished(
        self, d: Delivery, failure: Failure | None, seconds: float, returned: Any
    ) -> None:
        """An attempt ended (maybe synchronously inside :meth:`start`); ``returned``:
        what its handler returned."""
        self._slots.release()
        d.feed.inflight -= 1
        taken = d.taken
        if taken is not None and not taken.done():
            # The watchdog is committing it from its own thread: its key stays
            # running (replays wait) until the loop knows how that went.
            taken.add_done_callback(
                lambda _f: self._call_threadsafe(self._attempt_over, d, failure, seconds)
            )
            return
        self._attempt_over(d, failure, seconds, returned)

    def _attempt_over(
        self, d: Delivery, failure: Failure | None, seconds: float, returned: Any = None
    ) -> None:
        key = d.key
        if self._running.get(key) is d:
            del self._running[key]
        if hdr.OVERLAP in d.hmap:
            waited = self._overlap.finished(d)
            if waited is not None:  # buffer_one: the occurrence that waited for this one
                self._requeue([waited])
        held = self._held.pop(key, None)
        if held:
            # Records of the same key waiting for this attempt: maybe read again
            # from a later assignment of the same partition (this attempt's feed
            # is gone then): decide them now, whatever became of this one.
            self._requeue(held)
        if d.taken is not None:
            self._settle_taken(d, failure, seconds)  # the watchdog recorded it
        else:
            self._record(d, failure, seconds, returned)

    def _requeue(self, held: list[Delivery]) -> None:
        self._intake.requeue(held)
        self._schedule_pump()

    def _record(
        self, d: Delivery, failure: Failure | None, seconds: float, returned: Any = None
    ) -> None:
        """Add a finished attempt's records to the batch (``returned``: what its
        handler returned, when it succeeded)."""
        feed = d.feed
        if feed.gone:
            # Abandoned (revoked after the grace period, lost, restarting):
            # nothing is written; the record is read again from the committed
            # offset by whoever owns the partition now.
            self._batch.drop_follow_ups(d)
            return
        now_ms = self._stamp_now()  # a retry's "not before" counts from here
        if failure is None:
            self._batch.succeeded(d, seconds, now_ms, returned)
        else:
            self._batch.failed(d, failure, seconds, now_ms)
            if self._hooks is not None:
                self._hooks.attempt_failed(d, failure)
        if d.span is not None:
            end_attempt(d.span, failure)
        feed.tracker.finish(d.offset)
        if feed.revoked:
            self.inflight_changed.set()
        if self._batch.full():  # commit now; nothing more starts until it is cut
            self._commit_soon.set()

    def _call_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting
            self._loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------------ blocked loop

    def take_blocked(
        self, step: Step, watch: LoopWatch, blocked_s: float
    ) -> concurrent.futures.Future[Any] | None:
        """Record the attempt of ``step``, whose handler blocks the event loop past its
        deadline, as timed out; called on the watchdog's thread, never on the loop.

        The attempt is claimed from the loop first (:meth:`LoopWatch.claim`): from
        then on the loop writes nothing for it, whatever the handler returns. Its
        records commit from here (:func:`~dueflow.consumers.taken.commit_taken`);
        the loop settles the rest when the handler gives it back
        (:meth:`_settle_taken`). Returns the commit's future (the final key states
        when committed, None when not, :class:`ClientWedged` when not known), or
        None when the attempt could not be taken.
        """
        d = step.job
        commits = self._commits
        committer = commits.committer
        if committer is None or self._life.restarting or self._life.closed or d.feed.gone:
            return None
        taken: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def attach() -> None:
            d.taken = taken

        if not watch.claim(step, attach):
            return None  # the step ended meanwhile: the loop reports it
        fields = d.fields or ()
        event(
            _LOG,
            "handler blocking the event loop: attempt recorded as timed out",
            logging.ERROR,
            queue=self._queue,
            task=step.task,
            job_id=fields[F_JOB_ID] if fields else None,
            attempt=d.attempt,
            blocked_s=round(blocked_s, 3),
            timeout_s=step.timeout_s,
        )
        self._metrics.loop_blocked.labels(self._queue, step.task).inc()
        recorder = BatchRecorder(
            self._settings,
            self._spec,
            worker_id=self._worker_id,
            metrics=self._metrics,
            tracer=self._tracer,
            rng=random.Random(),
        )
        try:
            finals = commit_taken(
                d,
                blocked_failure(step.timeout_s, blocked_s),
                blocked_s,
                recorder=recorder,
                committer=committer,
                txn_thread=commits.txn_thread,
                now_ms=self._stamp_now(),
                commit_window_s=commits.window_s,
                deadline_s=commits.deadline_s,
            )
        except ClientWedged as exc:
            event(_LOG, str(exc), logging.ERROR, queue=self._queue, task=step.task)
            taken.set_exception(exc)
            self._call_threadsafe(self._taken_wedged)
            return taken
        except Exception as exc:  # CommitFailed, or a transaction thread shut down
            self._metrics.worker_transactions.labels(self._queue, "failed").inc()
            event(
                _LOG,
                "blocked attempt not committed: the loop records it when it comes back",
                logging.WARNING,
                queue=self._queue,
                task=step.task,
                error=str(exc),
            )
            taken.set_result(None)
            return taken
        self._metrics.worker_transactions.labels(self._queue, "committed").inc()
        taken.set_result(finals)
        return taken

    def _settle_taken(self, d: Delivery, failure: Failure | None, seconds: float) -> None:
        """The loop's side of an attempt the watchdog took (on the loop, after the
        handler gave control back and the watchdog's commit ended)."""
        taken = d.taken
        try:
            finals = taken.result()
        except ClientWedged:
            return  # not known whether it committed: the queue starts over (_taken_wedged)
        if finals is None:  # not committed: record it the usual way
            self._record(d, failure or blocked_failure(0.0, seconds), seconds)
            return
        feed = d.feed
        if feed.gone:
            return
        self._batch.drop_follow_ups(d)
        self._batch.committed(finals, [])  # the key store knows the final state now
        if d.span is not None:
            end_attempt(d.span, failure)
        if self._hooks is not None and failure is not None:
            self._hooks.attempt_failed(d, failure)
        feed.tracker.finish(d.offset)
        if feed.revoked:
            self.inflight_changed.set()

    def _taken_wedged(self) -> None:
        """The watchdog's commit of a blocked attempt did not return: give the
        producer up and start over from the committed offsets, as for any wedge."""
        if self._commits.committer is not None:
            self._commits.abandon_producer()
        self._restart_soon("the blocked attempt's commit did not return")
