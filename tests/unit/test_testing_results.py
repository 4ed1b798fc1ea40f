"""Results and progress in the in-memory test mode: the worker's own recorder writes
them, the status fold shows them, ``scheduler.result`` reads them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from dueflow import InvalidInput, TaskContext, task
from dueflow.errors import JobCancelled, JobFailed, ResultNotKept, ResultTimeout
from dueflow.testing import InMemoryPipeline, make_context


@task("total")
def total(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    for done, _x in enumerate(payload["xs"], 1):
        ctx.progress(done / len(payload["xs"]), {"rows": done})
    ctx.schedule("announce", {"channel": "ops"}, pass_result=True)
    return {"sum": sum(payload["xs"])}


@task("announce")
def announce(payload: dict[str, Any], ctx: TaskContext) -> str:
    return f"{payload['channel']}: {ctx.parent_result['sum']} ({ctx.parent_job_id})"


@task("async-total")
async def async_total(payload: list[int], ctx: TaskContext) -> int:
    await asyncio.sleep(0)
    return sum(payload)


@task("isolated-total", isolation="process")
def isolated_total(payload: list[int], ctx: TaskContext) -> int:
    return sum(payload)


@task("returns-a-set")
def returns_a_set(payload: Any, ctx: TaskContext) -> set[int]:
    return {1, 2}


@task("fails", max_attempts=1)
def fails(payload: Any, ctx: TaskContext) -> None:
    raise ValueError("no such account")


@task("bad-progress")
def bad_progress(payload: Any, ctx: TaskContext) -> None:
    ctx.progress(2.0)


TASKS: list[Callable[..., Any]] = [
    total,
    announce,
    async_total,
    isolated_total,
    returns_a_set,
    fails,
    bad_progress,
]


def test_a_chain_passes_its_result_and_every_result_can_be_read() -> None:
    with InMemoryPipeline(tasks=TASKS) as pipeline:
        s = pipeline.scheduler.schedule("total", {"xs": [1, 2, 3]})
        runs = pipeline.run_until_idle()
        assert [(r.task, r.result) for r in runs] == [
            ("total", {"sum": 6}),
            ("announce", f"ops: 6 ({s.job_id})"),
        ]
        assert pipeline.scheduler.result(s.job_id) == {"sum": 6}
        assert pipeline.scheduler.result(f"{s.job_id}/0") == f"ops: 6 ({s.job_id})"
        job = pipeline.job(s.job_id)
        assert (job.state, job.result, job.progress, job.progress_detail) == (
            "succeeded",
            {"sum": 6},
            1.0,
            {"rows": 3},
        )
        status = pipeline.scheduler.status(s.job_id)
        assert status is not None
        assert (status.result, status.progress) == ({"sum": 6}, 1.0)


@pytest.mark.parametrize(
    ("task_name", "payload", "result"),
    [("async-total", [1, 2], 3), ("isolated-total", [4, 5], 9)],
)
def test_async_and_isolated_handlers_return_results(
    task_name: str, payload: Any, result: Any
) -> None:
    with InMemoryPipeline(tasks=TASKS) as pipeline:
        s = pipeline.scheduler.schedule(task_name, payload)
        pipeline.run_until_idle()
        assert pipeline.scheduler.result(s.job_id) == result


def test_result_raises_for_jobs_without_one() -> None:
    with InMemoryPipeline(tasks=TASKS) as pipeline:
        s = pipeline.scheduler
        kept = s.schedule("returns-a-set")
        dead = s.schedule("fails")
        later = s.schedule("total", {"xs": [1]}, delay="1h")
        cancelled = s.schedule("total", {"xs": [1]}, delay="2h")
        s.cancel(cancelled.job_id)
        pipeline.run_due()
        assert pipeline.job(kept.job_id).state == "succeeded"
        with pytest.raises(ResultNotKept, match="result is not JSON: set value"):
            s.result(kept.job_id)
        with pytest.raises(JobFailed, match="ValueError: no such account") as err:
            s.result(dead.job_id)
        assert err.value.attempts == 1
        with pytest.raises(JobCancelled):
            s.result(cancelled.job_id)
        with pytest.raises(ResultTimeout, match="run the pipeline first"):
            s.result(later.job_id, timeout=5)
        with pytest.raises(ResultTimeout, match="no outcome of it was found"):
            s.result("no-such-job")
        pipeline.advance(hours=1)
        assert s.result(later.job_id) == {"sum": 1}


def test_an_eager_pipeline_has_the_result_at_once() -> None:
    with InMemoryPipeline(tasks=TASKS, eager=True) as pipeline:
        s = pipeline.scheduler.schedule("async-total", [2, 2])
        assert pipeline.scheduler.result(s.job_id, timeout=0) == 4


def test_bad_progress_fails_the_attempt_with_the_field_named() -> None:
    with InMemoryPipeline(tasks=TASKS) as pipeline:
        pipeline.scheduler.schedule("bad-progress")
        (run,) = pipeline.run_until_idle()
        assert (run.outcome, run.dead_reason) == ("dead", "permanent_error")  # a bug: no retry
        assert run.error is not None
        assert "fraction" in run.error


def test_make_context_keeps_progress_reports_and_gives_a_parent_result() -> None:
    ctx = make_context("total", {"xs": [5, 5]})
    assert total({"xs": [5, 5]}, ctx) == {"sum": 10}
    assert [(r.fraction, r.detail) for r in ctx.progress_reports] == [
        (0.5, {"rows": 1}),
        (1.0, {"rows": 2}),
    ]
    child = make_context("announce", {"channel": "ops"}, parent_result={"sum": 10})
    assert announce({"channel": "ops"}, child) == "ops: 10 (None)"
    assert make_context("announce").parent_result is None
    with pytest.raises(InvalidInput, match="parent_result"):
        make_context("announce", parent_result={1, 2})
