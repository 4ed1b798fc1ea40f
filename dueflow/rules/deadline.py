"""One-shot deadlines: ``expires`` / ``max_lateness`` (pure).

A job scheduled with ``expires=T`` (an instant) or ``max_lateness=L`` (a
duration after its due time, jitter included) must start by its deadline
(the earlier of the two when both are given), or it does not run at all:
a report that is useless an hour late, a reminder after the meeting. The
deadline travels in the timer's ``df-expires`` header (epoch ms) to the exec
record; the value (the Job) is unchanged.

The worker decides when it would start the job: a first attempt whose
deadline has passed (``now > deadline``; at the deadline itself it still
runs) is not run, outcome ``expired``. Not dead-lettered (the caller asked
for it; there is nothing to redrive) and not marked final: a later job with
the same idempotency key still runs, and a replay of the expired delivery
expires again. The deadline is about starting: once attempt 1 has run, its
retries run whatever the time (Temporal's schedule-to-start; use the task's
``max_attempts`` and backoff to bound retries). The emitter does not drop
expired timers: a job can only expire on the worker, where "not started" is
known. A deadline before the due time is refused (the job could never run).
A reschedule keeps the job's window (deadline minus due time). A deadline
after 9999-12-31T23:59:59.999Z is that instant (the last a ``df-expires``
holds: docs/wire-format.md#accepted-ranges).
"""

from __future__ import annotations

from dueflow.errors import InvalidInput
from dueflow.rules.wire_bounds import MAX_DUE_MS
from dueflow.timeutil import format_utc


def job_deadline(*, due_ms: int, expires_ms: int | None, max_lateness_ms: int | None) -> int | None:
    """The deadline of a job due at ``due_ms``: the earlier of ``expires_ms`` and
    ``due_ms + max_lateness_ms``; None without either. :class:`InvalidInput` when it
    is before the due time."""
    deadline = None
    if max_lateness_ms is not None:
        deadline = due_ms + max_lateness_ms
    if expires_ms is not None:
        if expires_ms < due_ms:
            raise InvalidInput(
                "expires",
                format_utc(expires_ms),
                f"a time at or after the job's due time ({format_utc(due_ms)}): an earlier "
                "deadline would never let it run",
            )
        deadline = expires_ms if deadline is None else min(deadline, expires_ms)
    if deadline is not None and deadline > MAX_DUE_MS:
        return MAX_DUE_MS  # the last time a df-expires holds: no deadline in effect
    return deadline


def expired(deadline_ms: int | None, *, attempt: int, now_ms: int) -> bool:
    """True when a delivery must not start: attempt 1 after its deadline."""
    return deadline_ms is not None and attempt == 1 and now_ms > deadline_ms


def moved_deadline(deadline_ms: int, *, old_due_ms: int, new_due_ms: int) -> int:
    """A rescheduled job's deadline: the same window after its new due time (at most
    the last time a ``df-expires`` holds)."""
    return min(new_due_ms + max(0, deadline_ms - old_due_ms), MAX_DUE_MS)
