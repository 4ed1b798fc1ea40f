"""The status fold keeps a job's result and progress, and a running job's
``started`` outcomes (pure: ``rules/job_state.apply_outcome``)."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.rules.job_state import apply_outcome
from dueflow.rules.job_status import JobStatus


def outcome(state: str, at: int, attempt: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "job_id": "j",
        "queue": "q",
        "task": "t",
        "idempotency_key": "k",
        "state": state,
        "attempt": attempt,
        "at_ms": at,
        **fields,
    }


def fold(*outcomes: dict[str, Any]) -> dict[str, Any]:
    view: dict[str, Any] | None = None
    for o in outcomes:
        view = apply_outcome(view, o, partition=0)
    assert view is not None
    return view


def test_a_running_job_with_progress_then_its_result() -> None:
    view = fold(
        outcome("scheduled", 1, attempt=0),
        outcome("started", 1_000),
        outcome("started", 2_000, progress=0.25, progress_detail=b'{"rows":25}'),
        outcome("started", 3_000, progress=0.5, progress_detail=None),
    )
    assert view["state"] == "started"
    assert view["started_ms"] == 1_000  # the attempt's first
    assert (view["progress"], view["progress_detail"], view["progress_ms"]) == (0.5, None, 3_000)
    assert view["progress_attempt"] == 1
    assert view["history"] == [["scheduled", 0, 1], ["started", 1, 1_000]]  # one per attempt
    view = apply_outcome(
        view, outcome("succeeded", 4_000, result=b'{"sum":6}', duration_ms=3.0), partition=0
    )
    assert (view["state"], view["result"], view["result_error"]) == ("succeeded", {"sum": 6}, None)
    assert view["progress"] == 0.5  # kept after the end, with its time
    status = JobStatus.from_view(view)
    assert (status.result, status.progress, status.running, status.finished) == (
        {"sum": 6},
        0.5,
        False,
        True,
    )
    assert status.to_json()["result"] == {"sum": 6}


def test_a_retry_starts_a_new_run() -> None:
    view = fold(
        outcome("started", 1_000, progress=0.9),
        outcome("retrying", 2_000, error="boom", error_type="E"),
        outcome("started", 12_000, attempt=2),
        outcome("started", 13_000, attempt=2, progress=0.1),
    )
    assert (view["state"], view["started_ms"], view["attempts"]) == ("started", 12_000, 2)
    assert (view["progress"], view["progress_attempt"]) == (0.1, 2)
    assert [h[0] for h in view["history"]] == ["started", "retrying", "started"]


@pytest.mark.parametrize("final", ["succeeded", "dead", "cancelled", "expired"])
def test_a_started_outcome_after_the_end_changes_nothing(final: str) -> None:
    ended = fold(outcome("started", 1_000), outcome(final, 2_000))
    late = apply_outcome(dict(ended), outcome("started", 2_500, progress=0.3), partition=0)
    assert late["state"] == final
    assert late.get("progress") is None
    assert late["finished_ms"] == ended["finished_ms"]
    assert late["history"][-1] == ["started", 1, 2_500]


def test_a_result_not_kept_and_a_result_that_is_no_json() -> None:
    not_kept = fold(outcome("succeeded", 1, result_error="result of 9 bytes exceeds ..."))
    assert (not_kept["result"], not_kept["result_error"]) == (None, "result of 9 bytes exceeds ...")
    garbage = fold(outcome("succeeded", 1, result=b"{not json"))
    assert "result" not in garbage
    assert garbage["result_error"].startswith("not UTF-8 JSON: ")


def test_a_job_that_returned_none_has_no_result_fields() -> None:
    view = fold(outcome("scheduled", 1, attempt=0), outcome("succeeded", 2))
    assert "result" not in view
    assert "progress" not in view
    status = JobStatus.from_view(view)
    assert (status.result, status.result_error, status.progress) == (None, None, None)


def test_a_redriven_job_that_succeeds_again_has_its_new_result() -> None:
    view = fold(
        outcome("succeeded", 1, result=b"1"),
        outcome("dead", 2),  # (a redrive after a later dead run: a new life)
        outcome("fired", 3),
        outcome("succeeded", 4),
    )
    assert (view["state"], view["result"]) == ("succeeded", None)
