"""dueflow.consumers: the worker runtime.

Register handlers with :func:`task` and lifecycle hooks with :func:`on_startup`,
:func:`on_shutdown` and :func:`on_failure`, build a :class:`TaskRegistry`, run a
:class:`Worker` (or ``dueflow worker --app mypkg.tasks``).
"""

from __future__ import annotations

from dueflow.consumers.context import TaskContext
from dueflow.consumers.hooks import WorkerInfo, on_failure, on_shutdown, on_startup
from dueflow.consumers.registry import RegisteredTask, TaskRegistry, TaskSpec, task
from dueflow.records.follow_up import FollowUp

__all__ = [
    "FollowUp",
    "RegisteredTask",
    "TaskContext",
    "TaskRegistry",
    "TaskSpec",
    "WorkerInfo",
    "on_failure",
    "on_shutdown",
    "on_startup",
    "task",
]
