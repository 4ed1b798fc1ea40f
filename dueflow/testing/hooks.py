"""Worker lifecycle hooks in the in-memory pipeline, called as a worker calls them.

``@on_startup`` hooks run when the pipeline is made (before any job; a hook
registered later runs when it is registered), in order; one that raises
stops there with :class:`~dueflow.errors.WorkerStartupFailed`, as a worker
does. ``@on_failure`` hooks run after each attempt that ran and failed, with
the attempt's context, the failure and whether it is retried. ``@on_shutdown``
hooks run at :meth:`~dueflow.testing.InMemoryPipeline.close`. A failure or
shutdown hook that raises is logged and counted as on a worker, and kept in
:attr:`MemoryHooks.errors` for a test to look at. Unlike on a worker, each
call is waited for (the fake clock stands still meanwhile) and
``worker.hook_timeout_s`` is not applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dueflow.consumers.hooks import (
    FAILURE,
    SHUTDOWN,
    STARTUP,
    Hook,
    HookKind,
    WorkerHooks,
    WorkerInfo,
    report,
    run_now,
)
from dueflow.errors import WorkerStartupFailed
from dueflow.observability.metrics import Metrics


@dataclass(frozen=True, slots=True)
class HookError:
    """A hook call that raised: which hook, and what."""

    kind: HookKind
    hook: str  # module:qualname
    error: BaseException


class MemoryHooks:
    """The hooks of a pipeline's registry (read live: hooks registered later count)."""

    def __init__(
        self,
        hooks: WorkerHooks,
        *,
        metrics: Metrics,
        loop: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self._hooks = hooks
        self._metrics = metrics
        self._loop = loop
        self._started: set[int] = set()  # id() of the startup hooks that ran
        self.started = False
        self.errors: list[HookError] = []

    def startup(self, info: WorkerInfo) -> None:
        """The startup hooks that have not run yet, in order."""
        for hook in self._hooks.of(STARTUP):
            if id(hook.fn) in self._started:
                continue
            self._started.add(id(hook.fn))
            exc = self._call(hook, (info,))
            if exc is not None:
                raise WorkerStartupFailed(hook.ref, f"{type(exc).__name__}: {exc}", cause=exc)
        self.started = True

    def failed(self, job: Any, failure: Any, will_retry: bool) -> None:
        for hook in self._hooks.of(FAILURE):
            self._call(hook, (job, failure, will_retry))

    def shutdown(self, info: WorkerInfo) -> None:
        if not self.started:
            return  # a startup hook failed: nothing to shut down
        self.started = False
        for hook in self._hooks.of(SHUTDOWN):
            self._call(hook, (info,))

    def _call(self, hook: Hook, args: tuple[Any, ...]) -> BaseException | None:
        try:
            run_now(hook, args, self._run_async)
        except Exception as exc:
            report(self._metrics, hook, exc)
            self.errors.append(HookError(hook.kind, hook.ref, exc))
            return exc
        report(self._metrics, hook, None)
        return None

    def _run_async(self, awaitable: Any) -> Any:
        async def wait() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wait(), self._loop()).result()
