"""A handler's context for a direct call (the test-side name of ``TaskContext.for_test``)."""

from __future__ import annotations

from typing import Any

from dueflow.consumers.context import TaskContext


def make_context(task: str = "test-task", payload: Any = None, **fields: Any) -> TaskContext:
    """A :class:`~dueflow.TaskContext` for calling a handler directly: see
    :meth:`TaskContext.for_test <dueflow.consumers.context.TaskContext.for_test>`
    for the fields (attempt, max_attempts, job_id, queue, idempotency_key, ...)."""
    return TaskContext.for_test(task, payload, **fields)
