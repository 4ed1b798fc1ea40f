"""Task handlers by name, without global state.

``@task(...)`` only attaches an immutable :class:`TaskSpec` to the function
and returns the function unchanged (it stays callable in tests). A
:class:`TaskRegistry` is built explicitly, from functions or by scanning
modules (``dueflow worker --app mypkg.tasks``)::

    @task("send-invoice", queue="billing", timeout=30, max_attempts=5)
    async def send_invoice(payload, ctx: TaskContext) -> None: ...

    registry = TaskRegistry.from_modules(["mypkg.tasks"])

Worker lifecycle hooks (``@on_startup``, ``@on_shutdown``, ``@on_failure``,
:mod:`dueflow.consumers.hooks`) in the same modules are found too, and kept in
:attr:`TaskRegistry.hooks`.

A handler receives the decoded payload and a :class:`TaskContext`. It fails
the attempt by raising: any exception is retriable, except
:class:`~dueflow.errors.PermanentJobError`, which skips the retries.

Retry settings, most specific first: the task's (``@task(max_attempts=,
backoff=, timeout=)``), then the job record's (``max_attempts``,
``backoff``, ``timeout_ms``), then the worker's defaults
(``worker.default_max_attempts``, ``worker.default_timeout_s``) and the
queue's retry tiers.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from dueflow.config import RESULT_MAX_BYTES_LIMIT
from dueflow.consumers.hooks import WorkerHooks, hook_kind
from dueflow.errors import InvalidInput
from dueflow.model import Backoff
from dueflow.task_name import check_task_name

ATTRIBUTE = "__dueflow_task__"
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")

Isolation = Literal["thread", "process"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """How a task runs: its name, queue and per-task overrides (``None``: not set)."""

    name: str
    queue: str = "default"
    timeout_s: float | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    rate_limit: float | None = None
    isolation: Isolation = "thread"
    result_max_bytes: int | None = None

    def validate(self) -> TaskSpec:
        check_task_name(self.name, field="task.name")  # the rule the SDK checks too
        if not isinstance(self.queue, str) or not _QUEUE_RE.match(self.queue):
            raise InvalidInput("task.queue", self.queue, "1-100 of [A-Za-z0-9_-]")
        if self.timeout_s is not None and not (
            isinstance(self.timeout_s, int | float) and self.timeout_s > 0
        ):
            raise InvalidInput("task.timeout", self.timeout_s, "seconds > 0, or None")
        if self.max_attempts is not None and not (
            isinstance(self.max_attempts, int) and self.max_attempts >= 1
        ):
            raise InvalidInput("task.max_attempts", self.max_attempts, "an integer >= 1, or None")
        if self.backoff is not None and not isinstance(self.backoff, Backoff):
            raise InvalidInput("task.backoff", self.backoff, "a dueflow.model.Backoff, or None")
        if self.rate_limit is not None and not (
            isinstance(self.rate_limit, int | float) and self.rate_limit > 0
        ):
            raise InvalidInput("task.rate_limit", self.rate_limit, "jobs per second > 0, or None")
        if self.isolation not in ("thread", "process"):
            raise InvalidInput("task.isolation", self.isolation, "'thread' or 'process'")
        cap = self.result_max_bytes
        whole = isinstance(cap, int) and not isinstance(cap, bool)
        if cap is not None and not (whole and 1 <= cap <= RESULT_MAX_BYTES_LIMIT):
            raise InvalidInput(
                "task.result_max_bytes",
                cap,
                f"an integer from 1 to {RESULT_MAX_BYTES_LIMIT}, or None (worker.result_max_bytes)",
            )
        return self


@overload
def task(name: F, /) -> F: ...


@overload
def task(
    name: str | None = None,
    *,
    queue: str = "default",
    timeout: float | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    rate_limit: float | None = None,
    isolation: Isolation = "thread",
    result_max_bytes: int | None = None,
) -> Callable[[F], F]: ...


def task(
    name: str | Callable[..., Any] | None = None,
    *,
    queue: str = "default",
    timeout: float | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    rate_limit: float | None = None,
    isolation: Isolation = "thread",
    result_max_bytes: int | None = None,
) -> Any:
    """Mark a function as the handler of task ``name`` (default: the function's name).

    ``timeout`` is in seconds, ``rate_limit`` in jobs per second across the
    consumer group. ``isolation="process"`` runs a sync handler in a child
    process that is killed when it overruns its timeout. ``result_max_bytes``:
    the largest result (the handler's return value as JSON) kept for this task
    (default ``worker.result_max_bytes``).
    """

    def attach(fn: F) -> F:
        if not callable(fn):
            raise InvalidInput("task", fn, "a function")
        spec = TaskSpec(
            name=name if isinstance(name, str) else fn.__name__,
            queue=queue,
            timeout_s=float(timeout) if timeout is not None else None,
            max_attempts=max_attempts,
            backoff=backoff,
            rate_limit=float(rate_limit) if rate_limit is not None else None,
            isolation=isolation,
            result_max_bytes=result_max_bytes,
        ).validate()
        if spec.isolation == "process" and inspect.iscoroutinefunction(fn):
            raise InvalidInput("task.isolation", "process", "'thread' for an async handler")
        setattr(fn, ATTRIBUTE, spec)
        return fn

    if callable(name):  # bare @task
        fn, name = name, None
        return attach(fn)
    return attach


def spec_of(fn: Callable[..., Any]) -> TaskSpec | None:
    """The :class:`TaskSpec` attached by :func:`task`, if any."""
    spec = getattr(fn, ATTRIBUTE, None)
    return spec if isinstance(spec, TaskSpec) else None


@dataclass(frozen=True, slots=True)
class RegisteredTask:
    """A handler ready to run: its spec, the function and how to call it."""

    spec: TaskSpec
    fn: Callable[..., Any]
    is_async: bool

    @property
    def ref(self) -> str:
        """``module:qualname``: how a child process finds the function again."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"


class TaskRegistry:
    """Handlers by task name and the app's lifecycle hooks, built explicitly (no
    global registry). ``functions``: ``@task`` handlers and hook functions."""

    def __init__(self, functions: Iterable[Callable[..., Any]] = ()) -> None:
        self._tasks: dict[str, RegisteredTask] = {}
        self.hooks = WorkerHooks()
        for fn in functions:
            if hook_kind(fn) is not None and spec_of(fn) is None:
                self.hooks.add(fn)
            else:
                self.add(fn)

    def add(self, fn: Callable[..., Any], spec: TaskSpec | None = None) -> RegisteredTask:
        """Register ``fn`` (decorated with :func:`task`, or with an explicit ``spec``)."""
        spec = spec or spec_of(fn)
        if spec is None:
            raise InvalidInput("handler", fn, "a function decorated with @task, or a TaskSpec")
        spec.validate()
        existing = self._tasks.get(spec.name)
        if existing is not None and existing.fn is not fn:
            raise InvalidInput(
                "task.name", spec.name, f"a name not taken by {existing.ref} (names are unique)"
            )
        entry = RegisteredTask(spec, fn, inspect.iscoroutinefunction(fn))
        if entry.is_async and spec.isolation == "process":
            raise InvalidInput("task.isolation", "process", "'thread' for an async handler")
        self._tasks[spec.name] = entry
        return entry

    @classmethod
    def from_modules(cls, modules: Iterable[str]) -> TaskRegistry:
        """Import each module and register every function decorated with :func:`task`
        and every lifecycle hook (``@on_startup``, ``@on_shutdown``, ``@on_failure``)."""
        registry = cls()
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                raise InvalidInput("app", name, f"an importable module ({exc})") from exc
            except Exception as exc:  # the module raised while it was imported
                raise InvalidInput(
                    "app", name, f"a module that imports ({type(exc).__name__}: {exc})"
                ) from exc
            found = 0
            for value in vars(module).values():
                if not callable(value):
                    continue
                if spec_of(value) is not None:
                    registry.add(value)
                    found += 1
                elif hook_kind(value) is not None:
                    registry.hooks.add(value)
                    found += 1
            if not found:
                raise InvalidInput(
                    "app", name, "a module with at least one @task function or worker hook"
                )
        return registry

    def get(self, name: str) -> RegisteredTask | None:
        return self._tasks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[RegisteredTask]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def declared_queues(self) -> dict[str, str]:
        """The queue of each registered task (``@task(queue=...)``), by task name."""
        return {name: t.spec.queue for name, t in self._tasks.items()}

    @property
    def queues(self) -> list[str]:
        """Queues named by the registered tasks, in registration order."""
        return list(dict.fromkeys(t.spec.queue for t in self._tasks.values()))
