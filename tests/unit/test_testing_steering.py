"""Cancel, move and update by command in the in-memory pipeline: the worker's own
applier answers at once, and deliveries are judged by the same rule as on a worker."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import InvalidInput, PermanentJobError, task
from dueflow.consumers import TaskContext
from dueflow.errors import JobError
from dueflow.testing import InMemoryPipeline


def recording(name: str, calls: list[Any]) -> Any:
    @task(name)
    def handler(payload: Any, ctx: TaskContext) -> None:
        calls.append((ctx.job_id, ctx.attempt, payload, ctx.headers.get("df-version")))

    return handler


def test_every_queue_of_the_pipeline_is_steered_by_command() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        assert p.scheduler.steerable("default")


def test_an_update_runs_the_job_with_the_new_payload_at_its_due_time() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", {"v": 1}, delay="365d")
        got = p.scheduler.update(job.job_id, payload={"v": 2})
        assert (got.updated, got.verdict) == (True, "updated")
        assert p.job(job.job_id).state == "updated"
        p.run_until_idle()
        assert got.command_id is not None
        assert [(c[2], c[3]) for c in calls] == [({"v": 2}, got.command_id.encode())]
        assert p.history[-1].at_ms == job.due_ms  # not late, not early


def test_an_update_may_move_the_job_later_too() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", {"v": 1}, delay="1h")
        got = p.scheduler.update(job.job_id, payload="text", delay="2h")
        assert got.updated
        assert got.due_ms == job.due_ms + 3_600_000
        p.run_until_idle()
        assert [c[2] for c in calls] == ["text"]
        assert p.runs(job.job_id)[0].at_ms == got.due_ms


def test_a_move_earlier_sends_the_jobs_value_and_keeps_a_waiting_update() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", {"v": 1}, delay="30d")
        p.scheduler.update(job.job_id, payload={"v": 2})
        moved = p.scheduler.reschedule(job.job_id, delay="1h")
        assert (moved.rescheduled, moved.verdict) == (True, "rescheduled")
        p.run_until_idle()
        (run,) = p.runs(job.job_id)
        assert run.at_ms == moved.due_ms
        assert [c[2] for c in calls] == [{"v": 2}]
        # the original timer, a month later, was skipped as an older version
        assert [r.outcome for r in p.history if r.job_id == job.job_id] == [
            "succeeded",
            "rescheduled",
        ]


def test_what_cannot_be_steered_says_why() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        ran = p.scheduler.schedule("t", 1)
        p.run_due()
        assert not p.scheduler.update(ran.job_id, payload=2).updated
        assert "succeeded" in (p.scheduler.update(ran.job_id, payload=2).reason or "")
        assert not p.scheduler.reschedule(ran.job_id, delay="1h").rescheduled
        assert not p.scheduler.cancel(ran.job_id).cancelled
        pending = p.scheduler.schedule("t", 3, delay="1h")
        with pytest.raises(InvalidInput, match="wait"):
            p.scheduler.cancel(pending.job_id, wait=-1)
        with pytest.raises(InvalidInput, match="payload"):
            p.scheduler.update(pending.job_id, payload=float("nan"))
        p.scheduler.cancel(pending.job_id)
        refused = p.scheduler.update(pending.job_id, payload=4)  # the client sees it
        assert (refused.updated, refused.command_id) == (False, None)
        assert "cancelled" in (refused.reason or "")
        assert p.job(pending.job_id).state == "cancelled"


def test_a_cancel_while_the_job_runs_lets_the_attempt_end_and_no_retry_start() -> None:
    attempts: list[int] = []

    @task("self_cancel", max_attempts=5)
    def self_cancel(payload: Any, ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        p.scheduler.cancel(ctx.job_id)
        raise JobError("failed after being cancelled")

    with InMemoryPipeline([self_cancel]) as p:
        job = p.scheduler.schedule("self_cancel", {}, delay="1m")
        p.run_until_idle()
        assert attempts == [1]
        assert p.job(job.job_id).state == "cancelled"
        assert [r.outcome for r in p.history] == ["cancelled"]


def test_a_permanent_failure_of_a_cancelled_running_job_is_dead_as_before() -> None:
    @task("boom")
    def boom(payload: Any, ctx: TaskContext) -> None:
        p.scheduler.cancel(ctx.job_id)
        raise PermanentJobError("no")

    with InMemoryPipeline([boom]) as p:
        job = p.scheduler.schedule("boom", {})
        p.run_until_idle()
        assert p.job(job.job_id).state == "dead"
