"""What a worker starts before its queues, in this order, and how it closes them.

:class:`WorkerClients` are the clients every queue of the process shares: the
quarantine, the control tail (queues an operator paused: read before any job
starts, then followed), the broker clock probe (due times are compared with
the broker's clock: known before any job starts) and the queue registry's
watcher (the queues that exist before any runtime starts, then followed).
:func:`runtime_factory` makes a queue's :class:`QueueRuntime` from its spec,
with what its queues share: the size budgets of follow-ups, the progress budget.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dueflow.config import QueueSpec, Settings
from dueflow.consumers.assignment_check import GroupAsker
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.follow_ups import FollowUpSetup, KnownQueues
from dueflow.consumers.hooks import HookRunner
from dueflow.consumers.pause_tail import ControlTail
from dueflow.consumers.progress import ProgressBudget, monotonic_ms
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.runtime import QueueRuntime, Slots
from dueflow.consumers.steering_store import (
    SteeringStoreFactory,
    memory_steering_stores,
    sqlite_steering_stores,
)
from dueflow.consumers.store import StoreFactory, memory_stores, sqlite_stores
from dueflow.kafka.clock_probe import ClockProbe
from dueflow.kafka.group_probe import GroupProbe
from dueflow.kafka.queue_reader import QueueWatcher
from dueflow.kafka.topic_limits import BudgetBook, TopicLimits
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.queue_registry import QueueView
from dueflow.records.size_budget import JobBudget


def default_stores(settings: Settings) -> StoreFactory:
    if settings.worker.store == "disk":
        return sqlite_stores(settings.worker.store_dir)
    return memory_stores()


def default_steering_stores(settings: Settings) -> SteeringStoreFactory:
    """Steering states where the key stores are: memory, or SQLite files beside them."""
    if settings.worker.store == "disk":
        return sqlite_steering_stores(settings.worker.store_dir)
    return memory_steering_stores()


@dataclass(frozen=True)
class WorkerClients:
    """The clients a worker's queues share, started and caught up."""

    quarantine: Quarantine
    control: ControlTail
    clock: ClockProbe
    watcher: QueueWatcher
    # The group coordinator's view of the queues' groups (a child process started at
    # the first question): the queues' assignment checks ask it.
    group_asker: GroupAsker

    @classmethod
    async def start(
        cls,
        settings: Settings,
        metrics: Metrics,
        *,
        on_control: Callable[[str, bool], None],
        on_queues: Callable[[QueueView], None],
    ) -> WorkerClients:
        """Start them; ``on_control`` and ``on_queues`` are called on the running loop."""
        quarantine = Quarantine(settings, metrics, component="worker")
        # Queues an operator paused: read before any job starts, then followed.
        control = ControlTail(
            settings,
            quarantine=quarantine,
            on_change=on_control,
            group=f"{settings.topic_prefix}.worker.control",
        )
        control.start()
        clock = ClockProbe(settings, component="worker")
        clock.report_to(metrics.clock_offset)
        clock.start()
        loop = asyncio.get_running_loop()

        def on_change(view: QueueView, _changed: set[str]) -> None:  # the watcher's thread
            loop.call_soon_threadsafe(on_queues, view)

        watcher = QueueWatcher(settings, on_change=on_change, component="worker")
        await control.caught_up()
        # The queues that exist (static + registry) before any runtime starts.
        await loop.run_in_executor(None, watcher.start)
        # Due times are compared with the broker's clock: know it before any job starts.
        await loop.run_in_executor(None, clock.wait_first)
        return cls(
            quarantine, control, clock, watcher, GroupAsker(GroupProbe(settings.client_config()))
        )

    async def close(self) -> None:
        await self.control.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.watcher.close)
        await loop.run_in_executor(None, self.group_asker.close)
        self.clock.close()
        self.quarantine.close()


def timer_record_bytes(settings: Settings, queues: Sequence[str], limits: TopicLimits) -> int:
    """The timer topic's record size limit (the broker's default when the topic
    cannot be read), read with the limits of the worker's first queue."""
    spec = settings.queues[0]
    for name in queues:
        found = next((q for q in settings.queues if q.name == name), None)
        if found is not None:
            spec = found
            break
    return limits.of(spec).timers.max_bytes


def _follow_up_setup(watcher: QueueWatcher, limits: TopicLimits, timer_bytes: int) -> FollowUpSetup:
    """ctx.schedule checks follow-ups against the size budget of their queue and
    the queues that exist (the registry followed; read again for a queue not
    known yet, but never on the loop's own thread: an async handler must not
    block it). A queue's limits are read once (dueflow.kafka.topic_limits)."""
    loop_thread = threading.get_ident()

    def spec_of(queue: str) -> QueueSpec | None:
        return watcher.view.get(queue)

    budgets = BudgetBook(lambda queue: limits.of(spec_of(queue) or QueueSpec(queue)))

    def budget_of(queue: str) -> JobBudget | None:
        known = budgets.cached(queue)
        if known is not None or threading.get_ident() == loop_thread:
            return known  # on the loop: what is known (else the default limits)
        return budgets(queue)

    return FollowUpSetup(
        timer_bytes,
        KnownQueues(
            lambda: watcher.view.names,
            lambda queue: threading.get_ident() != loop_thread and watcher.knows(queue, 2.0),
        ),
        budgets=budget_of,
        specs=spec_of,
    )


async def runtime_factory(
    settings: Settings,
    queues: Sequence[str],
    clients: WorkerClients,
    *,
    registry: TaskRegistry,
    executor: JobExecutor,
    slots: Slots,
    metrics: Metrics,
    stores: StoreFactory,
    worker_id: str,
    tracer: JobTracer,
    hooks: HookRunner,
) -> Callable[[QueueSpec], QueueRuntime]:
    """How the worker makes the runtime of a queue it serves (on the loop's thread)."""
    loop = asyncio.get_running_loop()
    limits = TopicLimits(settings)
    timer_bytes = await loop.run_in_executor(None, timer_record_bytes, settings, queues, limits)
    follow_ups = _follow_up_setup(clients.watcher, limits, timer_bytes)
    # ctx.progress: worker.progress_max_per_s for the whole process, its queues together.
    progress_budget = ProgressBudget(settings.worker.progress_max_per_s, now_ms=monotonic_ms())

    def make_runtime(spec: QueueSpec) -> QueueRuntime:
        runtime = QueueRuntime(
            settings,
            spec,
            registry=registry,
            executor=executor,
            slots=slots,
            metrics=metrics,
            stores=stores,
            steering_stores=default_steering_stores(settings),
            quarantine=clients.quarantine,
            worker_id=worker_id,
            tracer=tracer,
            clock=clients.clock,
            hooks=hooks,
            follow_ups=follow_ups,
            limits=limits,
            progress_budget=progress_budget,
            group_asker=clients.group_asker,
        )
        runtime.set_paused(clients.control.is_paused(runtime.queue))
        return runtime

    return make_runtime
