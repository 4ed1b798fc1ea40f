"""The executor reports what a handler returned, on every path (async without and with
awaiting, a thread, a child process); a child's progress reaches the attempt (no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.failures import Failure
from dueflow.model import Job
from dueflow.observability.metrics import Metrics
from dueflow.records.job_result import JobResult, Progress

JOB = Job("j", "q", "t", b"null", 0, "k", 0)
FIELDS = tuple(getattr(JOB, f) for f in Job.__slots__)


class Owner:
    """The attempt a context reports progress to (a worker's delivery in production)."""

    planner = None

    def __init__(self) -> None:
        self.progress: list[Progress] = []

    def progressed(self, value: Progress) -> None:
        self.progress.append(value)


def ctx(owner: Owner | None = None) -> TaskContext:
    return TaskContext(
        FIELDS, attempt=1, max_attempts=3, headers={}, source=("t", 0, 0), owner=owner
    )


@task("returns-now")
async def returns_now(payload: Any, ctx: TaskContext) -> dict[str, int]:
    return {"n": 1}


@task("returns-later")
async def returns_later(payload: Any, ctx: TaskContext) -> list[int]:
    await asyncio.sleep(0.01)
    return [1, 2]


@task("returns-in-a-thread")
def returns_in_a_thread(payload: Any, ctx: TaskContext) -> str:
    return "done"


@task("returns-in-a-child", isolation="process")
def returns_in_a_child(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    """Module level: a child process imports it."""
    ctx.progress(0.5, {"step": "half"})
    ctx.progress(0.9)
    return {"sum": sum(payload), "set": None}


@task("fails-in-a-thread")
def fails_in_a_thread(payload: Any, ctx: TaskContext) -> str:
    raise ValueError("no")


REG = TaskRegistry(
    [returns_now, returns_later, returns_in_a_thread, returns_in_a_child, fails_in_a_thread]
)


def entry(name: str) -> Any:
    found = REG.get(name)
    assert found is not None
    return found


def test_every_path_reports_the_return_value() -> None:
    async def main() -> tuple[dict[str, tuple[Failure | None, Any]], list[Progress]]:
        ex = JobExecutor(concurrency=2, metrics=Metrics(), isolated_processes=1)
        got: dict[str, tuple[Failure | None, Any]] = {}
        done = asyncio.Event()
        owner = Owner()

        def report(job: Any, failure: Failure | None, seconds: float, returned: Any) -> None:
            got[job] = (failure, returned)
            if len(got) == 5:
                done.set()

        try:
            ex.run("now", entry("returns-now"), None, ctx(), 5.0, report)
            assert got["now"] == (None, {"n": 1})  # reported at once, no Task
            ex.run("later", entry("returns-later"), None, ctx(), 5.0, report)
            ex.run("thread", entry("returns-in-a-thread"), None, ctx(), 5.0, report)
            ex.run("fails", entry("fails-in-a-thread"), None, ctx(), 5.0, report)
            ex.run("child", entry("returns-in-a-child"), [4, 5], ctx(owner), 60.0, report)
            async with asyncio.timeout(60):
                await done.wait()
        finally:
            await ex.close()
        return got, owner.progress

    got, progress = asyncio.run(main())
    assert got["later"] == (None, [1, 2])
    assert got["thread"] == (None, "done")
    failure, returned = got["fails"]
    assert failure is not None
    assert returned is None
    # a child answers with its value as JSON (the worker applies the cap)
    assert got["child"] == (None, JobResult(b'{"sum":9,"set":null}'))
    # its progress: what the child sent while it ran and the last value with its answer
    assert progress[-1] == Progress(0.9, None)
    assert set(progress) <= {Progress(0.5, b'{"step":"half"}'), Progress(0.9, None)}
