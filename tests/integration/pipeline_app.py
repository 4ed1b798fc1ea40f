"""Task handlers of the full-pipeline tests (run by ``dueflow worker`` subprocesses).

``ok`` succeeds, ``flaky`` fails its first attempt and succeeds on the next,
``doomed`` fails every attempt (two at most): it ends in the DLQ.
"""

from __future__ import annotations

from typing import Any

from dueflow.consumers import TaskContext, task

QUEUE = "jobs"


@task("ok", queue=QUEUE)
def ok(payload: Any, ctx: TaskContext) -> None:
    return None


@task("flaky", queue=QUEUE)
def flaky(payload: Any, ctx: TaskContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@task("doomed", queue=QUEUE, max_attempts=2)
def doomed(payload: Any, ctx: TaskContext) -> None:
    raise RuntimeError(f"attempt {ctx.attempt} fails too")
