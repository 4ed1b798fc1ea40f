"""dueflow.testing: TaskContext.for_test / make_context, the fake clock, process isolation,
and the pytest plugin as a user's project enables it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dueflow import InvalidInput, TaskContext, task
from dueflow.testing import FakeClock, InMemoryPipeline, make_context

# ------------------------------------------------------------ a context for one call


def test_make_context_builds_what_a_worker_would_pass() -> None:
    ctx = make_context(
        "send-invoice",
        {"id": 7},
        attempt=2,
        max_attempts=3,
        job_id="job-7",
        queue="billing",
        idempotency_key="invoice-7",
        schedule_id="nightly",
        labels={"tenant": "acme"},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert (ctx.task, ctx.job_id, ctx.queue, ctx.idempotency_key) == (
        "send-invoice",
        "job-7",
        "billing",
        "invoice-7",
    )
    assert (ctx.attempt, ctx.max_attempts, ctx.is_last_attempt) == (2, 3, False)
    assert ctx.job.payload == b'{"id":7}'  # as the scheduling client encodes it
    assert ctx.job.schedule_id == "nightly"
    assert ctx.job.labels == {"tenant": "acme"}
    assert ctx.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert ctx.logger.extra == {
        "job_id": "job-7",
        "queue": "billing",
        "task": "send-invoice",
        "attempt": 2,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
    }


def test_for_test_defaults() -> None:
    ctx = TaskContext.for_test()
    assert (ctx.attempt, ctx.max_attempts) == (1, 4)
    assert ctx.idempotency_key == ctx.job_id  # as for a job scheduled without a key
    assert ctx.source == ("test", 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempt": 0}, "attempt"),
        ({"attempt": 5, "max_attempts": 4}, "attempt"),
        ({"max_attempts": True}, "max_attempts"),
        ({"payload": {1, 2}}, "payload"),
    ],
)
def test_for_test_refuses_what_no_worker_could_pass(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        TaskContext.for_test("t", **kwargs)
    assert info.value.field == field


def test_a_handler_called_directly_sees_its_last_attempt() -> None:
    seen: list[bool] = []

    @task("t")
    def handler(payload: Any, ctx: TaskContext) -> None:
        seen.append(ctx.is_last_attempt)

    handler(None, make_context("t", attempt=3, max_attempts=3))
    assert seen == [True]


# ------------------------------------------------------------ the clock


def test_the_fake_clock_moves_only_forward_and_only_when_told() -> None:
    clock = FakeClock("2030-06-01T12:00:00+02:00")
    assert clock.now == datetime(2030, 6, 1, 10, 0, tzinfo=UTC)
    assert clock() == clock.now_ms() == clock()
    assert clock.advance(minutes=1, ms=5) == clock.now_ms()
    assert clock.now == datetime(2030, 6, 1, 10, 1, 0, 5_000, tzinfo=UTC)
    with pytest.raises(InvalidInput):
        clock.advance(-1)
    with pytest.raises(InvalidInput):
        clock.set("2030-01-01T00:00:00Z")
    with pytest.raises(InvalidInput):
        FakeClock("2030-01-01T00:00:00")  # naive: no guessing of zones


def test_the_pipeline_starts_at_a_fixed_instant_by_default() -> None:
    with InMemoryPipeline() as p:
        assert p.clock.now == datetime(2030, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------ process isolation


@task("isolated", isolation="process")
def isolated(payload: Any, ctx: TaskContext) -> None:
    """A module-level function: a child process can import it."""


def test_a_process_isolated_task_runs_in_process_when_a_child_could_run_it() -> None:
    with InMemoryPipeline([isolated]) as p:
        p.scheduler.schedule("isolated", {"n": 1})
        (run,) = p.run_due()
        assert run.outcome == "succeeded"


def test_a_process_isolated_task_a_child_cannot_import_fails_as_on_a_worker() -> None:
    @task("nested", isolation="process", max_attempts=1)
    def nested(payload: Any, ctx: TaskContext) -> None:
        raise AssertionError("never called: a child process cannot find it")

    with InMemoryPipeline([nested]) as p:
        p.scheduler.schedule("nested")
        (run,) = p.run_due()
        assert (run.outcome, run.dead_reason) == ("dead", "exhausted")
        assert run.error_type == "AttributeError"
        assert "<locals>" in (run.error or "")


# ------------------------------------------------------------ the pytest plugin

pytest_plugins = ["pytester"]

USER_TESTS = """
import pytest
from dueflow import task

calls = []

@task("hello")
def hello(payload, ctx):
    calls.append((payload, ctx.attempt))

@pytest.fixture
def dueflow_tasks():
    return [hello]

def test_fake_clock(dueflow_pipeline):
    job = dueflow_pipeline.scheduler.schedule("hello", "a", delay="1m")
    assert dueflow_pipeline.run_due() == []
    dueflow_pipeline.advance(minutes=1)
    assert dueflow_pipeline.job(job.job_id).state == "succeeded"

def test_eager(dueflow_eager):
    dueflow_eager.scheduler.schedule("hello", "b", delay="1h")
    assert calls[-1] == ("b", 1)

def test_registering_in_the_test(dueflow_pipeline):
    @task("other", queue="elsewhere")
    def other(payload, ctx):
        calls.append(("other", ctx.queue))
    dueflow_pipeline.register(other)
    dueflow_pipeline.scheduler.schedule("other", queue="elsewhere")
    dueflow_pipeline.run_due()
    assert calls[-1] == ("other", "elsewhere")
"""


def test_the_plugin_in_a_users_project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "dueflow.testing.pytest_plugin", "-W", "error", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)


def test_the_plugin_leaves_a_project_that_does_not_use_it_alone(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_plain=(
            "import sys\n\ndef test_x():\n"
            "    assert 'dueflow.testing.pipeline' not in sys.modules\n"
            "    assert 'confluent_kafka' not in sys.modules\n"
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "dueflow.testing.pytest_plugin", "-W", "error", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
