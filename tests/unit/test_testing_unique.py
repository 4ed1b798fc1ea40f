"""Unique and debounced jobs in the in-memory pipeline: the worker's own admit rule
answers at once (the same applier as on a worker)."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import InvalidInput, task
from dueflow.consumers import TaskContext
from dueflow.errors import DuplicateJob, JobError
from dueflow.model import Backoff, BackoffKind
from dueflow.testing import InMemoryPipeline


def recording(name: str, calls: list[Any], **options: Any) -> Any:
    @task(name, **options)
    def handler(payload: Any, ctx: TaskContext) -> None:
        calls.append((ctx.job_id, payload, ctx.headers.get("df-unique")))

    return handler


def test_a_duplicate_returns_the_holders_id_and_only_the_holder_runs() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        first = p.scheduler.schedule("t", {"v": 1}, delay="1h", unique_key="report:42")
        again = p.scheduler.schedule("t", {"v": 2}, delay="5m", unique_key="report:42")
        assert not first.duplicate
        assert (again.job_id, again.duplicate) == (first.job_id, True)
        p.run_until_idle()
        assert calls == [(first.job_id, {"v": 1}, b"report:42")]
        # its end released the key: the next one is admitted
        later = p.scheduler.schedule("t", {"v": 3}, unique_key="report:42")
        assert not later.duplicate
        assert later.job_id != first.job_id
        p.run_until_idle()
        assert [c[1] for c in calls] == [{"v": 1}, {"v": 3}]


def test_refuse_raises_naming_the_holder_and_schedules_nothing() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        first = p.scheduler.schedule("t", 1, delay="1h", unique_key="k")
        with pytest.raises(DuplicateJob) as caught:
            p.scheduler.schedule("t", 2, unique_key="k", on_duplicate="refuse", job_id="mine")
        assert caught.value.first_job_id == first.job_id
        assert p.job("mine").state == "deduplicated"
        assert [j.job_id for j in p.pending()] == [first.job_id]


def test_debounce_runs_once_with_the_last_write_after_the_last_write() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        writes = []
        for n in range(20):
            writes.append(p.scheduler.schedule("t", {"n": n}, unique_key="u", debounce="5s"))
            p.advance(1)  # each write inside the debounce of the one before
        assert len({w.job_id for w in writes}) == 1
        p.run_until_idle()
        assert [c[1] for c in calls] == [{"n": 19}]
        (run,) = p.runs(writes[0].job_id)
        assert run.at_ms == writes[-1].due_ms  # 5 s after the last write


def test_replace_of_a_started_holder_admits_a_new_job() -> None:
    calls: list[Any] = []
    seen: list[Any] = []

    @task("flaky", max_attempts=2, backoff=Backoff(BackoffKind.FIXED, base_ms=1000, jitter=False))
    def flaky(payload: Any, ctx: TaskContext) -> None:
        calls.append((ctx.job_id, payload, ctx.attempt))
        if payload == "first" and ctx.attempt == 1:
            # started (retrying): a write now is a new job, not a replace of this one
            seen.append(p.scheduler.schedule("flaky", "second", unique_key="u", debounce="1h"))
            raise JobError("once")

    with InMemoryPipeline([flaky]) as p:
        first = p.scheduler.schedule("flaky", "first", unique_key="u", debounce="1s")
        p.run_until_idle()
        assert not seen[0].duplicate
        assert seen[0].job_id != first.job_id
        assert [c[1:] for c in calls] == [("first", 1), ("first", 2), ("second", 1)]


def test_until_start_lets_a_new_job_in_once_the_holder_started() -> None:
    got: dict[str, Any] = {}

    @task("long", max_attempts=2, backoff=Backoff(BackoffKind.FIXED, base_ms=1000, jitter=False))
    def long(payload: Any, ctx: TaskContext) -> None:
        if ctx.attempt == 1 and payload in ("end", "start"):
            # while it runs, another job under its own key
            got[payload] = p.scheduler.schedule(
                "long", "later", unique_key=payload, unique_until=payload, delay="1h"
            )
            raise JobError("retry")

    with InMemoryPipeline([long]) as p:
        held_to_end = p.scheduler.schedule("long", "end", unique_key="end")
        p.scheduler.schedule("long", "start", unique_key="start", unique_until="start")
        p.run_due()
        assert (got["end"].job_id, got["end"].duplicate) == (held_to_end.job_id, True)
        assert not got["start"].duplicate  # its holder had started


def test_a_window_holds_the_key_from_the_admission_whatever_the_job_does() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        first = p.scheduler.schedule("t", 1, unique_key="w", unique_for="10m")
        p.run_until_idle()  # it ran and ended: the window still holds
        inside = p.scheduler.schedule("t", 2, unique_key="w", unique_for="10m")
        assert (inside.job_id, inside.duplicate) == (first.job_id, True)
        p.advance(minutes=10)
        after = p.scheduler.schedule("t", 3, unique_key="w", unique_for="10m")
        assert not after.duplicate
        p.run_until_idle()
        assert [c[1] for c in calls] == [1, 3]


def test_a_cancelled_holder_releases_its_key_and_a_moved_one_keeps_it() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        first = p.scheduler.schedule("t", 1, delay="30d", unique_key="c")
        assert p.scheduler.cancel(first.job_id).verdict == "cancelled"
        second = p.scheduler.schedule("t", 2, delay="30d", unique_key="c")
        assert not second.duplicate
        moved = p.scheduler.reschedule(second.job_id, delay="1h")  # earlier: a replace
        assert moved.verdict == "rescheduled"
        assert p.scheduler.schedule("t", 3, unique_key="c").job_id == second.job_id
        p.run_until_idle()
        assert calls == [(second.job_id, 2, b"c")]
        assert not p.scheduler.schedule("t", 4, unique_key="c").duplicate


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_for": "1m"}, "unique_for"),
        ({"debounce": "1s"}, "debounce"),
        ({"on_duplicate": "return"}, "on_duplicate"),
        ({"unique_key": "k\x1b[2J"}, "unique_key"),
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": "k", "on_duplicate": "ignore"}, "on_duplicate"),
        ({"unique_key": "k", "unique_until": "success"}, "unique_until"),
        ({"unique_key": "k", "unique_for": "1m", "unique_until": "end"}, "unique_until"),
        ({"unique_key": "k", "unique_for": "0s"}, "unique_for"),
        ({"unique_key": "k", "unique_for": "400d"}, "unique_for"),
        ({"unique_key": "k", "debounce": "soon"}, "debounce"),
        ({"unique_key": "k", "debounce": "1s", "on_duplicate": "return"}, "on_duplicate"),
        ({"unique_key": "k", "debounce": "1s", "unique_until": "end"}, "unique_until"),
        ({"unique_key": "k", "admission_wait": -1}, "admission_wait"),
    ],
)
def test_bad_unique_options_are_refused_naming_the_field(
    options: dict[str, Any], field: str
) -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        with pytest.raises(InvalidInput) as caught:
            p.scheduler.schedule("t", 1, **options)
        assert caught.value.field == field
        assert p.pending() == []
