"""The queues a worker consumes: those asked for (``--queues``), else those its
tasks route to (:func:`~dueflow.rules.routing.served_queues`: ``[routes]``, then
``@task``), else every static queue."""

from __future__ import annotations

from collections.abc import Sequence

from dueflow.config import Settings
from dueflow.consumers.registry import TaskRegistry
from dueflow.errors import ConfigError
from dueflow.rules.routing import Router, served_queues


def select_queues(
    settings: Settings, registry: TaskRegistry, queues: Sequence[str] | None
) -> list[str]:
    """The queues to consume: those asked for, else where the registry's tasks are
    routed (the producers' rule, :mod:`dueflow.rules.routing`), else every static queue.
    Whether they exist is known once the queue registry is read (:meth:`Worker.run`)."""
    router = Router(settings.routes, {t.spec.name: t.spec.queue for t in registry})
    tasks = [t.spec.name for t in registry]
    chosen = list(dict.fromkeys(queues or served_queues(router, tasks) or settings.queue_names))
    if not chosen:
        raise ConfigError("queues", chosen, "at least one queue to consume")
    return chosen
