"""Sync handlers in child processes that can be killed (``isolation="process"``).

A small pool of spawned children per worker process. Each child imports the
handler by reference (``module:qualname``, so it must be a module-level
function), runs one job at a time and answers over a pipe; the event loop
watches the pipes, so no thread waits on a child. A child whose job
overruns its timeout is killed (SIGKILL) and replaced; a child that dies by
itself fails its job (retriable) and is replaced too. A job that succeeds
sends back the follow-ups its handler scheduled (``ctx.schedule``, see
:mod:`dueflow.consumers.follow_ups`) and its return value as JSON (the
worker applies the result cap); a failed one's are dropped in the child.
Progress (``ctx.progress``) is kept in the child as the newest value and sent
by a thread of the child at most every :data:`PROGRESS_EVERY_S` while the job
runs; the value not sent yet goes with the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from dueflow.consumers.failures import Failure
from dueflow.errors import DueflowError
from dueflow.records.job_result import Progress, to_json

# (failure or None, seconds, the follow-ups and the JobResult of a successful attempt)
Finished = Callable[[Failure | None, float, list[Any], Any], None]
# A progress value a child's handler reported.
Progressed = Callable[[Progress], None]

# How often a child sends its handler's newest progress value while the job runs.
PROGRESS_EVERY_S = 0.25


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    # @task returns the function itself; a registry may hold a wrapped one.
    return obj  # type: ignore[no-any-return]


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when its parent dies, even by kill -9 or os._exit."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _ChildProgress:
    """The child's side of ``ctx.progress``: the newest value, sent by a thread at
    most every :data:`PROGRESS_EVERY_S` (the handler's call does no I/O)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # one sender on the pipe at a time
        self._value: Progress | None = None
        self._running = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        with self._lock:
            self._value = None
            self._running = True

    def __call__(self, value: Progress) -> None:
        with self._lock:
            if not self._running:
                return  # a thread the handler left behind
            self._value = value
        if self._thread is None:
            self._thread = threading.Thread(target=self._send_loop, daemon=True)
            self._thread.start()

    def answer(self, reply: tuple[Any, ...]) -> None:
        """Send the job's answer with the value not sent yet; the job has ended."""
        with self._lock:
            self._running = False
            value, self._value = self._value, None
            self._conn.send((*reply, value))

    def _send_loop(self) -> None:
        while True:
            self._wake.wait(PROGRESS_EVERY_S)
            with self._lock:
                value, self._value = self._value, None
                if value is not None and self._running:
                    try:
                        self._conn.send(("progress", value))
                    except (BrokenPipeError, OSError):
                        return


def _child_main(conn: Connection) -> None:
    """Run jobs sent by the parent until the pipe closes."""
    _die_with_parent()
    # The parent owns shutdown: a Ctrl-C in the terminal must not break a job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cache: dict[str, Callable[..., Any]] = {}
    progress = _ChildProgress(conn)
    while True:
        try:
            ref, payload, ctx = conn.recv()
        except (EOFError, OSError):
            return
        started = time.perf_counter()
        progress.begin()
        ctx.relay_progress(progress)
        try:
            fn = cache.get(ref)
            if fn is None:
                fn = cache[ref] = _resolve(ref)
            returned = fn(payload, ctx)
            follow_ups = ctx.end_attempt()
            result = None if returned is None else to_json(returned)
            reply: tuple[Any, ...] = ("ok", time.perf_counter() - started, follow_ups, result)
        except BaseException as exc:
            kind = type(exc)
            reply = (
                "error",
                time.perf_counter() - started,
                f"{kind.__module__}.{kind.__qualname__}",
                str(exc)[:2_000],
                "".join(traceback.format_exception(exc))[-16_000:],
                isinstance(exc, DueflowError) and not exc.retriable,
            )
        try:
            progress.answer(reply)
        except (BrokenPipeError, OSError):
            return


class _Child:
    __slots__ = ("conn", "finished", "job", "process", "progressed")

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.job: Any = None
        self.finished: Finished | None = None
        self.progressed: Progressed | None = None


class ChildPool:
    """Up to ``size`` children; children start on first use."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[_Child] = []
        self._busy: dict[Any, _Child] = {}
        self._queue: deque[tuple[Any, str, Any, Any, Finished, Progressed | None]] = deque()
        self._count = 0
        self._closed = False

    def submit(
        self,
        job: Any,
        ref: str,
        payload: Any,
        ctx: Any,
        finished: Finished,
        progressed: Progressed | None = None,
    ) -> None:
        """Run ``job`` in a child: ``finished`` once; ``progressed`` with each progress
        value the child sends while the job runs."""
        self._queue.append((job, ref, payload, ctx, finished, progressed))
        self._dispatch()

    def kill(self, job: Any) -> None:
        """Kill the child running ``job`` (or drop the job if it has not started)."""
        child = self._busy.pop(job, None)
        if child is None:
            self._queue = deque(q for q in self._queue if q[0] is not job)
            return
        self._retire(child)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and not self._closed:
            if not self._idle:
                if self._count >= self._size:
                    return
                self._idle.append(self._start_child())
            job, ref, payload, ctx, finished, progressed = self._queue.popleft()
            child = self._idle.pop()
            child.job, child.finished, child.progressed = job, finished, progressed
            self._busy[job] = child
            try:
                child.conn.send((ref, payload, ctx))
            except Exception as exc:  # unpicklable payload or a dead child
                self._busy.pop(job, None)
                self._retire(child)
                finished(
                    Failure(type(exc).__qualname__, f"could not hand the job to a child: {exc}"),
                    0.0,
                    [],
                    None,
                )

    def _start_child(self) -> _Child:
        parent, child_end = self._ctx.Pipe()
        process = self._ctx.Process(target=_child_main, args=(child_end,), daemon=True)
        process.start()
        child_end.close()
        self._count += 1
        child = _Child(process, parent)
        asyncio.get_running_loop().add_reader(parent.fileno(), self._readable, child)
        return child

    def _readable(self, child: _Child) -> None:
        try:
            reply = child.conn.recv()
        except (EOFError, OSError):
            reply = None
        progressed = child.progressed
        if reply is not None and reply[0] == "progress":  # the job runs on
            if progressed is not None and child.job is not None:
                progressed(reply[1])
            return
        job, finished = child.job, child.finished
        if job is not None:
            self._busy.pop(job, None)
        child.job = child.finished = child.progressed = None
        if reply is None:  # the child died by itself
            self._retire(child)
            if finished is not None:
                finished(
                    Failure("ChildProcessError", "the handler's child process died"), 0.0, [], None
                )
        else:
            self._idle.append(child)
            last = reply[-1]  # the progress value not sent before the answer
            if last is not None and progressed is not None:
                progressed(last)
            if finished is not None:
                if reply[0] == "ok":
                    finished(None, reply[1], reply[2], reply[3])
                else:
                    _, seconds, error_type, message, tb, permanent, _last = reply
                    finished(Failure(error_type, message, tb, permanent), seconds, [], None)
        self._dispatch()

    def _retire(self, child: _Child) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(child.conn.fileno())
        with contextlib.suppress(Exception):
            child.process.kill()
        with contextlib.suppress(Exception):
            child.conn.close()
        with contextlib.suppress(Exception):
            child.process.join(timeout=5)
        if child in self._idle:
            self._idle.remove(child)
        self._count -= 1

    def kill_now(self) -> None:
        """SIGKILL every child (any thread: the process is about to restart)."""
        for child in [*self._idle, *self._busy.values()]:
            with contextlib.suppress(Exception):
                child.process.kill()

    async def close(self) -> None:
        self._closed = True
        for child in [*self._idle, *self._busy.values()]:
            self._retire(child)
        self._idle.clear()
        self._busy.clear()
        self._queue.clear()
