"""``Scheduler.result``: a job's result once it has ended, looked up until a deadline.

:func:`settled` is the rule (pure): what a job's status means for a caller
that wants its result -- the value (``succeeded``), an exception
(``dead``: :class:`~dueflow.errors.JobFailed`; ``cancelled``:
:class:`~dueflow.errors.JobCancelled`; ``expired``/``skipped``:
:class:`~dueflow.errors.JobNotRun`; succeeded but its value was not kept:
:class:`~dueflow.errors.ResultNotKept`), or "not yet". :func:`wait_for_result`
and :func:`await_result` ask the client's job lookup (``Scheduler.status``'s)
again, more and more rarely (from :data:`POLL_FIRST_S` to :data:`POLL_MAX_S`),
until the job has ended or the time is up (:class:`~dueflow.errors.ResultTimeout`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dueflow.errors import (
    InvalidInput,
    JobCancelled,
    JobFailed,
    JobNotRun,
    ResultNotKept,
    ResultTimeout,
)
from dueflow.producers.results import JsonValue
from dueflow.rules.job_status import JobStatus

POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5
# The least time one lookup is given, even when the deadline is closer.
LOOKUP_MIN_S = 0.5

Lookup = Callable[[float], JobStatus | None]  # (time it may take) -> the job's status


def check_timeout(timeout: Any) -> float | None:
    """``timeout`` of ``result()``: seconds >= 0, or None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidInput("timeout", timeout, "seconds >= 0, or None (no limit)")
    if math.isinf(timeout):
        return None
    return float(timeout)


def settled(job_id: str, status: JobStatus | None) -> tuple[bool, JsonValue]:
    """``(True, result)`` when the job succeeded, ``(False, None)`` while it has not
    ended; raises when it ended without a result."""
    if status is None or not status.finished:
        return False, None
    state = status.state
    if state == "succeeded":
        if status.result is None and status.result_error is not None:
            raise ResultNotKept(job_id, status.result_error)
        return True, status.result
    if state == "dead":
        err = status.last_error or {}
        raise JobFailed(
            job_id,
            error_type=err.get("type"),
            error=err.get("message"),
            attempts=status.attempts,
        )
    if state == "cancelled":
        raise JobCancelled(job_id)
    raise JobNotRun(job_id, state)


def wait_for_result(
    job_id: str,
    lookup: Lookup,
    timeout_s: float | None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JsonValue:
    """The job's result, asking ``lookup`` until it has ended or ``timeout_s`` passed."""
    deadline = None if timeout_s is None else clock() + timeout_s
    delay = POLL_FIRST_S
    while True:
        left = _left(deadline, clock)
        status = lookup(max(left, LOOKUP_MIN_S))
        done, value = settled(job_id, status)
        if done:
            return value
        left = _left(deadline, clock)
        if left <= 0:
            assert timeout_s is not None
            raise ResultTimeout(job_id, _state(status), timeout_s)
        sleep(min(delay, left))
        delay = min(2 * delay, POLL_MAX_S)


async def await_result(
    job_id: str,
    lookup: Callable[[float], Awaitable[JobStatus | None]],
    timeout_s: float | None,
) -> JsonValue:
    """:func:`wait_for_result` for an event loop."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    delay = POLL_FIRST_S
    while True:
        left = _left(deadline, loop.time)
        status = await lookup(max(left, LOOKUP_MIN_S))
        done, value = settled(job_id, status)
        if done:
            return value
        left = _left(deadline, loop.time)
        if left <= 0:
            assert timeout_s is not None
            raise ResultTimeout(job_id, _state(status), timeout_s)
        await asyncio.sleep(min(delay, left))
        delay = min(2 * delay, POLL_MAX_S)


def _left(deadline: float | None, clock: Callable[[], float]) -> float:
    return math.inf if deadline is None else deadline - clock()


def _state(status: JobStatus | None) -> str:
    return "unknown" if status is None else status.state
