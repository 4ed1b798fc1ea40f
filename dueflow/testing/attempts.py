"""One attempt of a handler, in this process, with a hard timeout (I/O edge).

As in the worker (:mod:`dueflow.consumers.execution`, whose thread pool this
uses): a sync handler runs on a pool thread; one that overruns its timeout
is reported as timed out at once and its thread is left to finish by itself
(Python cannot kill a thread), its late result discarded, while a new thread
serves the next jobs. An async handler runs on one event loop
kept for the pipeline's life (on a thread, so a test that is itself async
can call the pipeline); at its deadline it is cancelled. Timeouts are in real
seconds: the fake clock does not move while a handler runs.

``isolation="process"`` runs in-process here. What would make it fail in a
child process is checked first: the handler must be importable by its
reference (``module:qualname``, so a function defined inside a test fails
as it would on a worker) and the job must pickle.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Coroutine
from typing import Any

from dueflow.consumers.context import TaskContext
from dueflow.consumers.execution import HandlerThreads
from dueflow.consumers.failures import Failure, failure_of, timeout_failure
from dueflow.consumers.isolation import _resolve
from dueflow.consumers.registry import RegisteredTask
from dueflow.records.job_result import to_json

# An async handler that blocks its loop cannot be cancelled: given up this much
# after its deadline.
_STUCK_LOOP_S = 1.0


class HandlerLoop:
    """The event loop async handlers run on, on a daemon thread, started on first use;
    and the worker's pool of daemon threads for sync handlers (one, plus one for
    each handler still running after its timeout)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.threads = HandlerThreads(1, name="dueflow-testing-handler")

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="dueflow-testing-loop", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        self.threads.close()
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()


def run_attempt(
    task: RegisteredTask, payload: Any, ctx: TaskContext, timeout_s: float, loop: HandlerLoop
) -> tuple[Failure | None, float, Any]:
    """Run one attempt; ``(failure or None, seconds, what the handler returned)``."""
    if task.spec.isolation == "process":
        refused = _child_would_refuse(task, payload, ctx)
        if refused is not None:
            return refused, 0.0, None
    if task.is_async:
        return _run_async(task, payload, ctx, timeout_s, loop)
    return _run_thread(task, payload, ctx, timeout_s, loop.threads)


def _child_would_refuse(task: RegisteredTask, payload: Any, ctx: TaskContext) -> Failure | None:
    """What a child process would answer before running the handler, if not None."""
    try:
        pickle.dumps((task.ref, payload, ctx))
    except Exception as exc:  # what ChildPool reports when the pipe refuses the job
        return Failure(type(exc).__qualname__, f"could not hand the job to a child: {exc}")
    try:
        found = _resolve(task.ref)
    except Exception as exc:  # the child raises the same while looking it up
        return failure_of(exc)
    if found is not task.fn:
        return Failure(
            "ValueError",
            f"{task.ref} names another object than the registered handler: a child "
            "process would run that one (isolation='process' needs a module-level function)",
        )
    return None


def _run_thread(
    task: RegisteredTask, payload: Any, ctx: TaskContext, timeout_s: float, threads: HandlerThreads
) -> tuple[Failure | None, float, Any]:
    result: list[tuple[Failure | None, Any]] = []
    done = threading.Event()
    lock = threading.Lock()
    given_up = False
    started = time.perf_counter()

    def work() -> None:
        returned: Any = None
        try:
            returned = task.fn(payload, ctx)
        except BaseException as exc:  # reported, like the worker's threads do
            failure: Failure | None = failure_of(exc)
        else:
            failure = None
        if task.spec.isolation == "process" and failure is None and returned is not None:
            returned = to_json(returned)  # a child process answers with JSON
        with lock:
            result.append((failure, returned))
            late = given_up
        done.set()
        if late:  # the thread serves again
            threads.returned()

    threads.submit(work)
    finished = done.wait(timeout_s)
    with lock:
        if not finished and not result:  # still running: given up, its result discarded
            given_up = True
    seconds = time.perf_counter() - started
    if given_up:
        threads.orphaned()
        return timeout_failure(timeout_s), seconds, None
    return result[0][0], seconds, result[0][1]


def _run_async(
    task: RegisteredTask, payload: Any, ctx: TaskContext, timeout_s: float, loop: HandlerLoop
) -> tuple[Failure | None, float, Any]:
    started = time.perf_counter()
    coro: Coroutine[Any, Any, Any] = task.fn(payload, ctx)
    future = asyncio.run_coroutine_threadsafe(_with_deadline(coro, timeout_s), loop.loop())
    returned: Any = None
    try:
        failure, returned = future.result(timeout_s + _STUCK_LOOP_S)
    except TimeoutError:  # the handler blocks the loop: it cannot even be cancelled
        future.cancel()
        failure = timeout_failure(timeout_s)
    return failure, time.perf_counter() - started, returned


async def _with_deadline(
    coro: Coroutine[Any, Any, Any], timeout_s: float
) -> tuple[Failure | None, Any]:
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            returned = await coro
    except TimeoutError as exc:
        if deadline.expired():
            return timeout_failure(timeout_s), None
        return failure_of(exc), None  # the handler's own TimeoutError
    except BaseException as exc:  # CancelledError too: the worker reports it as a failure
        return failure_of(exc), None
    return None, returned
