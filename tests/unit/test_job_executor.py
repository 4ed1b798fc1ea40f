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
from dueflow.consumers.loop_watch import LoopWatch
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
        self.returned: dict[Any, Any] = {}
        self.event = asyncio.Event()

    def __call__(self, job: Any, failure: Failure | None, seconds: float, returned: Any) -> None:
        assert job not in self.items, "reported twice"
        self.items[job] = (failure, seconds)
        self.returned[job] = returned
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


# --------------------------------------------------------------------------- a blocked loop

BLOCKED = "dueflow.consumers.failures.JobTimeout"


def test_an_async_handler_that_blocks_past_its_timeout_is_a_timeout_not_a_success() -> None:
    """Its whole run happens in the eager first step, which nothing on the loop can
    cut short: once it returns past its deadline, it timed out."""

    @task("blocks")
    async def blocks(payload: Any, c: TaskContext) -> None:
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the event loop is the test

    @task("blocks-after-await")
    async def blocks_after_await(payload: Any, c: TaskContext) -> None:
        await asyncio.sleep(0)
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the event loop is the test

    reg = TaskRegistry([blocks, blocks_after_await])

    async def main() -> None:
        ex = JobExecutor(concurrency=2, metrics=Metrics())
        res = Results()
        ex.run("eager", reg.get("blocks"), None, ctx(), 0.1, res)  # type: ignore[arg-type]
        ex.run("task", reg.get("blocks-after-await"), None, ctx(), 0.1, res)  # type: ignore[arg-type]
        await res.wait(2)
        for job in ("eager", "task"):
            failure = res.items[job][0]
            assert failure is not None, job
            assert failure.timed_out
            assert failure.error_type == BLOCKED
            assert "blocking the event loop" in failure.message
        await ex.close()

    asyncio.run(main())


def _claim_while_blocked(watch: LoopWatch, taken: list[Any], after_s: float) -> threading.Thread:
    """A stand-in for the watchdog: claims the step that runs after ``after_s``."""

    def claim() -> None:
        time.sleep(after_s)
        running = watch.step
        assert running is not None, "no handler step is running"
        assert watch.claim(running, lambda: taken.append(running.job))

    thread = threading.Thread(target=claim)
    thread.start()
    return thread


@pytest.mark.parametrize("where", ["first step", "later step"])
def test_a_claimed_attempt_is_reported_timed_out_and_its_late_result_dropped(where: str) -> None:
    finished: list[str] = []

    @task("slow-but-fine")
    async def slow_first(payload: Any, c: TaskContext) -> None:
        if where == "later step":
            await asyncio.sleep(0)
        try:
            time.sleep(0.4)  # noqa: ASYNC251 - blocking the event loop is the test
            await asyncio.sleep(0)  # suspends once more: the claim ends it here
            finished.append("resumed")
        finally:
            finished.append("finally")

    reg = TaskRegistry([slow_first])

    async def main() -> None:
        watch = LoopWatch()
        ex = JobExecutor(concurrency=1, metrics=Metrics(), watch=watch)
        res = Results()
        taken: list[Any] = []
        claimer = _claim_while_blocked(watch, taken, 0.15)
        # a long timeout: only the claim can make it a timeout
        ex.run("job", reg.get("slow-but-fine"), None, ctx(), 30.0, res)  # type: ignore[arg-type]
        await res.wait(1)
        claimer.join()
        assert taken == ["job"]
        failure = res.items["job"][0]
        assert failure is not None
        assert failure.timed_out
        assert failure.error_type == BLOCKED
        await asyncio.sleep(0.05)
        assert finished == ["finally"]  # closed at its suspension, never resumed
        assert ex.in_flight == 0
        await ex.close()

    asyncio.run(main())


def test_steps_are_marked_for_the_watchdog_and_cleared_between_them() -> None:
    seen: list[Any] = []

    async def main() -> None:
        watch = LoopWatch()

        @task("looks")
        async def looks(payload: Any, c: TaskContext) -> None:
            seen.append(watch.step.job if watch.step else None)
            await asyncio.sleep(0)
            seen.append(watch.step.job if watch.step else None)

        ex = JobExecutor(concurrency=1, metrics=Metrics(), watch=watch)
        res = Results()
        ex.run("job", TaskRegistry([looks]).get("looks"), None, ctx(), 5.0, res)  # type: ignore[arg-type]
        assert watch.step is None  # suspended: between steps
        await res.wait(1)
        assert watch.step is None
        assert res.items["job"][0] is None
        await ex.close()

    asyncio.run(main())
    assert seen == ["job", "job"]


def test_the_hard_memory_ceiling_fails_a_lone_attempt_only() -> None:
    @task("waits")
    async def waits(payload: Any, c: TaskContext) -> None:
        await asyncio.sleep(30)

    reg = TaskRegistry([waits])
    failure = Failure("dueflow.consumers.failures.WorkerMemoryExceeded", "too big")

    async def main() -> None:
        ex = JobExecutor(concurrency=2, metrics=Metrics())
        res = Results()
        ex.run("a", reg.get("waits"), None, ctx(), 30.0, res)  # type: ignore[arg-type]
        ex.run("b", reg.get("waits"), None, ctx(), 30.0, res)  # type: ignore[arg-type]
        assert ex.fail_alone(failure) is False  # two run: neither can be told the cause
        assert res.items == {}
        ex.abandon()
        ex.run("c", reg.get("waits"), None, ctx(), 30.0, res)  # type: ignore[arg-type]
        assert ex.fail_alone(failure) is True
        assert res.items["c"][0] is failure
        assert ex.in_flight == 0
        await ex.close()

    asyncio.run(main())
