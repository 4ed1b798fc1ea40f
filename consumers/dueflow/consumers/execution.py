"""Running handlers with a hard timeout each.

- Async handlers run on the event loop. A handler is started eagerly: its
  first step runs at once, and one that finishes without awaiting anything
  (a no-op, a cache hit) costs no asyncio Task at all. One that awaits
  becomes a Task; at its deadline the Task is cancelled. An attempt that
  ends after its deadline (its handler blocked the loop, so nothing could
  cancel it) is a timeout whatever it returned. With a
  :class:`~dueflow.consumers.loop_watch.LoopWatch`, every step of a handler
  is marked, so the watchdog thread can name the attempt that blocks the
  loop and claim it (:mod:`dueflow.consumers.watchdog`).
- Sync handlers run on a pool of daemon threads. Python cannot kill a
  thread: a sync handler that overruns its deadline is reported as timed
  out, its job fails (and is retried) and its concurrency slot is freed at
  once, but the thread runs on until the handler returns by itself. Such a
  thread is "orphaned" (gauge ``dueflow_worker_orphaned_threads``); the
  pool starts a replacement so the pool never runs short of threads, and
  the late result is discarded. A process that collects more than
  ``worker.max_orphaned_threads`` of them stops with an error, so that a
  supervisor restarts it clean. Tasks declared with ``isolation="process"``
  run in child processes instead, and an overrunning child is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from queue import SimpleQueue
from typing import Any

from opentelemetry import context as otel_context

from dueflow.consumers.context import TaskContext
from dueflow.consumers.failures import Failure, blocked_failure, failure_of, timeout_failure
from dueflow.consumers.isolation import ChildPool
from dueflow.consumers.loop_watch import LoopWatch, Step
from dueflow.consumers.registry import RegisteredTask
from dueflow.observability.metrics import Metrics

# (job, failure or None, handler seconds, what the handler returned: None when it failed)
Done = Callable[[Any, Failure | None, float, Any], None]


class HandlerThreads:
    """Daemon threads for sync handlers: as many as needed, plus one per orphan.

    Daemon threads, so a handler stuck forever cannot keep the process from
    exiting after shutdown.
    """

    def __init__(self, size: int, *, name: str = "dueflow-handler") -> None:
        self._size = size
        self._name = name
        self._queue: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._orphans = 0
        self._closed = False

    @property
    def orphans(self) -> int:
        return self._orphans

    def submit(self, work: Callable[[], None]) -> None:
        self._queue.put(work)
        with self._lock:
            if self._threads < self._size + self._orphans:
                self._spawn()

    def orphaned(self) -> None:
        """A running handler was given up on: its thread is gone until it returns."""
        with self._lock:
            self._orphans += 1
            if self._threads < self._size + self._orphans:
                self._spawn()

    def returned(self) -> None:
        """An orphaned handler returned at last: its thread serves again."""
        with self._lock:
            self._orphans -= 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)

    def _spawn(self) -> None:
        self._threads += 1
        threading.Thread(
            target=self._serve, name=f"{self._name}-{self._threads}", daemon=True
        ).start()

    def _serve(self) -> None:
        queue = self._queue
        while True:
            work = queue.get()
            if work is None:
                return
            work()
            with self._lock:
                # An orphan came back while replacements run: one thread too many.
                if self._threads > self._size + self._orphans or self._closed:
                    self._threads -= 1
                    return


@types.coroutine
def _continue(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Drive ``coro`` on from its first suspension (what a Task would have seen)."""
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    return await _continue(coro, yielded)


class _Taken:
    """What a watched attempt's Task returns when the watchdog claimed it."""


_TAKEN = _Taken()


@types.coroutine
def _continue_watched(
    coro: Coroutine[Any, Any, Any], yielded: Any, step: Step, watch: LoopWatch
) -> Generator[Any, Any, Any]:
    """:func:`_continue`, with each step of the handler marked for the watchdog; ends
    with :data:`_TAKEN` (the coroutine closed) once the watchdog claimed the attempt."""
    while True:
        thrown: BaseException | None = None
        try:
            sent = yield yielded
        except BaseException as exc:
            thrown = exc
        watch.begin(step)
        try:
            yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
        except StopIteration as stop:
            return _TAKEN if watch.end(step) else stop.value
        except BaseException:
            if watch.end(step):
                return _TAKEN
            raise
        if watch.end(step):
            _close(coro)
            return _TAKEN


async def _resume_watched(
    coro: Coroutine[Any, Any, Any], yielded: Any, step: Step, watch: LoopWatch
) -> Any:
    return await _continue_watched(coro, yielded, step, watch)


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    """End a suspended handler whose attempt was taken (its ``finally`` blocks run)."""
    with contextlib.suppress(BaseException):  # one that awaits in its finally: RuntimeError
        coro.close()


def _context_with(otel: Any) -> contextvars.Context:
    """A copy of the current contextvars with ``otel`` as OpenTelemetry's context."""
    token = otel_context.attach(otel)
    try:
        return contextvars.copy_context()
    finally:
        otel_context.detach(token)


