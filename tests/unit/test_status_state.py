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


def test_fired_and_started_of_a_job_as_workers_report_it() -> None:
    """Nobody writes `fired` or `started` outcomes: a worker's outcome ends an attempt
    (its time less its duration is the start) and carries the exec record's df-fired."""
    view: dict[str, Any] | None = state.apply_outcome(
        None, o("scheduled", 100, due_ms=500), partition=2
    )
    assert view is not None
    assert (view["fired_ms"], view["started_ms"]) == (None, None)
    fired = state.header_ms(b"507")
    view = state.apply_outcome(
        view, o("retrying", 530, 1, duration_ms=12.5), partition=2, fired_ms=fired
    )
    assert (view["fired_ms"], view["started_ms"]) == (507, 517)
    view = state.apply_outcome(
        view, o("succeeded", 1560, 2, duration_ms=20.0), partition=2, fired_ms=1531
    )
    assert (view["fired_ms"], view["started_ms"], view["finished_ms"]) == (1531, 1540, 1560)
    # a skipped second delivery changes neither
    view = state.apply_outcome(view, o("duplicate", 1900, 2), partition=2, fired_ms=1890)
    assert (view["fired_ms"], view["started_ms"]) == (1531, 1540)
    # a job that never ran (an unknown task) has no start
    dead = state.apply_outcome(None, o("dead", 600, 0), partition=2, fired_ms=590)
    assert (dead["fired_ms"], dead["started_ms"]) == (590, None)


@pytest.mark.parametrize(("raw", "ms"), [(b"123", 123), (None, None), (b"x", None)])
def test_time_headers_are_read_leniently(raw: bytes | None, ms: int | None) -> None:
    assert state.header_ms(raw) == ms


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


def test_a_view_stays_small_whatever_the_outcome_holds() -> None:
    """The view is written to the table's changelog: an outcome with megabytes of
    text (another client's) must not make it too large for that topic."""
    from dueflow.rules.job_state import MESSAGE_MAX_CHARS, TEXT_MAX_CHARS, apply_outcome

    huge = {
        "job_id": "j",
        "queue": "q" * 10_000,
        "task": "t",
        "idempotency_key": "k" * 10_000,
        "state": "dead",
        "attempt": 1,
        "at_ms": 1,
        "error_type": "E" * 10_000,
        "error": "e" * 5_000_000,
        "worker": "w" * 10_000,
    }
    view = apply_outcome(None, huge, partition=0)
    assert len(view["last_error"]["message"]) == MESSAGE_MAX_CHARS
    assert view["last_error"]["message"].endswith("...")
    assert max(len(view[k]) for k in ("queue", "idempotency_key", "worker")) == TEXT_MAX_CHARS
    assert len(view["last_error"]["type"]) == TEXT_MAX_CHARS
    with pytest.raises(ValueError, match="job id of 256 characters"):
        apply_outcome(None, {**huge, "job_id": "j" * 256}, partition=0)


def test_commands_answered_by_the_owner_move_the_job_refusals_change_nothing() -> None:
    """A worker's ``rescheduled`` with a ``command_id`` answers a command (the job
    moved: its due time is the new one); without one it is a superseded delivery
    (the due time stays); ``refused`` leaves the job as it was; ``updated`` is pending."""
    v = fold(
        o("scheduled", 100, due_ms=500),
        o("rescheduled", 200, due_ms=900, worker="w1", command_id="c1"),
    )
    assert (v["state"], v["due_ms"]) == ("rescheduled", 900)
    v = fold(
        o("scheduled", 100, due_ms=500),
        o("rescheduled", 200, due_ms=900, worker="w1", command_id="c1"),
        o("rescheduled", 500, due_ms=500, worker="w1"),  # the old timer, skipped
        o("refused", 600, due_ms=100, worker="w1", command_id="c2", error="started: ..."),
    )
    assert (v["state"], v["due_ms"]) == ("rescheduled", 900)
    assert [h[0] for h in v["history"]][-1] == "refused"
    v = fold(o("scheduled", 100, due_ms=500), o("updated", 200, worker="w1", command_id="c3"))
    assert v["state"] == "updated"
    assert v["finished_ms"] is None


