"""Worker lifecycle hooks: declaring, finding and running them (no broker).

Startup hooks run in order before the worker makes any Kafka client, and the
first one that fails stops it with an error naming the hook; shutdown hooks
all run; failure hooks run beside the worker, bounded, each counted; a hook
that raises is logged and counted, never raised into the worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from dueflow.config import load_settings
from dueflow.consumers import TaskContext, TaskRegistry, WorkerInfo, on_failure, on_startup
from dueflow.consumers.failures import Failure
from dueflow.consumers.hooks import (
    FAILURE,
    MAX_WAITING,
    SHUTDOWN,
    STARTUP,
    HookRunner,
    WorkerHooks,
    on_shutdown,
    will_retry,
)
from dueflow.consumers.worker_process import Worker
from dueflow.errors import InvalidInput, WorkerStartupFailed
from dueflow.observability.metrics import Metrics
from tests.unit import hooks_app

INFO = WorkerInfo("w-1", ("default",), ("hooked",))


def count(metrics: Metrics, kind: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "dueflow_worker_hook_calls_total", {"hook": kind, "result": result}
    )
    return value or 0.0


# ------------------------------------------------------------------ declaring


def test_a_decorator_marks_the_function_and_returns_it_unchanged() -> None:
    def ready(worker: WorkerInfo) -> str:
        return "ready"

    assert on_startup(ready) is ready
    assert ready(INFO) == "ready"


@pytest.mark.parametrize(
    ("decorate", "args"),
    [(on_startup, "(worker)"), (on_shutdown, "(worker)"), (on_failure, "(job, error, will_retry)")],
)
def test_a_hook_with_the_wrong_arguments_is_refused_where_it_is_declared(
    decorate: Any, args: str
) -> None:
    def wrong(a: Any, b: Any, c: Any, d: Any) -> None: ...

    with pytest.raises(InvalidInput, match=rf"a function taking \{args[:-1]}\)"):
        decorate(wrong)


def test_the_app_modules_hooks_are_found_beside_its_tasks() -> None:
    registry = TaskRegistry.from_modules(["tests.unit.hooks_app", "tests.unit.hooks_only_app"])
    assert [t.spec.name for t in registry] == ["hooked"]
    assert [(h.kind, h.ref) for h in registry.hooks] == [
        (STARTUP, "tests.unit.hooks_app:started"),
        (STARTUP, "tests.unit.hooks_only_app:ready"),
        (SHUTDOWN, "tests.unit.hooks_app:stopped"),
        (FAILURE, "tests.unit.hooks_app:failed"),
    ]
    assert [h.is_async for h in registry.hooks.of(SHUTDOWN)] == [True]


def test_a_registry_takes_hooks_beside_handlers() -> None:
    registry = TaskRegistry([hooks_app.hooked, hooks_app.started, hooks_app.failed])
    assert len(registry) == 1
    assert len(registry.hooks) == 2
    assert registry.hooks.failure


@pytest.mark.parametrize(
    ("permanent", "attempt", "max_attempts", "retried"),
    [(False, 1, 3, True), (False, 3, 3, False), (True, 1, 3, False), (False, 1, 1, False)],
)
def test_will_retry_is_the_recorders_rule(
    permanent: bool, attempt: int, max_attempts: int, retried: bool
) -> None:
    assert will_retry(permanent=permanent, attempt=attempt, max_attempts=max_attempts) is retried


# ------------------------------------------------------------------ running


def hooks_of(*fns: Any) -> WorkerHooks:
    hooks = WorkerHooks()
    for fn in fns:
        hooks.add(fn)
    return hooks


def test_startup_hooks_run_in_order_sync_and_async_and_the_first_failure_stops() -> None:
    calls: list[str] = []

    @on_startup
    def first(worker: WorkerInfo) -> None:
        calls.append(f"first on {threading.current_thread().name}")

    @on_startup
    async def second(worker: WorkerInfo) -> None:
        calls.append(f"second for {worker.worker_id}")

    @on_startup
    def broken(worker: WorkerInfo) -> None:
        raise ConnectionError("database refused")

    @on_startup
    def never(worker: WorkerInfo) -> None:
        calls.append("never")

    metrics = Metrics()
    runner = HookRunner(hooks_of(first, second, broken, never), metrics=metrics, timeout_s=5)
    with pytest.raises(WorkerStartupFailed) as err:
        asyncio.run(runner.startup(INFO))
    runner.close()
    assert calls == ["first on dueflow-hooks", "second for w-1"]  # sync ones off the loop
    assert err.value.hook.endswith("broken")
    assert str(err.value).endswith("failed: ConnectionError: database refused")
    assert isinstance(err.value.cause, ConnectionError)
    assert count(metrics, STARTUP, "ok") == 2
    assert count(metrics, STARTUP, "error") == 1


def test_a_startup_hook_that_hangs_fails_at_the_hook_timeout() -> None:
    release = threading.Event()

    @on_startup
    def hangs(worker: WorkerInfo) -> None:
        release.wait(10)

    runner = HookRunner(hooks_of(hangs), metrics=Metrics(), timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(WorkerStartupFailed, match=r"did not return within 0.2 s"):
        asyncio.run(runner.startup(INFO))
    assert time.monotonic() - started < 5
    release.set()
    runner.close()


def test_every_shutdown_hook_runs_and_a_failing_one_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    @on_shutdown
    def broken(worker: WorkerInfo) -> None:
        raise RuntimeError("flush failed")

    @on_shutdown
    async def closes(worker: WorkerInfo) -> None:
        calls.append("closed")

    metrics = Metrics()
    runner = HookRunner(hooks_of(broken, closes), metrics=metrics, timeout_s=5)
    with caplog.at_level(logging.ERROR, logger="dueflow.worker"):
        asyncio.run(runner.shutdown(INFO))
    runner.close()
    assert calls == ["closed"]
    assert count(metrics, SHUTDOWN, "error") == 1
    assert count(metrics, SHUTDOWN, "ok") == 1
    (line,) = [r for r in caplog.records if r.getMessage() == "worker hook failed"]
    assert getattr(line, "hook", "").endswith("broken")
    assert "flush failed" in getattr(line, "traceback", "")


def _ctx() -> TaskContext:
    return TaskContext.for_test("t", {}, job_id="j-1")


def test_failure_hooks_run_beside_the_worker_and_shutdown_waits_for_them() -> None:
    seen: list[tuple[str, str, bool]] = []
    gate = threading.Event()

    @on_failure
    def slow(job: TaskContext, error: Failure, will_retry: bool) -> None:
        gate.wait(5)
        seen.append((job.job_id, error.summary, will_retry))

    @on_failure
    async def raises(job: TaskContext, error: Failure, will_retry: bool) -> None:
        raise ValueError("the hook itself fails")

    metrics = Metrics()
    runner = HookRunner(hooks_of(slow, raises), metrics=metrics, timeout_s=5)

    async def main() -> None:
        runner.failed(_ctx(), Failure("ValueError", "no"), True)
        await asyncio.sleep(0)  # the worker's loop goes on: nothing waited for the hook
        assert seen == []
        gate.set()
        await runner.shutdown(INFO)  # waits for the failure hooks first

    asyncio.run(main())
    runner.close()
    assert seen == [("j-1", "ValueError: no", True)]
    assert count(metrics, FAILURE, "ok") == 1
    assert count(metrics, FAILURE, "error") == 1


def test_failure_hook_calls_beyond_the_bound_are_skipped_and_counted() -> None:
    gate = asyncio.Event()

    @on_failure
    async def waits(job: TaskContext, error: Failure, will_retry: bool) -> None:
        await gate.wait()

    metrics = Metrics()
    runner = HookRunner(hooks_of(waits), metrics=metrics, timeout_s=5)

    async def main() -> None:
        for _ in range(MAX_WAITING + 5):
            runner.failed(_ctx(), Failure("E", "x"), False)
        gate.set()
        await runner.drain()

    asyncio.run(main())
    assert count(metrics, FAILURE, "ok") == MAX_WAITING
    assert count(metrics, FAILURE, "skipped") == 5


def test_a_worker_whose_startup_hook_fails_makes_no_kafka_client() -> None:
    """The hook runs before the worker joins anything: against a cluster that does not
    exist, the worker stops at once with the hook's error, not a connection error."""

    @on_startup
    def broken(worker: WorkerInfo) -> None:
        raise ConnectionError("database refused")

    settings = load_settings(env={}, overrides={"bootstrap": "127.0.0.1:1"})
    worker = Worker(settings, TaskRegistry([hooks_app.hooked, broken]), worker_id="w-9")
    started = time.monotonic()
    with pytest.raises(WorkerStartupFailed, match="database refused"):
        asyncio.run(worker.run())
    assert time.monotonic() - started < 5
    assert worker.exit_code == 5
    assert worker.runtimes == []
    assert not worker.started
