"""dueflow.testing: due times, retries (backoff, jitter, tiers), dead letters, timeouts.

Every expected number here is what the pipeline on Kafka computes: the
worker's own code decides in memory too; the tests pin the outcomes a user
sees (which attempt ran when, with what result).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dueflow import PermanentJobError, task
from dueflow.config import QueueSpec, Settings
from dueflow.model import Backoff, BackoffKind
from dueflow.rules.backoff import compute_backoff
from dueflow.testing import FakeClock, InMemoryPipeline, JobTimeout

T0 = FakeClock().now_ms()


def scripted(
    name: str, script: list[str], calls: list[int] | None = None, **options: Any
) -> Callable[..., None]:
    """A handler whose attempt n does ``script[n-1]``: ok, fail, permanent, timeout."""
    seen = calls if calls is not None else []

    @task(name, **options)
    def handler(payload: Any, ctx: Any) -> None:
        seen.append(ctx.attempt)
        step = script[min(ctx.attempt, len(script)) - 1]
        if step == "fail":
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        if step == "permanent":
            raise PermanentJobError("no such customer")
        if step == "timeout":
            raise JobTimeout("the provider did not answer")

    return handler


# ------------------------------------------------------------ never early


@pytest.mark.parametrize("delay_ms", [1, 999, 60_000, 86_400_000])
def test_a_job_never_starts_before_its_due_time(delay_ms: int) -> None:
    calls: list[int] = []
    with InMemoryPipeline([scripted("t", ["ok"], calls)]) as p:
        job = p.scheduler.schedule("t", delay=delay_ms / 1000)
        assert job.due_ms == T0 + delay_ms
        assert p.advance(ms=delay_ms - 1) == []
        assert calls == []
        (run,) = p.advance(ms=1)
        assert (run.at_ms, run.due_ms, run.outcome) == (job.due_ms, job.due_ms, "succeeded")
        assert calls == [1]


def test_a_job_due_now_or_in_the_past_runs_at_once() -> None:
    with InMemoryPipeline([scripted("t", ["ok"])]) as p:
        p.clock.advance(hours=1)
        now = p.scheduler.schedule("t")
        past = p.scheduler.schedule("t", run_at="2030-01-01T00:00:00Z")
        runs = p.run_due()
        assert {r.job_id for r in runs} == {now.job_id, past.job_id}
        assert all(r.at_ms == p.clock() for r in runs)


def test_after_a_jump_of_the_clock_what_came_due_runs_late_once() -> None:
    calls: list[int] = []
    with InMemoryPipeline([scripted("t", ["ok"], calls)]) as p:
        job = p.scheduler.schedule("t", delay="5m")
        p.clock.advance(hours=2)  # every process down: nothing runs meanwhile
        assert calls == []
        (run,) = p.run_due()
        assert run.at_ms == job.due_ms + 115 * 60_000
        assert p.run_due() == []
        assert calls == [1]


# ------------------------------------------------------------ backoff


FIXED = Backoff(BackoffKind.FIXED, base_ms=5_000, jitter=False)
EXPO = Backoff(BackoffKind.EXPONENTIAL, base_ms=1_000, multiplier=3.0, max_ms=5_000, jitter=False)
NONE = Backoff(BackoffKind.NONE)


@pytest.mark.parametrize(
    ("backoff", "starts_s"),
    [
        (FIXED, [0, 5, 10, 15]),
        (EXPO, [0, 1, 4, 9]),  # 1 s, 3 s, then the 5 s cap
        (NONE, [0, 0, 0, 0]),
    ],
    ids=["fixed", "exponential-capped", "none"],
)
def test_retries_follow_the_tasks_backoff(backoff: Backoff, starts_s: list[int]) -> None:
    handler = scripted("t", ["fail", "fail", "fail", "ok"], max_attempts=4, backoff=backoff)
    with InMemoryPipeline([handler]) as p:
        job = p.scheduler.schedule("t")
        p.run_until_idle()
        runs = p.runs(job.job_id)
        assert [(r.at_ms - T0) // 1000 for r in runs] == starts_s
        assert [r.attempt for r in runs] == [1, 2, 3, 4]
        assert [r.outcome for r in runs] == ["retrying"] * 3 + ["succeeded"]
        for before, after in itertools.pairwise(runs):
            assert before.retry_at_ms == after.at_ms == after.not_before_ms


def test_the_jobs_backoff_counts_when_the_task_has_none() -> None:
    with InMemoryPipeline([scripted("t", ["fail", "ok"])]) as p:
        job = p.scheduler.schedule(
            "t", backoff={"kind": "fixed", "base_ms": 7_000, "jitter": False}
        )
        p.run_until_idle()
        assert [r.at_ms - T0 for r in p.runs(job.job_id)] == [0, 7_000]
        jittered = p.scheduler.schedule("t", job_id="j", backoff="fixed:7s")  # jitter: on
        p.run_until_idle()
        first, second = p.runs(jittered.job_id)
        assert first.at_ms <= second.at_ms <= first.at_ms + 7_000


def test_jitter_is_drawn_from_the_seeded_source_within_the_window() -> None:
    jittered = Backoff(BackoffKind.EXPONENTIAL, base_ms=10_000, max_ms=60_000, jitter=True)

    def delays(seed: int) -> list[int]:
        handler = scripted("t", ["fail"] * 5 + ["ok"], max_attempts=6, backoff=jittered)
        with InMemoryPipeline([handler], seed=seed) as p:
            job = p.scheduler.schedule("t")
            p.run_until_idle()
            return [(r.retry_at_ms or 0) - r.finished_ms for r in p.runs(job.job_id)[:-1]]

    first = delays(1)
    assert first == delays(1)  # the same seed: the same delays
    assert first != delays(2)
    for attempt, delay in enumerate(first, start=1):
        capped = compute_backoff(attempt=attempt, policy=jittered, tiers_ms=[1], rand=0.999999)
        assert 0 <= delay <= capped  # full jitter: uniform in [0, capped]


def test_without_a_backoff_the_queues_retry_tiers_apply_in_order() -> None:
    settings = Settings(queues=(QueueSpec("default", retry_tiers_ms=(1_000, 10_000, 60_000)),))
    handler = scripted("t", ["fail"] * 5 + ["ok"], max_attempts=6)
    with InMemoryPipeline([handler], settings=settings) as p:
        job = p.scheduler.schedule("t")
        p.run_until_idle()
        runs = p.runs(job.job_id)
        assert [r.retry_tier for r in runs[:-1]] == ["1s", "10s", "1m", "1m", "1m"]
        gaps = [b.at_ms - a.finished_ms for a, b in itertools.pairwise(runs)]
        assert gaps == [1_000, 10_000, 60_000, 60_000, 60_000]
        assert [r.source[0] for r in runs] == [
            "dueflow.exec.default",
            "dueflow.retry.default.1s",
            "dueflow.retry.default.10s",
            "dueflow.retry.default.1m",
            "dueflow.retry.default.1m",
            "dueflow.retry.default.1m",
        ]


def test_a_retry_keeps_the_jobs_due_time_key_and_payload() -> None:
    with InMemoryPipeline([scripted("t", ["fail", "ok"])]) as p:
        job = p.scheduler.schedule("t", {"n": 1}, delay="1m", idempotency_key="order-1")
        p.run_until_idle()
        first, second = p.runs(job.job_id)
        assert second.due_ms == first.due_ms == job.due_ms
        assert second.idempotency_key == "order-1"
        assert second.payload == first.payload == {"n": 1}


# ------------------------------------------------------------ dead letters


@pytest.mark.parametrize(
    ("script", "max_attempts", "outcomes", "reason", "error_type"),
    [
        (["fail"], 3, ["retrying", "retrying", "dead"], "exhausted", "ConnectionError"),
        (["fail"], 1, ["dead"], "exhausted", "ConnectionError"),
        (["permanent"], 5, ["dead"], "permanent_error", "dueflow.errors.PermanentJobError"),
        (["fail", "permanent"], 5, ["retrying", "dead"], "permanent_error", None),
        (["timeout"], 2, ["retrying", "dead"], "timeout", "dueflow.consumers.failures.JobTimeout"),
        (["fail", "fail", "ok"], 3, ["retrying", "retrying", "succeeded"], None, None),
    ],
)
def test_what_keeps_failing_reaches_the_dlq_with_its_reason_and_attempts(
    script: list[str],
    max_attempts: int,
    outcomes: list[str],
    reason: str | None,
    error_type: str | None,
) -> None:
    calls: list[int] = []
    handler = scripted("t", script, calls, max_attempts=max_attempts, backoff=FIXED)
    with InMemoryPipeline([handler]) as p:
        job = p.scheduler.schedule("t", {"order": 9})
        p.run_until_idle()
        assert [r.outcome for r in p.runs(job.job_id)] == outcomes
        assert calls == list(range(1, len(outcomes) + 1))  # each attempt ran once
        state = p.job(job.job_id)
        if reason is None:
            assert state.state == "succeeded"
            assert p.dead_letters() == []
            return
        assert state.state == "dead"
        (dead,) = p.dead_letters()
        assert dead is not None
        assert state.dead_letter == dead
        assert (dead.job_id, dead.reason, dead.attempts) == (job.job_id, reason, len(outcomes))
        assert p.runs(job.job_id)[-1].dead_reason == reason
        if error_type is not None:
            assert dead.error_type == error_type
        assert dead.details()["traceback"].startswith("Traceback")
        assert dead.details()["original"] == "dueflow.exec.default:" + ":".join(
            str(x) for x in p.runs(job.job_id)[0].source[1:]
        )


def test_a_job_for_a_task_no_worker_knows_is_dead_without_running() -> None:
    with InMemoryPipeline([scripted("known", ["ok"])]) as p:
        job = p.scheduler.schedule("nobody-handles-this")
        (decision,) = p.run_due()
        assert (decision.outcome, decision.ran, decision.dead_reason) == (
            "dead",
            False,
            "unknown_task",
        )
        assert p.runs() == []
        (dead,) = p.dead_letters()
        assert dead.job_id == job.job_id
        assert dead.attempts == 0
        assert "no handler for task 'nobody-handles-this'" in dead.summary()["error_message"]


# ------------------------------------------------------------ timeouts


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown: lets an abandoned handler thread finish."""
    event = threading.Event()
    yield event
    event.set()


