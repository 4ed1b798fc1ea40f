"""One-shot deadlines (expires / max_lateness): the rule the worker applies at start."""

from __future__ import annotations

import pytest

from dueflow.errors import InvalidInput
from dueflow.rules.deadline import expired, job_deadline, moved_deadline
from dueflow.rules.wire_bounds import MAX_DUE_MS

DUE = 1_900_000_000_000


@pytest.mark.parametrize(
    ("expires", "lateness", "deadline"),
    [
        (None, None, None),
        (DUE + 60_000, None, DUE + 60_000),
        (None, 300_000, DUE + 300_000),
        (DUE + 60_000, 300_000, DUE + 60_000),  # both: the earlier
        (DUE + 900_000, 300_000, DUE + 300_000),
        (DUE, None, DUE),  # it may start exactly at its due time
        (None, 0, DUE),
    ],
)
def test_the_deadline(expires: int | None, lateness: int | None, deadline: int | None) -> None:
    assert job_deadline(due_ms=DUE, expires_ms=expires, max_lateness_ms=lateness) == deadline


def test_a_deadline_before_the_due_time_is_refused() -> None:
    with pytest.raises(InvalidInput) as info:
        job_deadline(due_ms=DUE, expires_ms=DUE - 1, max_lateness_ms=None)
    assert info.value.field == "expires"
    assert "at or after the job's due time" in str(info.value)


@pytest.mark.parametrize(
    ("deadline", "attempt", "now", "skip"),
    [
        (None, 1, DUE + 10**9, False),  # no deadline
        (DUE + 5, 1, DUE + 5, False),  # at the deadline it still starts
        (DUE + 5, 1, DUE + 6, True),
        (DUE + 5, 2, DUE + 6, False),  # a retry of a job that started runs
    ],
)
def test_expired_at_start(deadline: int | None, attempt: int, now: int, skip: bool) -> None:
    assert expired(deadline, attempt=attempt, now_ms=now) is skip


def test_a_reschedule_keeps_the_window() -> None:
    assert moved_deadline(DUE + 60_000, old_due_ms=DUE, new_due_ms=DUE + 3_600_000) == (
        DUE + 3_660_000
    )


def test_a_deadline_past_the_last_time_is_the_last_time() -> None:
    """A df-expires past 9999 would be out of range at the worker: the SDK writes the
    last time a deadline holds instead (no deadline in effect either way)."""
    assert job_deadline(due_ms=10, expires_ms=None, max_lateness_ms=10**18) == MAX_DUE_MS
    assert moved_deadline(MAX_DUE_MS, old_due_ms=0, new_due_ms=10**6) == MAX_DUE_MS
