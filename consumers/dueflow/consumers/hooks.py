"""Worker lifecycle hooks: ``@on_startup``, ``@on_shutdown``, ``@on_failure``.

Declared in the app module beside the ``@task`` handlers (sync or async) and
found by :meth:`~dueflow.consumers.registry.TaskRegistry.from_modules`, i.e.
by ``dueflow worker --app``::

    @on_startup
    def open_pool(worker: WorkerInfo) -> None: ...

    @on_shutdown
    async def close_pool(worker: WorkerInfo) -> None: ...

    @on_failure
    def report(job: TaskContext, error: Failure, will_retry: bool) -> None: ...

Like ``@task``, a decorator only marks the function (it stays callable as
is); nothing is registered globally.

- **startup** runs in each worker process before it joins any consumer
  group, so before its first job and before it takes partitions from other
  members; in registration order. One that raises, or runs longer than
  ``worker.hook_timeout_s``, stops the worker: :class:`WorkerStartupFailed`
  names the hook and the error (``dueflow worker`` prints that line and exits
  with code 5), the later startup hooks do not run, and neither do the
  shutdown hooks.
- **shutdown** runs after the worker's last commit, once it has left its
  groups (and after the failure hooks still waiting), in registration order;
  each one runs even if an earlier one raised.
- **failure** runs after each attempt that ran and failed (the handler raised
  or overran its timeout; not for a record that never ran, such as an
  unknown task): ``job`` is the attempt's context (job, attempt, logger; it
  cannot schedule follow-ups), ``error`` the :class:`~dueflow.consumers.failures.Failure`,
  ``will_retry`` False when the job goes to the DLQ. It runs beside the
  worker (sync hooks on one thread of their own, in order; async ones as
  tasks), never holding up a commit; it is at least once (an attempt that
  runs again after a crash fails again and calls it again). At most 1000
  calls wait at a time; more are skipped and counted.

A hook that raises or overruns is logged (``worker hook failed``, with the
traceback) and counted: ``dueflow_worker_hook_calls_total{hook,result}``
(``ok``, ``error``, ``skipped``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from dueflow.consumers.context import TaskContext
from dueflow.errors import InvalidInput, WorkerStartupFailed
from dueflow.kafka.blocking import DaemonThreadExecutor
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics

ATTRIBUTE = "__dueflow_hook__"
STARTUP: Literal["startup"] = "startup"
SHUTDOWN: Literal["shutdown"] = "shutdown"
FAILURE: Literal["failure"] = "failure"
HookKind = Literal["startup", "shutdown", "failure"]
_ARGS: dict[str, tuple[str, ...]] = {
    STARTUP: ("worker",),
    SHUTDOWN: ("worker",),
    FAILURE: ("job", "error", "will_retry"),
}
MAX_WAITING = 1000
_LOG = logging.getLogger("dueflow.worker")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a startup or shutdown hook is told about its worker."""

    worker_id: str
    queues: tuple[str, ...]
    tasks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Hook:
    """A registered hook: its kind, the function and how to call it."""

    kind: HookKind
    fn: Callable[..., Any]
    is_async: bool

    @property
    def ref(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}"


def _mark(fn: F, kind: HookKind) -> F:
    if not callable(fn):
        raise InvalidInput(f"on_{kind}", fn, "a function")
    names = _ARGS[kind]
    try:
        inspect.signature(fn).bind(*names)
    except TypeError as exc:
        raise InvalidInput(
            f"on_{kind}",
            getattr(fn, "__qualname__", fn),
            f"a function taking ({', '.join(names)}): {exc}",
        ) from None
    setattr(fn, ATTRIBUTE, kind)
    return fn


def on_startup(fn: F) -> F:
    """Mark ``fn(worker: WorkerInfo)`` to run in each worker process before it joins its
    groups; one that raises stops the worker (see :mod:`dueflow.consumers.hooks`)."""
    return _mark(fn, STARTUP)


def on_shutdown(fn: F) -> F:
    """Mark ``fn(worker: WorkerInfo)`` to run after the worker's last commit."""
    return _mark(fn, SHUTDOWN)


def on_failure(fn: F) -> F:
    """Mark ``fn(job: TaskContext, error: Failure, will_retry: bool)`` to run after
    each attempt that failed."""
    return _mark(fn, FAILURE)


def hook_kind(fn: Any) -> HookKind | None:
    """The kind a hook decorator gave ``fn``, if any."""
    kind = getattr(fn, ATTRIBUTE, None)
    return kind if kind in _ARGS else None


class WorkerHooks:
    """The hooks of an app, by kind, in registration order."""

    def __init__(self) -> None:
        self._by_kind: dict[str, list[Hook]] = {kind: [] for kind in _ARGS}

    def add(self, fn: Callable[..., Any]) -> Hook:
        kind = hook_kind(fn)
        if kind is None:
            raise InvalidInput(
                "hook", fn, "a function decorated with @on_startup, @on_shutdown or @on_failure"
            )
        hooks = self._by_kind[kind]
        for hook in hooks:
            if hook.fn is fn:
                return hook
        hook = Hook(kind, fn, inspect.iscoroutinefunction(fn))
        hooks.append(hook)
        return hook

    def of(self, kind: HookKind) -> list[Hook]:
        return list(self._by_kind[kind])

    @property
    def failure(self) -> bool:
        """Whether any failure hook is registered (the worker asks once per failure)."""
        return bool(self._by_kind[FAILURE])

    def __iter__(self) -> Iterator[Hook]:
        for hooks in self._by_kind.values():
            yield from hooks

    def __len__(self) -> int:
        return sum(len(h) for h in self._by_kind.values())


