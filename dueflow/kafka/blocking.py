"""Blocking client calls that may never return, run where they cannot wedge a process.

librdkafka's transactional producer can block in ``send_offsets_to_transaction``
far past its timeout, even forever, once the broker that was the group
coordinator went away (librdkafka issues #5456 and #5511; the chaos suite
hits it with broker restarts). The call cannot be interrupted, so callers run
transactional calls on a :class:`DaemonThreadExecutor` and stop waiting after
a deadline (:func:`call_with_deadline`): the producer is then abandoned (never
touched again: destroying it would block too) and a new one is made. The
broker aborts an abandoned transaction after ``transaction.timeout.ms``; for
what a worker's abandoned transaction could do before that, see
``CommitLoop.abandon_producer`` (dueflow.consumers.commit_loop).

Unlike ``ThreadPoolExecutor``, whose threads the interpreter joins at exit,
a daemon thread stuck in such a call does not keep the process from exiting.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from dueflow.errors import KafkaOperationError

T = TypeVar("T")

_Work = tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
# Wedged clients, kept referenced for the life of the process: never destroyed.
_ABANDONED: list[Any] = []


class ClientWedged(KafkaOperationError):
    """A client call did not return in time: the client is abandoned, make a new one."""


class DaemonThreadExecutor(concurrent.futures.Executor):
    """One daemon thread that runs submitted calls in order."""

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[_Work | None] = SimpleQueue()
        self._shutdown = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _main(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            future, fn, args, kwargs = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop after the calls already submitted (``wait`` waits for them)."""
        if self._shutdown:
            return
        self._shutdown = True
        self._queue.put(None)
        if wait:
            self._thread.join()


def abandon(client: Any) -> None:
    """Never touch ``client`` again and never let it be destroyed: a wedged
    librdkafka client blocks in its destructor as well (the rule above)."""
    _ABANDONED.append(client)


def call_with_deadline(
    executor: DaemonThreadExecutor, timeout_s: float, fn: Callable[..., T], *args: Any
) -> T:
    """``fn(*args)`` on ``executor``; :class:`ClientWedged` when it has not returned
    within ``timeout_s`` (it keeps running on the abandoned thread)."""
    future = executor.submit(fn, *args)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        name = getattr(fn, "__name__", repr(fn))
        raise ClientWedged(f"{name} did not return within {timeout_s:.0f} s") from None
