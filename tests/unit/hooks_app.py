"""An app module for the hook tests: hooks beside a task, found by from_modules."""

from __future__ import annotations

from typing import Any

from dueflow.consumers import TaskContext, WorkerInfo, on_failure, on_shutdown, on_startup, task

CALLS: list[tuple[str, Any]] = []


@task("hooked")
def hooked(payload: Any, ctx: TaskContext) -> None:
    CALLS.append(("task", payload))


@on_startup
def started(worker: WorkerInfo) -> None:
    CALLS.append(("startup", worker.worker_id))


@on_shutdown
async def stopped(worker: WorkerInfo) -> None:
    CALLS.append(("shutdown", worker.worker_id))


@on_failure
def failed(job: TaskContext, error: Any, will_retry: bool) -> None:
    CALLS.append(("failure", (job.job_id, error.summary, will_retry)))