def will_retry(*, permanent: bool, attempt: int, max_attempts: int) -> bool:
    """Whether a failed attempt is retried (the recorder's rule): not when the failure
    is permanent or the attempts are used up."""
    return not permanent and attempt < max_attempts


def report(metrics: Metrics, hook: Hook, exc: BaseException | None) -> None:
    """Count a hook call; log one that failed, with its traceback."""
    if exc is None:
        metrics.hook_calls.labels(hook.kind, "ok").inc()
        return
    metrics.hook_calls.labels(hook.kind, "error").inc()
    event(
        _LOG,
        "worker hook failed",
        logging.ERROR,
        hook=hook.ref,
        kind=hook.kind,
        error=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc))[-16_000:],
    )


class HookRunner:
    """Runs a worker's hooks on its event loop (sync ones on a daemon thread)."""

    def __init__(self, hooks: WorkerHooks, *, metrics: Metrics, timeout_s: float) -> None:
        self._hooks = hooks
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._thread: DaemonThreadExecutor | None = None
        self._waiting: set[asyncio.Task[None]] = set()
        self.has_failure_hooks = hooks.failure
        for kind in _ARGS:
            for result in ("ok", "error", "skipped"):
                metrics.hook_calls.labels(kind, result)

    async def startup(self, info: WorkerInfo) -> None:
        """Every startup hook in order; :class:`WorkerStartupFailed` at the first that fails."""
        for hook in self._hooks.of(STARTUP):
            try:
                await self._call(hook, (info,))
            except Exception as exc:
                report(self._metrics, hook, exc)
                raise WorkerStartupFailed(
                    hook.ref, _describe(exc, self._timeout_s), cause=exc
                ) from exc
            report(self._metrics, hook, None)

    async def shutdown(self, info: WorkerInfo) -> None:
        """Every shutdown hook in order (after the failure hooks still waiting)."""
        await self.drain()
        for hook in self._hooks.of(SHUTDOWN):
            try:
                await self._call(hook, (info,))
            except Exception as exc:
                report(self._metrics, hook, exc)
            else:
                report(self._metrics, hook, None)

    def failed(self, job: Any, error: Any, will_retry: bool) -> None:
        """An attempt failed: start the failure hooks, without waiting for them."""
        loop = asyncio.get_running_loop()
        for hook in self._hooks.of(FAILURE):
            if len(self._waiting) >= MAX_WAITING:
                self._metrics.hook_calls.labels(FAILURE, "skipped").inc()
                continue
            task = loop.create_task(self._guarded(hook, (job, error, will_retry)))
            self._waiting.add(task)
            task.add_done_callback(self._waiting.discard)

    def attempt_failed(self, d: Any, failure: Any) -> None:
        """A worker's attempt (a :class:`~dueflow.consumers.feeds.Delivery`) failed."""
        ctx = TaskContext(
            d.fields, d.attempt, d.max_attempts, d.hmap, (d.feed.topic, d.feed.partition, d.offset)
        )
        retry = will_retry(
            permanent=failure.permanent, attempt=d.attempt, max_attempts=d.max_attempts
        )
        self.failed(ctx, failure, retry)

    async def drain(self) -> None:
        """Wait for the failure hooks started so far (each at most the hook timeout)."""
        while self._waiting:
            await asyncio.gather(*list(self._waiting), return_exceptions=True)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    async def _guarded(self, hook: Hook, args: tuple[Any, ...]) -> None:
        try:
            await self._call(hook, args)
        except Exception as exc:
            report(self._metrics, hook, exc)
        else:
            report(self._metrics, hook, None)

    async def _call(self, hook: Hook, args: tuple[Any, ...]) -> None:
        if hook.is_async:
            await asyncio.wait_for(_awaitable(hook.fn(*args)), self._timeout_s)
            return
        if self._thread is None:
            self._thread = DaemonThreadExecutor("dueflow-hooks")
        future = self._thread.submit(hook.fn, *args)
        await asyncio.wait_for(asyncio.wrap_future(future), self._timeout_s)


def _awaitable(value: Any) -> Awaitable[Any]:
    if inspect.isawaitable(value):
        return value

    async def done() -> Any:
        return value

    return done()


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"it did not return within {timeout_s:g} s (worker.hook_timeout_s)"
    return f"{type(exc).__name__}: {exc}"


def run_now(hook: Hook, args: tuple[Any, ...], run_async: Callable[[Any], Any]) -> None:
    """Call ``hook`` and wait for it (the in-memory pipeline): ``run_async`` runs a
    coroutine to its end and returns its result or raises."""
    result = hook.fn(*args)
    if hook.is_async or inspect.isawaitable(result):
        run_async(result)
