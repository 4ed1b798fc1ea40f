"""Running handlers: eager async start, threads, timeouts, orphans (no broker)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.execution import HandlerThreads, JobExecutor
from dueflow.consumers.failures import Failure
from dueflow.errors import PermanentJobError
from dueflow.model import Job
from dueflow.observability.metrics import Metrics

JOB = Job("j", "q", "t", b"null", 0, "k", 0)
FIELDS = tuple(getattr(JOB, f) for f in Job.__slots__)


def ctx() -> TaskContext:
    return TaskContext(FIELDS, attempt=1, max_attempts=3, headers={}, source=("t", 0, 0))


class Results:
    def __init__(self) -> None:
        self.items: dict[Any, tuple[Failure | None, float]] = {}
        self.event = asyncio.Event()

    def __call__(self, job: Any, failure: Failure | None, seconds: float) -> None:
        assert job not in self.items, "reported twice"
        self.items[job] = (failure, seconds)
        self.event.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.items) < count:
                self.event.clear()
                await self.event.wait()


@task("noop")
async def noop(payload: Any, ctx: TaskContext) -> None:
    return None


@task("raises")
async def raises(payload: Any, ctx: TaskContext) -> None:
    raise PermanentJobError("nope")


@task("awaits", timeout=5)
async def awaits(payload: Any, ctx: TaskContext) -> None:
    await asyncio.sleep(0.01)
    raise ValueError("after awaiting")


REG = TaskRegistry([noop, raises, awaits])


def entry(name: str) -> Any:
    found = REG.get(name)
    assert found is not None
    return found


def test_an_async_handler_that_does_not_suspend_finishes_inside_run() -> None:
    async def main() -> None:
        ex = JobExecutor(concurrency=2, metrics=Metrics())
        res = Results()
        ex.run("a", entry("noop"), None, ctx(), 1.0, res)
        assert res.items["a"][0] is None  # reported synchronously, no Task
        ex.run("b", entry("raises"), None, ctx(), 1.0, res)
        failure = res.items["b"][0]
        assert failure is not None
        assert failure.permanent
        assert failure.error_type == "dueflow.errors.PermanentJobError"
        ex.run("c", entry("awaits"), None, ctx(), 1.0, res)
        assert "c" not in res.items
        assert ex.in_flight == 1
        await res.wait(3)
        failure = res.items["c"][0]
        assert failure is not None
        assert failure.error_type == "ValueError"
        assert not failure.permanent
        assert "after awaiting" in failure.traceback
        assert ex.in_flight == 0
        await ex.close()

    asyncio.run(main())


def test_timeouts_cancel_async_handlers_and_orphan_sync_threads() -> None:
    release = threading.Event()
    cancelled = []

    @task("stuck-async")
    async def stuck_async(payload: Any, c: TaskContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    orphan_done = threading.Event()

    @task("stuck-sync")
    def stuck_sync(payload: Any, c: TaskContext) -> None:
        release.wait(30)
        orphan_done.set()

    @task("quick-sync")
    def quick_sync(payload: Any, c: TaskContext) -> None:
        return None

    reg = TaskRegistry([stuck_async, stuck_sync, quick_sync])

    async def main() -> None:
        metrics = Metrics()
        ex = JobExecutor(concurrency=1, metrics=metrics)
        res = Results()
        started = time.monotonic()
        ex.run("async", reg.get("stuck-async"), None, ctx(), 0.2, res)  # type: ignore[arg-type]
        ex.run("sync", reg.get("stuck-sync"), None, ctx(), 0.3, res)  # type: ignore[arg-type]
        await res.wait(2)
        assert time.monotonic() - started < 2
        for job in ("async", "sync"):
            failure = res.items[job][0]
            assert failure is not None
            assert failure.timed_out
            assert failure.error_type == "dueflow.consumers.failures.JobTimeout"
        await asyncio.sleep(0)  # let the cancelled task run its handler
        assert cancelled == [True]
        assert ex.orphans == 1
        assert metrics.registry.get_sample_value("dueflow_worker_orphaned_threads") == 1
        # The pool started a replacement: a sync job still runs with concurrency 1.
        ex.run("next", reg.get("quick-sync"), None, ctx(), 5.0, res)  # type: ignore[arg-type]
        await res.wait(3)
        assert res.items["next"][0] is None
        release.set()
        async with asyncio.timeout(10):
            await asyncio.to_thread(orphan_done.wait)
            for _turn in range(1_000):  # the late completion arrives through call_soon
                if not ex.orphans:
                    break
                await asyncio.sleep(0)
        assert ex.orphans == 0
        assert len(res.items) == 3  # the late result of the orphan was not reported
        await ex.close()

    asyncio.run(main())


def test_too_many_orphans_stop_the_worker() -> None:
    release = threading.Event()

    @task("stuck")
    def stuck(payload: Any, c: TaskContext) -> None:
        release.wait(30)

    reg = TaskRegistry([stuck])
    reasons: list[str] = []

    async def main() -> None:
        ex = JobExecutor(concurrency=1, metrics=Metrics(), max_orphans=1, on_fatal=reasons.append)
        res = Results()
        for i in range(2):
            ex.run(i, reg.get("stuck"), None, ctx(), 0.05, res)  # type: ignore[arg-type]
        await res.wait(2)
        release.set()
        await ex.close()

    asyncio.run(main())
    assert reasons
    assert "isolation='process'" in reasons[0]


def test_handler_threads_grow_for_orphans_and_shrink_back() -> None:
    pool = HandlerThreads(1)
    gate = threading.Event()
    done = threading.Event()

    def blocked() -> None:
        gate.wait(10)

    pool.submit(blocked)
    pool.orphaned()  # the first thread is stuck: a second one serves
    pool.submit(done.set)
    assert done.wait(5)
    gate.set()
    pool.returned()
    pool.close()


@pytest.mark.parametrize("timeout", [0.0001])
def test_wait_idle_reports_a_busy_executor(timeout: float) -> None:
    async def main() -> None:
        ex = JobExecutor(concurrency=1, metrics=Metrics())
        res = Results()
        ex.run("c", entry("awaits"), None, ctx(), 1.0, res)
        assert not await ex.wait_idle(timeout)
        assert await ex.wait_idle(5)
        await ex.close()

    asyncio.run(main())