def test_a_sync_handler_that_overruns_its_timeout_fails_the_attempt(
    release: threading.Event,
) -> None:
    started: list[int] = []

    @task("stuck", timeout=0.05, max_attempts=2, backoff=FIXED)
    def stuck(payload: Any, ctx: Any) -> None:
        started.append(ctx.attempt)
        release.wait(30)

    with InMemoryPipeline([stuck]) as p:
        job = p.scheduler.schedule("stuck")
        p.run_until_idle()
        runs = p.runs(job.job_id)
        assert [(r.outcome, r.timed_out) for r in runs] == [("retrying", True), ("dead", True)]
        assert runs[0].error == (
            "dueflow.consumers.failures.JobTimeout: handler overran its timeout of 0.05 s"
        )
        assert all(0.05 <= r.seconds < 5 for r in runs)
        assert started == [1, 2]
        assert p.dead_letters()[0].reason == "timeout"


def test_an_async_handler_is_cancelled_at_its_timeout() -> None:
    cancelled: list[int] = []

    @task("slow", timeout=0.05, max_attempts=1)
    async def slow(payload: Any, ctx: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise

    with InMemoryPipeline([slow]) as p:
        job = p.scheduler.schedule("slow")
        (run,) = p.run_due()
        assert (run.outcome, run.timed_out, run.dead_reason) == ("dead", True, "timeout")
        assert cancelled == [1]
        assert p.job(job.job_id).state == "dead"


def test_an_async_handlers_own_timeout_error_is_an_ordinary_failure() -> None:
    @task("own", timeout=30, max_attempts=1)
    async def own(payload: Any, ctx: Any) -> None:
        await asyncio.wait_for(asyncio.sleep(1), timeout=0.001)

    with InMemoryPipeline([own]) as p:
        p.scheduler.schedule("own")
        (run,) = p.run_due()
        assert (run.outcome, run.timed_out, run.dead_reason) == ("dead", False, "exhausted")
        assert run.error_type == "TimeoutError"


def test_the_timeout_precedence_is_the_workers_task_then_job() -> None:
    seen: list[float] = []

    @task("t")
    def plain(payload: Any, ctx: Any) -> None:
        seen.append(ctx.job.timeout_ms or 0)

    settings = Settings(queues=(QueueSpec("default"),))
    with InMemoryPipeline([plain], settings=settings) as p:
        p.scheduler.schedule("t", timeout="2s")
        (run,) = p.run_due()
        assert run.outcome == "succeeded"
        assert seen == [2_000]
        assert run.max_attempts == settings.worker.default_max_attempts


def test_async_handlers_run_when_the_test_itself_is_async() -> None:
    seen: list[str] = []

    @task("a")
    async def handler(payload: Any, ctx: Any) -> None:
        await asyncio.sleep(0)
        seen.append(payload)

    async def scenario() -> list[str]:
        with InMemoryPipeline([handler]) as p:
            p.scheduler.schedule("a", "hello")
            return [r.outcome for r in p.run_due()]

    assert asyncio.run(scenario()) == ["succeeded"]
    assert seen == ["hello"]
