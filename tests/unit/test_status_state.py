"""Folding outcomes into a job's view, and per-queue counts (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.rules import job_state as state


def o(state_: str, at: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": "j",
        "queue": "q",
        "task": "t",
        "idempotency_key": "k",
        "state": state_,
        "attempt": attempt,
        "at_ms": at,
        **extra,
    }


def fold(*outcomes: dict[str, Any]) -> dict[str, Any]:
    view: dict[str, Any] | None = None
    for rec in outcomes:
        view = state.apply_outcome(view, rec, partition=2)
    assert view is not None
    return view


def test_a_retried_job_that_succeeds() -> None:
    v = fold(
        o("scheduled", 100, due_ms=500),
        o("fired", 510),
        o("started", 520, 1, worker="w1"),
        o("retrying", 530, 1, error_type="IOError", error="disk"),
        o("started", 1530, 2),
        o("succeeded", 1540, 2, duration_ms=10.0, trace_id="ab" * 16),
    )
    assert v["state"] == "succeeded"
    assert v["attempts"] == 2
    assert (v["first_seen_ms"], v["updated_ms"]) == (100, 1540)
    assert (v["due_ms"], v["fired_ms"], v["started_ms"], v["finished_ms"]) == (500, 510, 1530, 1540)
    assert v["last_error"] == {"type": "IOError", "message": "disk", "attempt": 1, "at_ms": 530}
    assert v["duration_ms"] == 10.0
    assert v["worker"] == "w1"
    assert v["trace_id"] == "ab" * 16
    assert v["partition"] == 2
    assert [h[0] for h in v["history"]] == [
        "scheduled",
        "fired",
        "started",
        "retrying",
        "started",
        "succeeded",
    ]


def test_duplicate_and_unknown_do_not_change_the_state() -> None:
    v = fold(o("succeeded", 10, 1), o("duplicate", 20, 1), o("unknown", 30))
    assert v["state"] == "succeeded"
    assert v["duplicates"] == 1
    assert v["updated_ms"] == 30
    assert fold(o("duplicate", 5))["state"] == "duplicate"


def test_a_late_scheduled_outcome_does_not_move_the_job_back() -> None:
    v = fold(o("succeeded", 30, 1, duration_ms=1.0), o("scheduled", 10, due_ms=20))
    assert v["state"] == "succeeded"
    assert v["finished_ms"] == 30
    assert (v["first_seen_ms"], v["due_ms"]) == (10, 20)
    assert [h[0] for h in v["history"]] == ["succeeded", "scheduled"]
    assert fold(o("scheduled", 10), o("scheduled", 11))["state"] == "scheduled"


def test_a_redriven_dead_job_is_no_longer_finished() -> None:
    v = fold(o("dead", 10, 4, error="x"), o("fired", 20), o("started", 30, 1))
    assert v["state"] == "started"
    assert v["finished_ms"] is None
    assert v["attempts"] == 4  # highest seen


def test_history_is_bounded() -> None:
    view = None
    for i in range(50):
        view = state.apply_outcome(view, o("started", i, i), partition=0, history_limit=5)
    assert view is not None
    assert [h[2] for h in view["history"]] == [45, 46, 47, 48, 49]


def test_count_deltas_and_apply() -> None:
    a = fold(o("scheduled", 1))
    b = state.apply_outcome(a, o("fired", 2), partition=2)
    assert state.count_deltas(None, a) == [("q", "scheduled", 1)]
    assert state.count_deltas(a, b) == [("q", "scheduled", -1), ("q", "fired", 1)]
    assert state.count_deltas(b, b) == []
    assert state.count_deltas(b, None) == [("q", "fired", -1)]
    counts = state.apply_deltas({"scheduled": 1}, state.count_deltas(a, b), "q")
    assert counts == {"fired": 1}
    assert state.apply_deltas({}, [("other", "fired", 1)], "q") == {}


def test_counts_are_keyed_per_partition_and_summed() -> None:
    assert state.counts_key("billing", 3) == "billing@3"
    assert state.queue_of_counts_key("a@b@3") == "a@b"
    rows = {"q@0": {"fired": 2}, "q@1": {"fired": 1, "dead": 1}, "r@0": {"succeeded": 5}}
    assert state.sum_counts(rows) == {"q": {"fired": 3, "dead": 1}, "r": {"succeeded": 5}}


@pytest.mark.parametrize(
    ("state_", "age", "expired"),
    [
        ("succeeded", 100, True),
        ("succeeded", 99, False),
        ("dead", 500, True),
        ("started", 10**9, False),
    ],
)
def test_expiry_only_of_finished_jobs(state_: str, age: int, expired: bool) -> None:
    v = fold(o(state_, 1000))
    assert state.expired(v, now_ms=1000 + age, retention_ms=100) is expired
