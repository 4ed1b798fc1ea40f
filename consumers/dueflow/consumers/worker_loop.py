"""The worker on its event loop: a runtime per queue under one concurrency bound.

Queues (:mod:`dueflow.consumers.queue_selection`): those asked for, else those
its tasks route to, else every static queue. A queue's spec is the merged view
of the static config and the queue registry (read at start, then followed). A
queue that exists in neither yet is **waited for**: the worker starts what it
can, logs which queues it waits for and how to create them, and starts serving
a queue as soon as it is registered (``dueflow queue create``), without a
restart. A spec that changes while a queue is served takes effect at the next
start (logged).

Shutdown (:meth:`Worker.stop`; SIGTERM or SIGINT in a worker process): stop
starting jobs and fetching records, let in-flight jobs finish for up to
``worker.shutdown_grace_s``, commit what finished, leave the consumer groups,
close. Jobs still running then are abandoned: nothing of them is committed, so
they are read again by the next owner and either skipped (the key store says
they are final) or run again. With ``process_exits`` (a worker process,
:func:`~dueflow.consumers.worker_process.run_worker`) and sync handler threads
still running then, the groups are not left: the process exits and its
partitions move after the session timeout, so no job runs in two places at once.

The watchdog and the memory limits: :mod:`dueflow.consumers.worker_watchdog`.
What starts before the queues, in order: :mod:`dueflow.consumers.worker_startup`.

Lifecycle hooks (:mod:`dueflow.consumers.hooks`): the startup hooks run first,
before any Kafka client is made (a failing one raises
:class:`~dueflow.errors.WorkerStartupFailed` and nothing starts); the shutdown
hooks run last, after the final commits and leaving the groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence

from dueflow.config import QueueSpec, Settings
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.hooks import HookRunner, WorkerInfo
from dueflow.consumers.queue_selection import select_queues
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.restart import ProcessRestart
from dueflow.consumers.runtime import QueueRuntime, Slots
from dueflow.consumers.store import StoreFactory
from dueflow.consumers.worker_startup import WorkerClients, default_stores, runtime_factory
from dueflow.consumers.worker_watchdog import WorkerWatchdog
from dueflow.errors import WorkerStartupFailed
from dueflow.kafka.queue_reader import QueueWatcher
from dueflow.observability.health import Health
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.queue_registry import QueueView

_LOG = logging.getLogger("dueflow.worker")
_BEAT_S = 0.5  # how often the event loop's heartbeat is taken


class Worker:
    """Runs the registry's handlers for ``queues`` until stopped."""

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry,
        *,
        queues: Sequence[str] | None = None,
        metrics: Metrics | None = None,
        stores: StoreFactory | None = None,
        worker_id: str | None = None,
        tracer: JobTracer | None = None,
        process_exits: bool = False,
        restart: ProcessRestart | None = None,
        health: Health | None = None,
    ) -> None:
        self._settings = settings
        # /livez: the event loop beats (a task of its own); /readyz: every queue's
        # consumer is a member of its group.
        self.health = (
            health
            if health is not None
            else Health(liveness_timeout_s=settings.observability.liveness_timeout_s)
        )
        self._tracer = tracer or JobTracer()
        self._registry = registry
        self._queues = select_queues(settings, registry, queues)
        self._metrics = metrics or Metrics()
        self._stores = stores or default_stores(settings)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._stop: asyncio.Event | None = None
        self._runtimes: list[QueueRuntime] = []
        self._waiting: set[str] = set()  # queues asked for that do not exist yet
        self._starting: set[asyncio.Task[None]] = set()
        self._make_runtime: Callable[[QueueSpec], QueueRuntime] | None = None
        self.exit_code = 0
        self.started = False
        # The caller exits the process after run(): with handler threads still
        # running at the end of the shutdown grace, the groups are not left (the
        # partitions move after the session timeout, when the process is gone).
        self._process_exits = process_exits
        self.left_groups = True
        self._guard = WorkerWatchdog(
            settings,
            self._metrics,
            runtimes=lambda: list(self._runtimes),
            stop=self.stop,
            restart=restart,
        )

    @property
    def runtimes(self) -> list[QueueRuntime]:
        return list(self._runtimes)

    @property
    def waiting(self) -> list[str]:
        """The queues this worker waits for (asked for, not created yet)."""
        return sorted(self._waiting)

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    @property
    def restart_reason(self) -> str | None:
        """Why the worker stopped to restart (None: it did not)."""
        return self._guard.restart_reason

    @restart_reason.setter
    def restart_reason(self, reason: str | None) -> None:
        self._guard.restart_reason = reason

    def stop(self) -> None:
        """Begin a graceful shutdown (call on the worker's event loop)."""
        self.health.stopping()
        if self._stop is not None:
            self._stop.set()

    def _fatal(self, reason: str) -> None:
        event(_LOG, "worker stopping on error", logging.ERROR, reason=reason)
        self.exit_code = 1
        self.stop()

    async def run(self, on_started: Callable[[Worker], None] | None = None) -> None:
        """Start, run until :meth:`stop`, then shut down gracefully.

        Raises :class:`~dueflow.errors.WorkerStartupFailed` when a startup hook
        fails (nothing was started then)."""
        self._stop = asyncio.Event()
        ws = self._settings.worker
        hooks = HookRunner(self._registry.hooks, metrics=self._metrics, timeout_s=ws.hook_timeout_s)
        info = WorkerInfo(
            self.worker_id, tuple(self._queues), tuple(sorted(t.spec.name for t in self._registry))
        )
        try:
            await hooks.startup(info)  # before any client: this member has joined nothing
        except WorkerStartupFailed as exc:
            event(_LOG, "worker startup failed", logging.ERROR, hook=exc.hook, error=str(exc))
            hooks.close()
            self.exit_code = 5
            raise
        try:
            await self._run(hooks, on_started)
        finally:
            await hooks.shutdown(info)  # after the last commit
            hooks.close()

    async def _run(self, hooks: HookRunner, on_started: Callable[[Worker], None] | None) -> None:
        ws = self._settings.worker
        guard = self._guard
        guard.loop = asyncio.get_running_loop()
        watchdog = guard.make()
        executor = JobExecutor(
            concurrency=ws.concurrency,
            metrics=self._metrics,
            isolated_processes=ws.isolated_processes,
            max_orphans=ws.max_orphaned_threads,
            on_fatal=self._fatal,
            watch=guard.watch if watchdog is not None else None,
        )
        guard.executor = executor
        ticker = asyncio.create_task(guard.tick()) if watchdog is not None else None
        if watchdog is not None:
            watchdog.start()
        slots = Slots(ws.concurrency)
        clients = await WorkerClients.start(
            self._settings, self._metrics, on_control=self._on_control, on_queues=self._on_queues
        )
        make_runtime = await runtime_factory(
            self._settings,
            self._queues,
            clients,
            registry=self._registry,
            executor=executor,
            slots=slots,
            metrics=self._metrics,
            stores=self._stores,
            worker_id=self.worker_id,
            tracer=self._tracer,
            hooks=hooks,
        )
        self._make_runtime = make_runtime
        view = clients.watcher.view
        for name in self._queues:
            spec = view.get(name)
            if spec is None:
                self._waiting.add(name)
            else:
                self._runtimes.append(make_runtime(spec))
        reminder = asyncio.create_task(self._remind_waiting())
        self.health.add_check("worker", self.readiness)
        try:
            await self._serve(clients.watcher, on_started)
        finally:
            reminder.cancel()
            self._make_runtime = None  # nothing starts any more
            for task in list(self._starting):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._shutdown(executor)
            if watchdog is not None:
                watchdog.close()
            if ticker is not None:
                ticker.cancel()
            await clients.close()

    async def _serve(
        self, watcher: QueueWatcher, on_started: Callable[[Worker], None] | None
    ) -> None:
        """Start the queues' runtimes and serve until :meth:`stop`."""
        assert self._stop is not None
        beating: asyncio.Task[None] | None = None
        try:
            for runtime in list(self._runtimes):
                await runtime.start()
            self.started = True
            beating = asyncio.create_task(self._beat())
            event(
                _LOG,
                "worker started",
                worker=self.worker_id,
                queues=[r.queue for r in self._runtimes],
                waiting_for=sorted(self._waiting),
                tasks=sorted(t.spec.name for t in self._registry),
                concurrency=self._settings.worker.concurrency,
            )
            self._on_queues(watcher.view)  # registered while the runtimes started
            if on_started is not None:
                on_started(self)
            await self._stop.wait()
        finally:
            if beating is not None:
                beating.cancel()

    def _on_queues(self, view: QueueView) -> None:
        """The registry changed (on the loop): start the queues waited for that exist now."""
        for runtime in self._runtimes:
            spec = view.get(runtime.queue)
            if spec is not None and spec != runtime.spec:
                event(
                    _LOG,
                    "queue spec changed: restart the worker to apply it",
                    logging.WARNING,
                    queue=runtime.queue,
                )
        if self._make_runtime is None:
            return
        for name in sorted(self._waiting):
            spec = view.get(name)
            if spec is None:
                continue
            self._waiting.discard(name)
            task = asyncio.create_task(self._start_queue(spec))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_queue(self, spec: QueueSpec) -> None:
        make = self._make_runtime
        if make is None:
            return
        runtime = make(spec)
        self._runtimes.append(runtime)
        await runtime.start()
        event(_LOG, "queue registered: serving it now", queue=spec.name, worker=self.worker_id)

    def readiness(self) -> str | None:
        """None when started and every queue served is a member of its group; else why
        not (queues waited for do not count: there is nothing to join yet)."""
        if not self.started:
            return "starting"
        problems = [f"{r.queue}: {why}" for r in list(self._runtimes) if (why := r.readiness())]
        return "; ".join(problems) or None

    async def _beat(self, every_s: float = _BEAT_S) -> None:
        """The event loop's heartbeat (/livez): a loop blocked by a handler stops it."""
        metrics = self._metrics
        while True:
            self.health.beat()
            self.health.publish(metrics.ready, metrics.loop_heartbeat)
            await asyncio.sleep(every_s)

    async def _remind_waiting(self, every_s: float = 30.0) -> None:
        """Say, now and then, which queues this worker still waits for."""
        while True:
            for name in sorted(self._waiting):
                event(
                    _LOG,
                    "waiting for a queue that does not exist: create it with "
                    f"`dueflow queue create {name} --partitions N` (or configure it statically)",
                    logging.WARNING,
                    queue=name,
                )
            await asyncio.sleep(every_s)

    def _on_control(self, queue: str, paused: bool) -> None:
        """An operator paused or resumed ``queue`` (on the loop)."""
        for runtime in self._runtimes:
            if runtime.queue == queue:
                runtime.set_paused(paused)

    async def _shutdown(self, executor: JobExecutor) -> None:
        for runtime in self._runtimes:
            runtime.stop_taking()
        grace = 0.0 if self._guard.abandon_at_stop else self._settings.worker.shutdown_grace_s
        if not await executor.wait_idle(grace):
            event(
                _LOG,
                "abandoning in-flight jobs at shutdown",
                logging.WARNING,
                jobs=executor.in_flight,
            )
            executor.abandon()
        # A sync handler thread cannot be stopped: leaving the group now would let
        # the next owner start its job while it still runs here.
        self.left_groups = not (self._process_exits and executor.orphans > 0)
        if not self.left_groups:
            event(
                _LOG,
                "handler threads still running: not leaving the groups before exiting",
                logging.WARNING,
                threads=executor.orphans,
            )
        for runtime in self._runtimes:
            await runtime.close(leave=self.left_groups)
        await executor.close()
        event(_LOG, "worker stopped", worker=self.worker_id)
