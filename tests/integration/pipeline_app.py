"""Task handlers of the full-pipeline tests (run by ``dueflow worker`` subprocesses).

``ok`` succeeds, ``flaky`` fails its first attempt and succeeds on the next,
``doomed`` fails every attempt (two at most): it ends in the DLQ; ``until_fixed``
fails while a marker file exists.
"""

from __future__ import annotations

from pathlib import Path
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


@task("until_fixed", queue=QUEUE, max_attempts=1)
def until_fixed(payload: Any, ctx: TaskContext) -> None:
    """Fails while the file ``payload["marker"]`` exists (the bug is not fixed yet),
    with an error text a page must show as text, never run."""
    if Path(payload["marker"]).exists():
        raise RuntimeError(
            "<script>window.__xss = 1</script><img src=x onerror=alert(1)> not fixed"
        )
