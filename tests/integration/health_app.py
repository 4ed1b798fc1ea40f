"""Task handlers of the health-probe tests (run by ``dueflow worker`` subprocesses).

``wedge`` is an async handler that blocks its event loop with a synchronous
sleep: the bug the liveness probe exists to catch.
"""

from __future__ import annotations

import time
from typing import Any

from dueflow.consumers import TaskContext, task

QUEUE = "jobs"


@task("wedge", queue=QUEUE)
async def wedge(payload: Any, ctx: TaskContext) -> None:
    time.sleep(float(payload["seconds"]))  # noqa: ASYNC251 (blocks the loop on purpose)


@task("ok", queue=QUEUE)
def ok(payload: Any, ctx: TaskContext) -> None:
    return None
