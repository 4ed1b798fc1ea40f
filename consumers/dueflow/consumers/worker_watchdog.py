"""The worker's side of the watchdog (:mod:`dueflow.consumers.watchdog`).

:class:`WorkerWatchdog` is the :class:`~dueflow.consumers.watchdog.WatchdogOwner`
of a :class:`~dueflow.consumers.worker_loop.Worker`: it makes the watchdog's
thread from ``worker.watchdog_*`` and ``worker.max_memory``, marks the loop's
turns for it, and answers what it reports. An async handler that blocks the
loop past its attempt's timeout has its attempt taken and recorded as timed
out from the watchdog's thread (:meth:`QueueRuntime.take_blocked`); a loop
still blocked ``worker.watchdog_restart_s`` later restarts the process (after
that record committed). Past ``worker.max_memory`` the worker stops as for
SIGTERM and restarts; at the hard ceiling it does so at once, abandoning its
jobs (:mod:`dueflow.consumers.restart`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable

from dueflow.byte_size import format_byte_size
from dueflow.config import Settings
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.failures import memory_failure
from dueflow.consumers.loop_watch import TICK_S, LoopWatch, Step
from dueflow.consumers.restart import ProcessRestart
from dueflow.consumers.runtime import QueueRuntime
from dueflow.consumers.watchdog import Act, Limits, Watchdog, process_rss
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics

_LOG = logging.getLogger("dueflow.worker")


class WorkerWatchdog:
    """What the worker does on the watchdog's reports (each on the watchdog's thread
    but :meth:`restart_for_memory` and :meth:`tick`, which run on the loop)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        runtimes: Callable[[], list[QueueRuntime]],
        stop: Callable[[], None],
        restart: ProcessRestart | None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._runtimes = runtimes
        self._stop = stop
        # How this process restarts itself (run_worker's; None: an embedded worker,
        # which reports what would restart it and carries on).
        self._restart = restart
        self.watch = LoopWatch()
        self.restart_reason: str | None = None  # why the worker stopped to restart
        self.abandon_at_stop = False  # the hard memory ceiling: no grace for jobs
        self.loop: asyncio.AbstractEventLoop | None = None
        self.executor: JobExecutor | None = None
        self._taking: list[concurrent.futures.Future[object]] = []  # watchdog commits

    def make(self) -> Watchdog | None:
        """The watchdog's thread (not started), or None when ``watchdog_interval_s`` is 0."""
        ws = self._settings.worker
        if not ws.watchdog_interval_s > 0:
            return None
        if ws.max_memory is not None and process_rss() is None:
            event(
                _LOG,
                "worker.max_memory is set, but this platform does not report the process's "
                "resident memory (/proc/self/statm): no memory limit",
                logging.WARNING,
                max_memory=ws.max_memory,
            )
        limits = Limits(
            interval_s=ws.watchdog_interval_s,
            stall_s=ws.watchdog_stall_s,
            restart_s=ws.watchdog_restart_s,
            max_memory=ws.max_memory,
            ceiling=ws.memory_ceiling,
        )
        return Watchdog(self.watch, limits, self, on_rss=self._metrics.worker_memory.set)

    async def tick(self) -> None:
        """Mark, every TICK_S, that the loop turns (the watchdog reads it)."""
        watch = self.watch
        while True:
            watch.turn()
            await asyncio.sleep(TICK_S)

    def loop_blocked(self, step: Step, blocked_s: float) -> None:
        """The watchdog's thread: ``step``'s handler blocks the loop past its deadline."""
        taken = None
        for runtime in self._runtimes():
            if runtime.owns(step.job):
                taken = runtime.take_blocked(step, self.watch, blocked_s)
                break
        if taken is None:
            # Ended meanwhile, or its partition is no longer ours: the loop reports
            # it as timed out when it comes back (it ended past its deadline).
            event(
                _LOG,
                "handler blocking the event loop",
                logging.ERROR,
                task=step.task,
                blocked_s=round(blocked_s, 3),
                timeout_s=step.timeout_s,
            )
            self._metrics.loop_blocked.labels("", step.task).inc()
            return
        self._taking = [t for t in self._taking if not t.done()] + [taken]

    def loop_stalled(self, blocked_s: float) -> None:
        """The watchdog's thread: the loop is blocked and no handler runs on it."""
        event(
            _LOG,
            "event loop blocked, not by a handler",
            logging.ERROR,
            blocked_s=round(blocked_s, 3),
            stall_s=self._settings.worker.watchdog_stall_s,
        )
        self._metrics.loop_blocked.labels("", "").inc()

    def memory_exceeded(self, act: Act, rss: int) -> None:
        """The watchdog's thread: resident memory reached max_memory or the ceiling."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.restart_for_memory, act is Act.CEILING, rss)

    def restart_for_memory(self, hard: bool, rss: int) -> None:
        """Stop as for SIGTERM and restart; ``hard``: at once, abandoning the jobs."""
        ws = self._settings.worker
        if self.restart_reason is not None and not hard:
            return
        limit = ws.memory_ceiling if hard else ws.max_memory
        assert limit is not None
        self.restart_reason = "memory_ceiling" if hard else "memory"
        executor = self.executor
        event(
            _LOG,
            "worker memory past its ceiling: abandoning its jobs and restarting"
            if hard
            else "worker memory past max_memory: finishing its jobs, then restarting",
            logging.ERROR if hard else logging.WARNING,
            rss_bytes=rss,
            rss=format_byte_size(rss),
            limit_bytes=limit,
            limit=format_byte_size(limit),
            in_flight=executor.in_flight if executor is not None else 0,
        )
        if hard and executor is not None:
            self.abandon_at_stop = True
            if executor.fail_alone(memory_failure(rss, limit)):
                event(_LOG, "the lone running attempt failed: the ceiling was passed in it")
            else:
                # No telling which one grew: they run again on the next owner.
                executor.abandon()
        self._stop()

    def restart_process(self, reason: str, blocked_s: float) -> None:
        """The watchdog's thread: the loop stays blocked (or the ceiling was passed and
        the loop did not act): restart now, after the blocked attempt's commit."""
        for taken in self._taking:
            with contextlib.suppress(Exception):
                taken.exception(timeout=60)  # its own deadline ends it before this
        what = (
            "event loop still blocked"
            if reason == "blocked_loop"
            else "memory still past its ceiling"
        )
        if self._restart is None:
            event(
                _LOG,
                f"{what}: this process should be restarted",
                logging.CRITICAL,
                reason=reason,
                blocked_s=round(blocked_s, 3),
            )
            return
        event(
            _LOG,
            f"{what}: restarting the worker process",
            logging.CRITICAL,
            reason=reason,
            blocked_s=round(blocked_s, 3),
            in_place=self._restart.in_place,
        )
        if not self._restart.counted_by_successor:
            self._metrics.worker_restarts.labels(reason).inc()
        if self.executor is not None:
            self.executor.kill_children_now()
        self._restart(reason)
