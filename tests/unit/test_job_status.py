"""Where a job is, from its outcome records: the fold of Scheduler.status and `dueflow job`."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.apps.cli.status_render import UNKNOWN, render_job
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


def test_dueflow_job_shows_progress_and_the_result() -> None:
    running = job_status(
        "j",
        [
            out("scheduled", T),
            out("started", T + 1_000, attempt=1),
            out("started", T + 2_000, attempt=1, progress=0.4, progress_detail=b'{"rows":4}'),
        ],
    )
    assert running is not None
    assert running.running
    text = render_job(running.to_json(), now_ms=T)
    assert 'progress      40% {"rows":4} (attempt 1, 2030-03-17 17:46:42.000Z)' in text
    assert "result" not in text
    done = job_status(
        "j",
        [out("started", T, attempt=1), out("succeeded", T + 5, attempt=1, result=b"[1,2]")],
    )
    assert done is not None
    assert "result        [1,2]" in render_job(done.to_json(), now_ms=T)
    kept_not = job_status("j", [out("succeeded", T, attempt=1, result_error="too big")])
    assert kept_not is not None
    assert "result error  too big" in render_job(kept_not.to_json(), now_ms=T)


def test_dueflow_job_wait_is_seconds_up_to_a_minute_but_with_result(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dueflow.apps.cli.main import main

    assert main(["job", "j", "--wait", "61", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "with --result: >= 0" in capsys.readouterr().err
    assert main(["job", "j", "--result", "--wait", "-1", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "--wait" in capsys.readouterr().err
