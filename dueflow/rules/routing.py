"""Which queue a task's jobs go to (pure).

Precedence, first match wins:

1. an explicit queue (``schedule(..., queue="billing")``, ``--queue``);
2. the route table of the settings (``[routes]`` in TOML, ``DUEFLOW_ROUTES``):
   an exact task name first, then the globs (``billing.*``, ``report-?``) in
   the order they are written;
3. the task's ``@task(queue=...)`` declaration, when the SDK knows the app
   module (``Scheduler(settings, app="myapp.tasks")``, ``app`` setting);
4. the queue ``default``.

The route table comes before ``@task`` so that an operator can move a task to
another queue by configuration, without a code change; workers resolve the
queues they serve by the same rule (:func:`served_queues`), so producers and
workers agree. The resolved queue must still exist (static config or the
queue registry): routing never creates a queue.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_QUEUE = "default"
_GLOB_CHARS = frozenset("*?[")
_CACHE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class Route:
    """Where a task goes and why: ``source`` is explicit, routes, task or default."""

    queue: str
    source: str
    rule: str = ""  # the route pattern that matched


class Router:
    """Resolves a task's queue by the precedence of the module doc."""

    def __init__(
        self,
        routes: Sequence[tuple[str, str]] = (),
        declared: Mapping[str, str] | None = None,
        *,
        default: str = DEFAULT_QUEUE,
    ) -> None:
        self.routes = tuple(routes)
        self.declared = dict(declared or {})
        self.default = default
        self._exact: dict[str, str] = {}
        self._globs: list[tuple[str, re.Pattern[str], str]] = []
        for pattern, queue in self.routes:
            if _GLOB_CHARS & set(pattern):
                self._globs.append((pattern, re.compile(fnmatch.translate(pattern)), queue))
            else:
                self._exact.setdefault(pattern, queue)
        self._memo: dict[str, str] = {}

    def resolve(self, task: str, queue: str | None = None) -> Route:
        """The queue of a job of ``task`` (``queue``: the caller's explicit choice)."""
        if queue is not None:
            return Route(queue, "explicit")
        found = self._exact.get(task)
        if found is not None:
            return Route(found, "routes", task)
        for pattern, regex, target in self._globs:
            if regex.match(task):
                return Route(target, "routes", pattern)
        declared = self.declared.get(task)
        if declared is not None:
            return Route(declared, "task")
        return Route(self.default, "default")

    def routed(self, task: str) -> bool:
        """True when the route table names ``task``, exactly or by a glob."""
        return task in self._exact or any(regex.match(task) for _, regex, _ in self._globs)

    def queue_for(self, task: object) -> str:
        """:meth:`resolve` without an explicit queue, memoized (the bulk path)."""
        if not isinstance(task, str):
            return self.default  # the task check that follows names the bad value
        try:
            return self._memo[task]
        except KeyError:
            pass
        queue = self.resolve(task).queue
        if len(self._memo) < _CACHE_LIMIT:
            self._memo[task] = queue
        return queue

    @property
    def trivial(self) -> bool:
        """True when every task goes to the default queue (nothing to resolve)."""
        return not self.routes and not self.declared


def served_queues(router: Router, tasks: Iterable[str]) -> list[str]:
    """The queues a worker with handlers for ``tasks`` serves: where each one's
    jobs go, in order of first appearance."""
    return list(dict.fromkeys(router.queue_for(t) for t in tasks))