class _Running:
    __slots__ = ("deadline", "done", "handle", "kind", "started", "timeout_s")

    def __init__(
        self, kind: str, done: Done, deadline: float, timeout_s: float, started: float
    ) -> None:
        self.kind = kind
        self.done = done
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.started = started
        self.handle: Any = None


def _late(failure: Failure | None, seconds: float, timeout_s: float) -> Failure | None:
    """An attempt that ended after its deadline timed out, whatever it returned:
    nothing could cancel it because its handler held the loop."""
    if seconds > timeout_s:
        return blocked_failure(timeout_s, seconds)
    return failure


class JobExecutor:
    """Starts handlers and reports each attempt once: finished, failed or timed out."""

    def __init__(
        self,
        *,
        concurrency: int,
        metrics: Metrics,
        isolated_processes: int = 2,
        max_orphans: int = 256,
        on_fatal: Callable[[str], None] | None = None,
        watch: LoopWatch | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch = watch
        self._metrics = metrics
        self._threads = HandlerThreads(concurrency)
        self._children = ChildPool(isolated_processes)
        self._max_orphans = max_orphans
        self._on_fatal = on_fatal
        self._running: dict[Any, _Running] = {}
        self._changed = asyncio.Event()  # set when an attempt stops running
        self._completions: deque[tuple[Any, Failure | None, float, Any]] = deque()
        self._wake_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    @property
    def in_flight(self) -> int:
        """Attempts started and not yet reported."""
        return len(self._running)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no attempt runs, at most ``timeout_s``; True when idle."""
        deadline = self._loop.time() + timeout_s
        while self._running:
            left = deadline - self._loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return True

    @property
    def orphans(self) -> int:
        return self._threads.orphans

    def run(
        self,
        job: Any,
        task: RegisteredTask,
        payload: Any,
        ctx: TaskContext,
        timeout_s: float,
        done: Done,
    ) -> None:
        """Start ``task`` for ``job``; ``done(job, failure, seconds, returned)`` is called
        once, on the loop (``returned``: the handler's return value, None when it failed;
        a child process's is a :class:`~dueflow.records.job_result.JobResult`).

        ``done`` may be called before ``run`` returns (a handler that finished
        without suspending).
        """
        if task.is_async:
            self._run_async(job, task, payload, ctx, timeout_s, done)
        elif task.spec.isolation == "process":
            self._run_isolated(job, task, payload, ctx, timeout_s, done)
        else:
            self._run_thread(job, task, payload, ctx, timeout_s, done)

    # ------------------------------------------------------------------ async

    def _run_async(
        self,
        job: Any,
        task: RegisteredTask,
        payload: Any,
        ctx: TaskContext,
        timeout_s: float,
        done: Done,
    ) -> None:
        watch = self._watch
        step: Step | None = None
        started = time.perf_counter()
        if watch is not None:
            step = watch.step = Step(job, task.spec.name, started + timeout_s, timeout_s)
        # Traced: the handler's own spans nest under its attempt (the task made
        # below copies the attached context).
        token = otel_context.attach(ctx.otel_context) if ctx.otel_context is not None else None
        failure: Failure | None = None
        returned: Any = None
        try:
            coro = task.fn(payload, ctx)
            yielded = coro.send(None)
        except StopIteration as stop:
            returned = stop.value
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            failure = failure_of(exc)
        else:
            # Suspended: a Task drives it on from here.
            if step is not None and watch is not None and watch.end(step):
                _close(coro)
                seconds = time.perf_counter() - started
                done(job, blocked_failure(timeout_s, seconds), seconds, None)
                return
            running = self._track(job, "async", done, timeout_s, started)
            if step is not None and watch is not None:
                resume = _resume_watched(coro, yielded, step, watch)
            else:
                resume = _resume(coro, yielded)
            if ctx.otel_context is not None:
                handle = self._loop.create_task(resume, context=_context_with(ctx.otel_context))
            else:
                handle = self._loop.create_task(resume)
            running.handle = handle
            handle.add_done_callback(lambda t: self._async_finished(job, t))
            return
        finally:
            if token is not None:
                otel_context.detach(token)
        # Finished in its first step.
        seconds = time.perf_counter() - started
        if step is not None and watch is not None and watch.end(step):
            done(job, blocked_failure(timeout_s, seconds), seconds, None)
            return
        failure = _late(failure, seconds, timeout_s)
        done(job, failure, seconds, returned if failure is None else None)

    def _async_finished(self, job: Any, handle: asyncio.Task[Any]) -> None:
        running = self._running.pop(job, None)
        if running is None or running.handle is not handle:
            return  # timed out before: already reported
        failure: Failure | None = None
        returned: Any = None
        seconds = time.perf_counter() - running.started
        if handle.cancelled():
            failure = failure_of(asyncio.CancelledError("the handler was cancelled"))
        else:
            exc = handle.exception()
            if exc is not None:
                failure = failure_of(exc)
            else:
                returned = handle.result()
                if returned is _TAKEN:
                    failure = blocked_failure(running.timeout_s, seconds)
        self._changed.set()
        failure = _late(failure, seconds, running.timeout_s)
        running.done(job, failure, seconds, returned if failure is None else None)

    # ------------------------------------------------------------------ threads

    def _run_thread(
        self,
        job: Any,
        task: RegisteredTask,
        payload: Any,
        ctx: TaskContext,
        timeout_s: float,
        done: Done,
    ) -> None:
        fn = task.fn
        completions = self._completions
        started = time.perf_counter()
        self._track(job, "thread", done, timeout_s, started)

        otel = ctx.otel_context

        def work() -> None:
            t0 = time.perf_counter()
            failure: Failure | None = None
            returned: Any = None
            token = otel_context.attach(otel) if otel is not None else None
            try:
                returned = fn(payload, ctx)
            except BaseException as exc:
                failure = failure_of(exc)
            finally:
                if token is not None:
                    otel_context.detach(token)
            completions.append((job, failure, time.perf_counter() - t0, returned))
            if not self._wake_pending:
                self._wake_pending = True
                # RuntimeError: the loop is closed, the process is exiting.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._drain_completions)

        self._threads.submit(work)

    def _drain_completions(self) -> None:
        # Clear the flag first: a thread that appends after this schedules a new drain.
        self._wake_pending = False
        completions = self._completions
        running = self._running
        while completions:
            job, failure, seconds, returned = completions.popleft()
            entry = running.pop(job, None)
            if entry is None or entry.kind != "thread":
                # A handler that was given up on returned at last.
                self._threads.returned()
                self._metrics.orphaned_threads.set(self._threads.orphans)
                continue
            self._changed.set()
            entry.done(job, failure, seconds, returned)

    # ------------------------------------------------------------------ processes

    def _run_isolated(
        self,
        job: Any,
        task: RegisteredTask,
        payload: Any,
        ctx: TaskContext,
        timeout_s: float,
        done: Done,
    ) -> None:
        started = time.perf_counter()
        self._track(job, "process", done, timeout_s, started)

        def finished(
            failure: Failure | None, seconds: float, follow_ups: list[Any], returned: Any
        ) -> None:
            entry = self._running.pop(job, None)
            if entry is not None:
                if failure is None:
                    ctx.adopt_follow_ups(follow_ups)  # what the child's handler scheduled
                self._changed.set()
                entry.done(job, failure, seconds, returned)

        self._children.submit(job, task.ref, payload, ctx, finished, ctx.report_progress)

    # ------------------------------------------------------------------ timeouts

    def _track(self, job: Any, kind: str, done: Done, timeout_s: float, started: float) -> _Running:
        deadline = self._loop.time() + timeout_s
        running = _Running(kind, done, deadline, timeout_s, started)
        self._running[job] = running
        if deadline < self._timer_at:
            self._arm(deadline)
        return running

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = self._loop.time()
        expired = [(job, r) for job, r in self._running.items() if r.deadline <= now]
        for job, running in expired:
            del self._running[job]
            if running.kind == "async":
                running.handle.cancel()
            elif running.kind == "thread":
                self._threads.orphaned()
                self._metrics.orphaned_threads.set(self._threads.orphans)
            else:
                self._children.kill(job)
            running.done(job, timeout_failure(running.timeout_s), now - running.started, None)
        if expired:
            self._changed.set()
        if self._running:
            self._arm(min(r.deadline for r in self._running.values()))
        if self._threads.orphans > self._max_orphans and self._on_fatal is not None:
            self._on_fatal(
                f"{self._threads.orphans} handler threads are stuck in jobs that timed out "
                f"(limit worker.max_orphaned_threads={self._max_orphans}); "
                "declare such tasks with isolation='process'"
            )

    def fail_alone(self, failure: Failure) -> bool:
        """When exactly one attempt runs, end it with ``failure`` (as a timeout ends
        one) and return True; else change nothing (the hard memory ceiling: only a
        lone attempt can be told to be the cause)."""
        if len(self._running) != 1:
            return False
        job, running = next(iter(self._running.items()))
        del self._running[job]
        if running.kind == "async":
            running.handle.cancel()
        elif running.kind == "thread":
            self._threads.orphaned()
            self._metrics.orphaned_threads.set(self._threads.orphans)
        else:
            self._children.kill(job)
        self._changed.set()
        running.done(job, failure, time.perf_counter() - running.started, None)
        return True

    def kill_children_now(self) -> None:
        """SIGKILL the isolated handlers' children (any thread; before a restart)."""
        self._children.kill_now()

    def abandon(self) -> list[Any]:
        """Stop waiting for every running attempt (shutdown): cancel what can be cancelled."""
        jobs = list(self._running)
        for job in jobs:
            running = self._running.pop(job)
            if running.kind == "async":
                running.handle.cancel()
            elif running.kind == "process":
                self._children.kill(job)
            else:
                self._threads.orphaned()
        return jobs

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._threads.close()
        await self._children.close()
