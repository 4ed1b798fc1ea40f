"""A task for the hostile-output test: it fails with the error text its payload gives."""

from __future__ import annotations

from typing import Any

from dueflow.consumers import TaskContext, task
from dueflow.errors import PermanentJobError


@task("explode", queue="jobs")
def explode(payload: Any, ctx: TaskContext) -> None:
    raise PermanentJobError(str(payload["message"]))
