"""The in-memory pipeline runs ``ctx.schedule`` chains and worker hooks as a worker does.

Follow-ups are written with their attempt's success only, go through the
emitter at their due time (never before), carry deterministic ids, and a
second copy of one is skipped by its key; the hooks run at creation, after
each failed attempt and at close.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, WorkerInfo, on_failure, on_shutdown, on_startup, task
from dueflow.consumers.failures import Failure
from dueflow.errors import DueflowError, WorkerStartupFailed
from dueflow.kafka.topics import names
from dueflow.testing import InMemoryPipeline

SEEN: list[tuple[int, str, str | None]] = []


@task("chain-step")
def chain_step(payload: dict[str, Any], ctx: TaskContext) -> None:
    SEEN.append((payload["step"], ctx.job_id, ctx.parent_job_id))
    if payload["step"] < payload["of"]:
        ctx.schedule("chain-step", {**payload, "step": payload["step"] + 1}, delay="10m")


@task("fails-first", max_attempts=3)
def fails_first(payload: dict[str, Any], ctx: TaskContext) -> None:
    ctx.schedule("chain-step", {"step": 9, "of": 9})
    if ctx.attempt < payload["succeed_at"]:
        raise ConnectionError(f"attempt {ctx.attempt} fails")


@task("bad-follow-up")
async def bad_follow_up(payload: Any, ctx: TaskContext) -> None:
    ctx.schedule("chain-step", {"x": float("nan")})


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


def test_a_chain_of_three_steps_runs_each_once_at_its_due_time() -> None:
    with InMemoryPipeline([chain_step]) as pipeline:
        first = pipeline.scheduler.schedule("chain-step", {"step": 1, "of": 3})
        pipeline.run_due()
        step2 = f"{first.idempotency_key}/0"
        assert pipeline.job(step2).state == "scheduled"  # known before it fires
        assert [p.due_ms for p in pipeline.pending(step2)] == [first.due_ms + 600_000]
        pipeline.clock.advance(minutes=9, seconds=59)
        assert pipeline.run_due() == []  # never early
        runs = pipeline.run_until_idle()
    assert [(s, parent) for s, _, parent in SEEN] == [
        (1, None),
        (2, first.job_id),
        (3, step2),
    ]
    assert [r.job_id for r in pipeline.runs()] == [first.job_id, step2, f"{step2}/0"]
    assert [r.outcome for r in pipeline.runs()] == ["succeeded"] * 3
    assert [r.at_ms - first.due_ms for r in pipeline.runs()] == [0, 600_000, 1_200_000]
    assert [f.job_id for f in pipeline.runs()[0].follow_ups] == [step2]
    assert runs[-1].follow_ups == ()


def test_a_failed_attempt_writes_no_follow_up_and_the_one_that_succeeds_writes_it_once() -> None:
    with InMemoryPipeline([chain_step, fails_first]) as pipeline:
        job = pipeline.scheduler.schedule("fails-first", {"succeed_at": 3})
        pipeline.run_until_idle()
        attempts = [(r.attempt, r.outcome, len(r.follow_ups)) for r in pipeline.runs(job.job_id)]
        assert attempts == [(1, "retrying", 0), (2, "retrying", 0), (3, "succeeded", 1)]
        timers = pipeline.log.records(names(pipeline.settings).timers)
        follow_ups = [r.key() for r in timers if dict(r.headers()).get(hdr.PARENT)]
        assert follow_ups == [f"{job.idempotency_key}/0".encode()]  # one record, one key
        assert [r.job_id for r in pipeline.runs(task="chain-step")] == [f"{job.job_id}/0"]


def test_a_job_that_ends_dead_schedules_nothing() -> None:
    with InMemoryPipeline([chain_step, fails_first]) as pipeline:
        pipeline.scheduler.schedule("fails-first", {"succeed_at": 99})
        pipeline.run_until_idle()
        assert [r.outcome for r in pipeline.runs()] == ["retrying", "retrying", "dead"]
        assert pipeline.runs(task="chain-step") == []
        assert pipeline.pending() == []


def test_a_second_copy_of_a_follow_up_is_skipped_by_its_key() -> None:
    """Were a parent ever committed twice (a key forgotten, a replay), its follow-up's
    second timer has the same key: the worker skips it."""
    with InMemoryPipeline([chain_step]) as pipeline:
        pipeline.scheduler.schedule("chain-step", {"step": 1, "of": 2})
        pipeline.run_until_idle()
        timers = names(pipeline.settings).timers
        (copy,) = [r for r in pipeline.log.records(timers) if dict(r.headers()).get(hdr.PARENT)]
        pipeline.log.append(timers, copy.key(), copy.value(), copy.headers())
        pipeline.run_until_idle()
        decided = [(r.job_id, r.outcome) for r in pipeline.history if r.task == "chain-step"]
    step2 = copy.key().decode()  # type: ignore[union-attr]
    assert decided[-2:] == [(step2, "succeeded"), (step2, "duplicate")]
    assert [s for s, _, _ in SEEN] == [1, 2]


def test_an_eager_pipeline_runs_the_whole_chain_in_the_schedule_call() -> None:
    with InMemoryPipeline([chain_step], eager=True) as pipeline:
        pipeline.scheduler.schedule("chain-step", {"step": 1, "of": 3})
        assert [s for s, _, _ in SEEN] == [1, 2, 3]


def test_a_bad_follow_up_fails_the_attempt_with_the_sdks_error() -> None:
    with InMemoryPipeline([chain_step, bad_follow_up]) as pipeline:
        job = pipeline.scheduler.schedule("bad-follow-up")
        pipeline.run_until_idle()
        (run,) = pipeline.runs(job.job_id)
        assert run.outcome == "dead"
        assert run.dead_reason == "permanent_error"  # no retry can help a bad call
        assert run.error is not None
        assert run.error.startswith("dueflow.errors.InvalidInput: payload['x']")
        assert pipeline.runs(task="chain-step") == []


def test_a_call_from_a_thread_the_handler_left_behind_raises() -> None:
    late: list[BaseException] = []
    go, done = threading.Event(), threading.Event()

    @task("leaves-a-thread")
    def leaves_a_thread(payload: Any, ctx: TaskContext) -> None:
        def later() -> None:
            go.wait(5)
            try:
                ctx.schedule("chain-step", {"step": 1, "of": 1})
            except DueflowError as exc:
                late.append(exc)
            done.set()

        threading.Thread(target=later, daemon=True).start()

    with InMemoryPipeline([chain_step, leaves_a_thread]) as pipeline:
        pipeline.scheduler.schedule("leaves-a-thread")
        pipeline.run_until_idle()
        go.set()
        assert done.wait(5), "the left-behind thread did not call"
        pipeline.run_until_idle()
        assert pipeline.runs(task="chain-step") == []
    assert "after the attempt ended" in str(late[0])


# ------------------------------------------------------------------ hooks

EVENTS: list[tuple[Any, ...]] = []


@on_startup
def opened(worker: WorkerInfo) -> None:
    EVENTS.append(("startup", worker.worker_id, worker.tasks))


@on_failure
async def noted(job: TaskContext, error: Failure, will_retry: bool) -> None:
    EVENTS.append(("failure", job.attempt, error.summary, will_retry))


@on_failure
def broken(job: TaskContext, error: Failure, will_retry: bool) -> None:
    raise RuntimeError("the hook fails")


@on_shutdown
def closed(worker: WorkerInfo) -> None:
    EVENTS.append(("shutdown",))


def test_hooks_run_at_start_after_each_failure_and_at_close() -> None:
    EVENTS.clear()
    pipeline = InMemoryPipeline([chain_step, fails_first, opened, noted, broken, closed])
    assert EVENTS == [("startup", "in-memory", ("chain-step", "fails-first"))]
    pipeline.scheduler.schedule("fails-first", {"succeed_at": 99})
    pipeline.run_until_idle()
    pipeline.close()
    pipeline.close()  # once only
    assert EVENTS[1:] == [
        ("failure", 1, "ConnectionError: attempt 1 fails", True),
        ("failure", 2, "ConnectionError: attempt 2 fails", True),
        ("failure", 3, "ConnectionError: attempt 3 fails", False),
        ("shutdown",),
    ]
    assert [(e.kind, str(e.error)) for e in pipeline.hook_errors] == [
        ("failure", "the hook fails")
    ] * 3  # logged, counted and kept; the runs went on
    counted = pipeline.metrics.registry.get_sample_value(
        "dueflow_worker_hook_calls_total", {"hook": "failure", "result": "error"}
    )
    assert counted == 3


def test_a_failing_startup_hook_stops_the_pipeline_as_it_stops_a_worker() -> None:
    @on_startup
    def refuses(worker: WorkerInfo) -> None:
        raise ConnectionError("database refused")

    EVENTS.clear()
    with pytest.raises(WorkerStartupFailed, match="database refused"):
        InMemoryPipeline([chain_step, refuses, closed])
    assert EVENTS == []  # no shutdown hook for a worker that never started


def test_a_hook_registered_later_starts_when_it_is_registered() -> None:
    EVENTS.clear()
    with InMemoryPipeline([chain_step]) as pipeline:
        pipeline.register(opened)
        pipeline.register(opened)  # once
    assert EVENTS == [("startup", "in-memory", ("chain-step",))]
