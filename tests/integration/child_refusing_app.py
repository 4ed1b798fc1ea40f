"""A worker app that imports in the supervisor but raises in every child it spawns.

The parent imports the app before it starts children (a bad app fails at once
there), so children that die at start need an app whose import fails only in them.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from dueflow.consumers import TaskContext, task

if multiprocessing.parent_process() is not None:
    raise RuntimeError("child_refusing_app will not load in a worker child")


@task("never-runs", queue="jobs")
def never_runs(payload: Any, ctx: TaskContext) -> None:
    """Registered so the parent's import finds a task."""
