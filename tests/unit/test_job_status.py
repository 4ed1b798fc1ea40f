"""Where a job is, from its outcome records: the fold of Scheduler.status and `dueflow job`."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.apps.cli.status_cmd import UNKNOWN, render_job
from dueflow.rules.job_status import JobStatus, job_status

T = 1_900_000_000_000


def out(state: str, at: int, **extra: Any) -> tuple[int, dict[str, Any]]:
    rec: dict[str, Any] = {
        "job_id": "j",
        "queue": "default",
        "task": "send",
        "idempotency_key": "k",
        "state": state,
        "attempt": 0 if state in ("scheduled", "rescheduled", "cancelled") else 1,
        "at_ms": at,
        "due_ms": T + 60_000,
    }
    rec.update(extra)
    return 0, rec


@pytest.mark.parametrize(
    ("records", "state", "pending", "attempts", "last", "queues"),
    [
        # the client's `scheduled`: known, pending, with its due time
        ([out("scheduled", T)], "scheduled", True, 0, "scheduled", ("default",)),
        # a fast job: the worker's outcome lands before the client's `scheduled`
        (
            [out("succeeded", T + 5, worker="w"), out("scheduled", T + 9)],
            "succeeded",
            False,
            1,
            "scheduled",
            ("default",),
        ),
        (
            [out("scheduled", T), out("retrying", T + 1, worker="w", error="boom")],
            "retrying",
            False,
            1,
            "retrying",
            ("default",),
        ),
        # a duplicate delivery is counted, it does not change the state
        (
            [out("scheduled", T), out("succeeded", T + 1), out("duplicate", T + 2)],
            "succeeded",
            False,
            1,
            "duplicate",
            ("default",),
        ),
        # one id in two queues
        (
            [out("scheduled", T), out("scheduled", T + 1, queue="billing")],
            "scheduled",
            True,
            0,
            "scheduled",
            ("default", "billing"),
        ),
        (
            [out("scheduled", T), out("cancelled", T + 1)],
            "cancelled",
            False,
            0,
            "cancelled",
            ("default",),
        ),
    ],
)
def test_the_fold(
    records: list[tuple[int, dict[str, Any]]],
    state: str,
    pending: bool,
    attempts: int,
    last: str,
    queues: tuple[str, ...],
) -> None:
    got = job_status("j", [*records, out("succeeded", T, job_id="other")])
    assert got is not None
    assert (got.state, got.pending, got.attempts, got.last_outcome, got.queues) == (
        state,
        pending,
        attempts,
        last,
        queues,
    )
    assert got.due_ms == T + 60_000
    assert got.finished == (state in ("succeeded", "cancelled"))
    assert got.to_json()["due"] == "2030-03-17T17:47:40.000Z"


def test_no_outcome_is_none() -> None:
    assert job_status("j", [out("scheduled", T, job_id="other")]) is None


def test_the_last_error_and_history() -> None:
    got = job_status("j", [out("scheduled", T), out("retrying", T + 1, error="boom")])
    assert got is not None
    assert got.last_error is not None
    assert got.last_error["message"] == "boom"
    assert got.history == (("scheduled", 0, T), ("retrying", 1, T + 1))
    assert JobStatus.from_view(got.to_json() | {"history": got.to_json()["history"]}) == got


@pytest.mark.parametrize(
    ("now", "shown"),
    [
        (T, "(in 1m 0s)"),
        (T + 59_200, "(in 800ms)"),
        (T + 3 * 3_600_000, "(2h 59m ago)"),
    ],
)
def test_dueflow_job_shows_a_pending_job_with_its_due_time(now: int, shown: str) -> None:
    got = job_status("j", [out("scheduled", T)])
    assert got is not None
    text = render_job(got.to_json(), now_ms=now)
    assert "scheduled (pending: not started)" in text
    assert f"2030-03-17 17:47:40.000Z {shown}" in text
    assert "last outcome  scheduled (attempt 0) at 2030-03-17 17:46:40.000Z" in text


def test_the_unknown_line_says_what_it_means() -> None:
    assert "no such job" in UNKNOWN
    assert "scheduled_outcomes=False" in UNKNOWN
