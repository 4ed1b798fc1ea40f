"""dueflow.consumers: the worker runtime.

Register handlers with :func:`task`, build a :class:`TaskRegistry`, run a
:class:`Worker` (or ``dueflow worker --app mypkg.tasks``).
"""

from __future__ import annotations

from dueflow.consumers.context import TaskContext
from dueflow.consumers.registry import RegisteredTask, TaskRegistry, TaskSpec, task
from dueflow.follow_up import FollowUp

__all__ = ["FollowUp", "RegisteredTask", "TaskContext", "TaskRegistry", "TaskSpec", "task"]