def test_a_command_answer_is_the_commands_and_a_refusal_is_not_the_jobs_error() -> None:
    """Outcome v3: the verdicts of the partition owner (``command_id``) set
    ``last_command``; ``version`` follows applied ones only; a refusal's reason is
    the command's, never the job's ``last_error``."""
    v = fold(
        o("scheduled", 100, due_ms=500),
        o("rescheduled", 200, due_ms=900, worker="w1", command_id="c1", version="c1"),
    )
    assert v["version"] == "c1"
    assert v["last_command"] == {"command_id": "c1", "outcome": "rescheduled", "at_ms": 200}
    v = state.apply_outcome(
        v,
        o("refused", 300, worker="w1", command_id="c2", error="started: it runs now"),
        partition=2,
    )
    assert (v["state"], v["due_ms"], v["version"]) == ("rescheduled", 900, "c1")
    assert v["last_command"] == {
        "command_id": "c2",
        "outcome": "refused",
        "at_ms": 300,
        "error": "started: it runs now",
    }
    assert v["last_error"] is None
    assert "command_id" not in v
    v = state.apply_outcome(
        v, o("updated", 400, worker="w1", command_id="c3", version="c3"), partition=2
    )
    assert (v["state"], v["version"], v["last_command"]["outcome"]) == ("updated", "c3", "updated")


def test_results_and_progress_details_are_kept_as_json_values() -> None:
    """The bytes fields of Outcome v3 hold UTF-8 JSON: the view (itself JSON, the
    changelog's value) keeps the value; bytes that are not JSON or too large are
    left out with the reason, never a crash."""
    v = fold(
        o("started", 100, 1, progress=0.5, progress_detail=b'{"rows": 10}'),
        o("succeeded", 200, 1, result=b'{"total": 42, "ids": [1, 2]}', exec_partition=3),
    )
    assert v["progress"] == 0.5
    assert v["progress_detail"] == {"rows": 10}
    assert v["result"] == {"total": 42, "ids": [1, 2]}
    assert v["exec_partition"] == 3
    bad = fold(o("succeeded", 200, 1, result=b"\xff not json"))
    assert "result" not in bad
    assert bad["result_error"].startswith("not UTF-8 JSON")
    big = b'"' + b"x" * state.JSON_FIELD_MAX_BYTES + b'"'
    over = fold(o("succeeded", 200, 1, result=big))
    assert "result" not in over
    assert "over the status view's" in over["result_error"]
    told = fold(o("succeeded", 200, 1, result_error="not JSON: a set"))
    assert told["result_error"] == "not JSON: a set"


def test_a_deduplicated_job_is_final() -> None:
    v = fold(o("deduplicated", 100, first_job_id="first", command_id="c9"))
    assert v["state"] == "deduplicated"
    assert v["finished_ms"] == 100
    assert v["first_job_id"] == "first"
    assert state.expired(v, now_ms=100 + 10, retention_ms=5)


def test_a_job_cancelled_while_an_attempt_runs_ends_with_that_attempt() -> None:
    """The owner answers ``cancelled`` to a cancel of a running job, but the attempt
    finishes (only its retries are cancelled): the view stays ``started``, not
    final, until the attempt's end says how the job ended."""
    running = fold(o("scheduled", 100, due_ms=100), o("started", 200, 1, worker="w1"))
    v = state.apply_outcome(running, o("cancelled", 300, worker="w1", command_id="c1"), partition=2)
    assert (v["state"], v["finished_ms"]) == ("started", None)
    assert v["last_command"]["outcome"] == "cancelled"
    done = state.apply_outcome(v, o("succeeded", 400, 1, duration_ms=200.0), partition=2)
    assert (done["state"], done["finished_ms"]) == ("succeeded", 400)
    failed = state.apply_outcome(v, o("retrying", 400, 1, error="boom"), partition=2)
    skipped = state.apply_outcome(failed, o("cancelled", 900, 2, worker="w1"), partition=2)
    assert (skipped["state"], skipped["finished_ms"]) == ("cancelled", 900)
    pending = fold(o("scheduled", 100, due_ms=500), o("cancelled", 300, command_id="c2"))
    assert (pending["state"], pending["finished_ms"]) == ("cancelled", 300)
