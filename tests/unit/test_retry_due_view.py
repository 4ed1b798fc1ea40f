"""When a retrying job's next attempt is due, as the status view, the console's job
page, ``Scheduler.status`` and ``dueflow job`` show it (pure, no broker).

A worker's ``retrying`` outcome carries the retry's due time in its
``df-next-due`` header; a worker of the release before writes none, and then
nothing is shown rather than a guess.
"""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.apps.cli.status_render import render_job
from dueflow.rules import job_state as state
from dueflow.rules.job_status import JobStatus
from dueflow.streams.status.job_timeline import RETRY_DUE, attempts, job_page, timeline
from tests.unit.test_status_state import o as outcome

DUE = 1_900_000_000_000
RETRY_AT = DUE + 600  # the failed attempt's end
NEXT = RETRY_AT + 5_000  # its retry's due time


def o(state_: str, at: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    """An outcome of the job (due at ``DUE``)."""
    return outcome(state_, at, attempt, due_ms=DUE, **extra)


def failed_once(next_due: bytes | None) -> dict[str, Any]:
    """The view of a job whose first attempt failed; ``next_due``: the raw
    ``df-next-due`` header of its ``retrying`` outcome (None: a worker that writes none)."""
    view = state.apply_outcome(None, o("scheduled", DUE - 10_000), partition=1)
    return state.apply_outcome(
        view,
        o("retrying", RETRY_AT, 1, worker="w1", duration_ms=100.0, error_type="E", error="x"),
        partition=1,
        fired_ms=DUE + 2,
        next_due_ms=state.header_ms(next_due),
    )


def test_a_retrying_job_shows_when_its_next_attempt_is_due() -> None:
    view = failed_once(str(NEXT).encode())
    assert view["state"] == "retrying"
    assert view["next_due_ms"] == NEXT
    assert view["due_ms"] == DUE  # the job's own due time stays
    assert view["history"][-1] == [
        "retrying",
        1,
        RETRY_AT,
        {
            "next_due_ms": NEXT,
            "worker": "w1",
            "duration_ms": 100.0,
            "error_type": "E",
            "error": "x",
        },
    ]


def test_a_retrying_outcome_without_the_header_invents_no_due_time() -> None:
    """A worker of the release before: its outcome's due_ms is the failed attempt's."""
    view = failed_once(None)
    assert view["state"] == "retrying"
    assert "next_due_ms" not in view
    assert view["due_ms"] == DUE
    assert "next_due_ms" not in view["history"][-1][3]
    events = timeline(view)
    assert RETRY_DUE not in [e["state"] for e in events]
    assert "retry_due_ms" not in attempts(events)[0]
    assert JobStatus.from_view(view).next_due_ms is None
    assert "next attempt due" not in render_job(view, now_ms=RETRY_AT)


@pytest.mark.parametrize("raw", [b"soon", b"-99999999999999999", b"9" * 30, b""])
def test_a_bad_header_is_as_if_absent(raw: bytes) -> None:
    assert "next_due_ms" not in failed_once(raw)


def test_the_next_due_time_lasts_while_the_job_waits_for_that_attempt() -> None:
    view = failed_once(str(NEXT).encode())
    # a skipped second delivery of the failed attempt changes nothing
    same = state.apply_outcome(view, o("duplicate", RETRY_AT + 10, 1), partition=1)
    assert same["next_due_ms"] == NEXT
    # the next attempt runs: it waits for nothing any more
    running = state.apply_outcome(dict(same), o("started", NEXT + 3, 2, worker="w2"), partition=1)
    assert "next_due_ms" not in running
    done = state.apply_outcome(
        dict(same), o("succeeded", NEXT + 50, 2, duration_ms=40.0), partition=1
    )
    assert "next_due_ms" not in done
    assert done["history"][1][3]["next_due_ms"] == NEXT  # the history keeps it
    # a header on another state is not read
    other = state.apply_outcome(
        dict(same), o("dead", NEXT + 50, 2, error="z"), partition=1, next_due_ms=NEXT + 10_000
    )
    assert "next_due_ms" not in other
    assert other["history"][-1][3] == {"error": "z"}


def test_the_timeline_shows_each_retrys_due_time_and_the_attempts_table_too() -> None:
    view = failed_once(str(NEXT).encode())
    second = NEXT + 5_100
    view = state.apply_outcome(
        view,
        o("retrying", second, 2, worker="w2", duration_ms=100.0, error="y"),
        partition=1,
        next_due_ms=second + 9_000,
    )
    events = timeline(view)
    assert [(e["state"], e["attempt"], e["at_ms"]) for e in events] == [
        ("scheduled", 0, DUE - 10_000),
        ("due", 0, DUE),
        ("fired", 0, DUE + 2),
        ("retrying", 1, RETRY_AT),
        (RETRY_DUE, 2, NEXT),
        ("retrying", 2, second),
        (RETRY_DUE, 3, second + 9_000),
    ]
    assert events[3]["next_due_ms"] == NEXT
    rows = attempts(events)
    assert [(r["attempt"], r["outcome"], r["retry_due_ms"]) for r in rows] == [
        (1, "retrying", NEXT),
        (2, "retrying", second + 9_000),
    ]  # attempt 3 has not run: no row
    page = job_page(view, payloads=False)
    assert page["job"]["next_due_ms"] == second + 9_000
    assert page["attempts"] == rows


def test_scheduler_status_and_dueflow_job_show_the_next_due_time() -> None:
    view = failed_once(str(NEXT).encode())
    status = JobStatus.from_view(view, source="status-view")
    assert (status.state, status.due_ms, status.next_due_ms) == ("retrying", DUE, NEXT)
    assert status.next_due is not None
    assert status.next_due.timestamp() * 1000 == NEXT
    doc = status.to_json()
    assert (doc["next_due_ms"], doc["next_due"]) == (NEXT, "2030-03-17T17:46:45.600Z")
    assert "next_due_ms" not in status.extra
    text = render_job(view, now_ms=NEXT - 42_000)
    assert "next attempt due  2030-03-17 17:46:45.600Z (in 42s)" in text
    assert text.count("next") == 1  # not again among the newer fields
    # once it ran, nothing is said about it
    done = state.apply_outcome(view, o("succeeded", NEXT + 50, 2), partition=1)
    assert "next attempt due" not in render_job(done, now_ms=NEXT + 60)
    assert JobStatus.from_view(done).next_due_ms is None
