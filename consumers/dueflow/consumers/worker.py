"""One worker process: a runtime per queue under one concurrency bound.

Queues: those asked for (``--queues``), else those its tasks route to
(:func:`~dueflow.rules.routing.served_queues`: ``[routes]``, then ``@task``), else
every static queue. A queue's spec is the merged view of the static config
and the queue registry (read at start, then followed). A queue that exists in
neither yet is **waited for**: the worker starts what it can, logs which queues
it waits for and how to create them, and starts serving a queue as soon as it
is registered (``dueflow queue create``), without a restart. A spec that
changes while a queue is served takes effect at the next start (logged).

Shutdown (SIGTERM or SIGINT, or :meth:`Worker.stop`): stop starting jobs and
fetching records, let in-flight jobs finish for up to
``worker.shutdown_grace_s``, commit what finished, leave the consumer
groups, close. Jobs still running then are abandoned: nothing of them is
committed, so they are read again by the next owner and either skipped (the
key store says they are final) or run again. In a worker process
(:func:`run_worker`) whose sync handler threads still run then, the groups
are not left: the process exits and its partitions move after the session
timeout, so no job runs in two places at once. A second signal exits at once;
what was not committed is redelivered in the same way.

Lifecycle hooks (:mod:`dueflow.consumers.hooks`): the startup hooks run first,
before any Kafka client is made (a failing one raises
:class:`~dueflow.errors.WorkerStartupFailed` and nothing starts); the shutdown
hooks run last, after the final commits and leaving the groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence

from dueflow.config import QueueSpec, Settings
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.follow_ups import DEFAULT_TIMER_RECORD_BYTES, FollowUpSetup, KnownQueues
from dueflow.consumers.hooks import HookRunner, WorkerInfo
from dueflow.consumers.pause_tail import ControlTail
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.runtime import QueueRuntime, Slots
from dueflow.consumers.store import StoreFactory, memory_stores, sqlite_stores
from dueflow.errors import ConfigError, DueflowError, WorkerStartupFailed
from dueflow.kafka.clock_probe import ClockProbe
from dueflow.kafka.queue_reader import QueueWatcher
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.queue_registry import QueueView
from dueflow.rules.routing import Router, served_queues

_LOG = logging.getLogger("dueflow.worker")


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


def default_stores(settings: Settings) -> StoreFactory:
    if settings.worker.store == "disk":
        return sqlite_stores(settings.worker.store_dir)
    return memory_stores()


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
    ) -> None:
        self._settings = settings
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
        self._queue_watch: QueueWatcher | None = None
        self._executor: JobExecutor | None = None
        self._control: ControlTail | None = None
        self.exit_code = 0
        self.started = False
        # The caller exits the process after run(): with handler threads still
        # running at the end of the shutdown grace, the groups are not left (the
        # partitions move after the session timeout, when the process is gone).
        self._process_exits = process_exits
        self.left_groups = True

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

    def stop(self) -> None:
        """Begin a graceful shutdown (call on the worker's event loop)."""
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
        assert self._stop is not None
        ws = self._settings.worker
        executor = JobExecutor(
            concurrency=ws.concurrency,
            metrics=self._metrics,
            isolated_processes=ws.isolated_processes,
            max_orphans=ws.max_orphaned_threads,
            on_fatal=self._fatal,
        )
        self._executor = executor
        slots = Slots(ws.concurrency)
        quarantine = Quarantine(self._settings, self._metrics, component="worker")
        # Queues an operator paused: read before any job starts, then followed.
        control = ControlTail(
            self._settings,
            quarantine=quarantine,
            on_change=self._on_control,
            group=f"{self._settings.topic_prefix}.worker.control",
        )
        control.start()
        self._control = control
        clock = ClockProbe(self._settings, component="worker")
        clock.report_to(self._metrics.clock_offset)
        clock.start()
        loop = asyncio.get_running_loop()

        def on_queues(view: QueueView, _changed: set[str]) -> None:  # the watcher's thread
            loop.call_soon_threadsafe(self._on_queues, view)

        watcher = QueueWatcher(self._settings, on_change=on_queues, component="worker")
        self._queue_watch = watcher
        await control.caught_up()
        # The queues that exist (static + registry) before any runtime starts.
        await loop.run_in_executor(None, watcher.start)
        # Due times are compared with the broker's clock: know it before any job starts.
        await loop.run_in_executor(None, clock.wait_first)
        # ctx.schedule checks follow-ups against the timer topic's size limit and the
        # queues that exist (the registry followed; read again for a queue not known
        # yet, but never on the loop's own thread: an async handler must not block it).
        timer_bytes = await loop.run_in_executor(None, self._timer_record_bytes)
        loop_thread = threading.get_ident()
        follow_ups = FollowUpSetup(
            timer_bytes,
            KnownQueues(
                lambda: watcher.view.names,
                lambda queue: threading.get_ident() != loop_thread and watcher.knows(queue, 2.0),
            ),
        )

        def make_runtime(spec: QueueSpec) -> QueueRuntime:
            runtime = QueueRuntime(
                self._settings,
                spec,
                registry=self._registry,
                executor=executor,
                slots=slots,
                metrics=self._metrics,
                stores=self._stores,
                quarantine=quarantine,
                worker_id=self.worker_id,
                tracer=self._tracer,
                clock=clock,
                hooks=hooks,
                follow_ups=follow_ups,
            )
            runtime.set_paused(control.is_paused(runtime.queue))
            return runtime

        self._make_runtime = make_runtime
        view = watcher.view
        for name in self._queues:
            spec = view.get(name)
            if spec is None:
                self._waiting.add(name)
            else:
                self._runtimes.append(make_runtime(spec))
        reminder = asyncio.create_task(self._remind_waiting())
        try:
            for runtime in list(self._runtimes):
                await runtime.start()
            self.started = True
            event(
                _LOG,
                "worker started",
                worker=self.worker_id,
                queues=[r.queue for r in self._runtimes],
                waiting_for=sorted(self._waiting),
                tasks=sorted(t.spec.name for t in self._registry),
                concurrency=ws.concurrency,
            )
            self._on_queues(watcher.view)  # registered while the runtimes started
            if on_started is not None:
                on_started(self)
            await self._stop.wait()
        finally:
            reminder.cancel()
            self._make_runtime = None  # nothing starts any more
            for task in list(self._starting):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._shutdown(executor)
            await control.close()
            await loop.run_in_executor(None, watcher.close)
            clock.close()
            quarantine.close()

    def _timer_record_bytes(self) -> int:
        """The timer topic's record size limit, which follow-ups (ctx.schedule) are
        checked against (the broker's default when the topic cannot be read)."""
        from dueflow.kafka.clients import make_admin
        from dueflow.kafka.topics import names
        from dueflow.producers.core import read_max_message_bytes

        topic = names(self._settings).timers
        try:
            return read_max_message_bytes(make_admin(self._settings), topic, timeout_s=10.0)
        except DueflowError as exc:
            event(
                _LOG,
                "timer topic not described: follow-ups are checked against the default size",
                logging.WARNING,
                topic=topic,
                max_bytes=DEFAULT_TIMER_RECORD_BYTES,
                error=str(exc),
            )
            return DEFAULT_TIMER_RECORD_BYTES

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
        if not await executor.wait_idle(self._settings.worker.shutdown_grace_s):
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


def tune_gc(threshold: int = 50_000) -> None:
    """Fewer cyclic-GC passes in a worker process.

    A job allocates a handful of container objects (record wrapper, context,
    tuples) that die by reference counting; with the default gen-0
    threshold (700) the collector runs every ~100 jobs and costs about a
    third of a no-op job. Objects from start-up are frozen (never scanned
    again) and the gen-0 threshold is raised. Only for processes that run a
    worker and nothing else: :func:`run_worker` calls it, an application
    that embeds :class:`Worker` decides for itself.
    """
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)


def run_worker(
    settings: Settings,
    registry: TaskRegistry,
    *,
    queues: Sequence[str] | None = None,
    metrics: Metrics | None = None,
    stores: StoreFactory | None = None,
) -> int:
    """Run a :class:`Worker` in this process until SIGTERM/SIGINT; return the exit code."""

    tune_gc()

    tracer = JobTracer.from_env(os.environ, service_name="dueflow-worker")

    async def main() -> int:
        worker = Worker(
            settings,
            registry,
            queues=queues,
            metrics=metrics,
            stores=stores,
            tracer=tracer,
            process_exits=True,
        )
        loop = asyncio.get_running_loop()
        received: list[int] = []

        def on_signal(signum: int) -> None:
            received.append(signum)
            if len(received) == 1:
                event(_LOG, "shutting down", signal=signal.Signals(signum).name)
                worker.stop()
            else:
                event(_LOG, "second signal: exiting now", logging.WARNING)
                logging.shutdown()
                os._exit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        await worker.run()
        if not worker.left_groups:
            # No interpreter teardown: it would close the consumers, i.e. leave.
            tracer.close()
            logging.shutdown()
            os._exit(worker.exit_code)
        return worker.exit_code

    try:
        return asyncio.run(main())
    finally:
        tracer.close()
