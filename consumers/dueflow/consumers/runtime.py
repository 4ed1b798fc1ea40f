"""The worker of one queue in one process: dispatch, outcomes, commits, rebalances.

One consumer (group ``<prefix>.worker.<queue>``, range assignment, so one
member owns partition p of the exec topic and of every retry tier) and one
transactional producer. Everything here runs on the event loop; the
consumer, the key tail and the transactions run on their own threads.

For each record, at the head of its partition:

1. not due yet (``df-due``, the retry's "not before") -> the partition
   waits (paused) until it is: a record never runs early;
2. its key is final in the key store (done, dead, cancelled) or finished
   in a batch not committed yet -> skipped, counted, outcome
   ``duplicate``/``cancelled``; a reschedule of the key says another due
   time runs -> skipped, outcome ``rescheduled`` (dueflow.records.reschedule); a
   first attempt past its deadline (``df-expires``) -> not run, outcome
   ``expired`` (dueflow.rules.deadline);
3. a record with the same key is running (a replay) -> held until that one
   finishes, then decided again;
   a cron occurrence of a schedule with an overlap policy while another of
   its occurrences runs -> skipped (outcome ``skipped``) or, ``buffer_one``,
   held until it finishes (dueflow.rules.cron_overlap);
4. undecodable value or payload, unknown task -> dead letter at once;
5. rate limits (queue, task) -> the partitions pause until a token is due;
6. a concurrency slot -> the handler runs.

Steps 1 to 4 (and the overlap policy) are :func:`dueflow.consumers.decision.decide`,
a pure function; the runtime's and its partitions' lifecycles are the states
of :mod:`dueflow.consumers.feed_states`.

A finished attempt adds its records to the current batch: success ->
idempotency ``done`` + outcome ``succeeded``; retriable failure -> retry
tier record + outcome ``retrying``; permanent or exhausted -> DLQ record +
idempotency ``dead`` + outcome ``dead``. The batch commits with the offsets
(lowest unfinished per partition) in one transaction every
``commit_interval_ms``. Outcome ``started`` is not written: it would double
the writes per job, and "running" is what a job is between ``fired`` (or
``retrying``) and its next outcome.

:class:`QueueRuntime` builds the queue's parts and runs its life (start,
shutdown); each part has one job:

- :class:`~dueflow.consumers.intake.Intake`: the assigned partitions, their
  backlogs and back pressure;
- :class:`~dueflow.consumers.dispatch.Dispatcher`: the head records, each
  carried to its verdict;
- :class:`~dueflow.consumers.attempts.Attempts`: running attempts, their ends
  recorded in the batch (:class:`~dueflow.consumers.recorder.BatchRecorder`);
- :class:`~dueflow.consumers.commit_loop.CommitLoop`: the batch committed
  exactly once;
- :class:`~dueflow.consumers.membership.MembershipDoubt`: nothing starts while
  this member may have been expelled unawares;
- :class:`~dueflow.consumers.rebalance.RebalanceHandler`: partitions assigned,
  revoked, lost, and loaded;
- :class:`~dueflow.consumers.connection.GroupConnection`: the clients in the
  group, connected at start and again after a restart;
- :class:`~dueflow.consumers.gauges.QueueGauges`: what the queue reports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from typing import Any

from dueflow.config import QueueSpec, Settings
from dueflow.consumers.assignment_check import AssignmentCheck, GroupAsker
from dueflow.consumers.attempts import Attempts
from dueflow.consumers.commands import CommandApplier, SteeringBook
from dueflow.consumers.commit_loop import CommitLoop
from dueflow.consumers.connection import GroupConnection
from dueflow.consumers.dispatch import Dispatcher
from dueflow.consumers.dlq_depth import DlqDepth
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.feed_states import RuntimeEvent
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits
from dueflow.consumers.follow_ups import FollowUpPlanner, FollowUpSetup
from dueflow.consumers.gauges import DLQ_DEPTH_EVERY_S, GAUGES_EVERY_S, QueueGauges
from dueflow.consumers.hooks import HookRunner
from dueflow.consumers.intake import Intake
from dueflow.consumers.lead_fence import LeadFence
from dueflow.consumers.loop_watch import LoopWatch, Step
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.oversized import WriteLimits
from dueflow.consumers.polling import settled_position
from dueflow.consumers.progress import ProgressBudget, ProgressReporter, monotonic_ms
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.ratelimit import QueueRates
from dueflow.consumers.rebalance import RebalanceHandler
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.run_state import RunState
from dueflow.consumers.slots import Slots
from dueflow.consumers.steering_loader import SteeringLoader
from dueflow.consumers.steering_store import SteeringStoreFactory, memory_steering_stores
from dueflow.consumers.store import StoreFactory
from dueflow.consumers.tail import KeyTail
from dueflow.kafka.clients import make_admin
from dueflow.kafka.clock_probe import ClockProbe
from dueflow.kafka.group_config import (
    apply_group_configs,
    incremental,
    worker_group_configs,
)
from dueflow.kafka.topic_limits import TopicLimits
from dueflow.kafka.topics import names, tier_label
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.set_aside import RecordLimit
from dueflow.records.size_budget import QueueLimits
from dueflow.records.timer_record import TimerPlacer
from dueflow.rules.backoff import WHEEL
from dueflow.wall_clock import wall_ms as _wall_ms

__all__ = ["QueueRuntime", "Slots"]

_LOG = logging.getLogger("dueflow.worker")
_EXPIRE_EVERY_S = 60.0


def _key_state(pending: dict[bytes, int]) -> Any:
    """What a command sees of its job's key: the batch's newest state, else the store's."""

    def get(feed: PartitionFeed, key: bytes) -> int | None:
        state = pending.get(key)
        return state if state is not None else feed.keys.get(key)

    return get


class QueueRuntime:
    """Consumes one queue's exec and retry topics and commits outcomes exactly once."""

    def __init__(
        self,
        settings: Settings,
        queue: QueueSpec,
        *,
        registry: TaskRegistry,
        executor: JobExecutor,
        slots: Slots,
        metrics: Metrics,
        stores: StoreFactory,
        quarantine: Quarantine,
        worker_id: str,
        tracer: JobTracer | None = None,
        rng: random.Random | None = None,
        clock: ClockProbe | None = None,
        hooks: HookRunner | None = None,
        follow_ups: FollowUpSetup | None = None,
        limits: TopicLimits | None = None,
        steering_stores: SteeringStoreFactory | None = None,
        progress_budget: ProgressBudget | None = None,
        group_asker: GroupAsker | None = None,
    ) -> None:
        self._settings = settings
        self._group_asker = group_asker  # None: no assignment check (an embedded runtime)
        # The record size limits of the queue's topics (read at start, and again
        # after a commit was refused as too large): see consumers/oversized.py.
        self._topic_limits = limits
        # "Is it due?" is asked of the broker's clock, as near as it is known.
        self._due_now = clock.due_now_ms if clock is not None else _wall_ms
        self._stamp_now = clock.stamp_now_ms if clock is not None else _wall_ms
        self._tracer = tracer or JobTracer()
        self._ws = settings.worker
        self._queue = queue
        self._metrics = metrics
        self._quarantine = quarantine
        self._worker_id = worker_id
        n = names(settings)
        self._exec_topic = n.exec(queue.name)
        self._tier_topics = [n.retry(queue.name, tier) for tier in queue.retry_tiers_ms]
        self._group = n.worker_group(queue.name)
        self._life = RunState()  # closing, restarting, closed (lifecycle.py)
        self._tail = KeyTail(
            settings,
            topic=n.idempotency(queue.name),
            queue=queue.name,
            retention_ms=queue.idempotency_retention_ms,
            stores=stores,
            quarantine=quarantine,
            group=self._group,
            metrics=metrics,
        )
        self._running: dict[bytes, Delivery] = {}  # key -> its running attempt
        self._overlap = OverlapGuard()  # cron occurrences of schedules with a policy
        self._build_recorder(registry, rng, follow_ups, progress_budget)
        self._build_steering(steering_stores, follow_ups)
        self._rates = QueueRates(
            queue.rate_limit_per_s,
            task_rates={
                t.spec.name: t.spec.rate_limit for t in registry if t.spec.rate_limit is not None
            },
            partitions=queue.partitions,
            now=time.monotonic(),
        )
        self._open_series()
        self._loop = asyncio.get_running_loop()
        self._build_parts(registry, executor, slots, hooks)

    def _build_recorder(
        self,
        registry: TaskRegistry,
        rng: random.Random | None,
        follow_ups: FollowUpSetup | None,
        progress_budget: ProgressBudget | None,
    ) -> None:
        """The batch recorder, with what it writes for follow-ups and progress."""
        settings, queue, ws = self._settings, self._queue, self._ws
        # ctx.schedule: follow-ups written with their attempt's success (follow_ups.py).
        self._chain = FollowUpPlanner.of_runtime(
            settings, registry, self._stamp_now, self._running, self._tracer.enabled, follow_ups
        )
        # ctx.progress: the newest value per attempt, written at cuts (progress.py).
        self._progress = ProgressReporter(
            queue=queue.name,
            outcomes_topic=names(settings).outcomes,
            worker_id=self._worker_id,
            interval_ms=ws.progress_interval_ms,
            running_after_ms=ws.report_running_after_ms,
            budget=progress_budget or ProgressBudget(ws.progress_max_per_s, now_ms=monotonic_ms()),
        )
        self._batch = BatchRecorder(
            settings,
            queue,
            worker_id=self._worker_id,
            metrics=self._metrics,
            tracer=self._tracer,
            rng=rng or random.Random(),
            follow_ups=self._chain,
            progress=self._progress,
            # records: a finished job writes two (its key state and its outcome)
            limit=2 * ws.commit_max_jobs,
        )

    def _build_steering(
        self, steering_stores: SteeringStoreFactory | None, follow_ups: FollowUpSetup | None
    ) -> None:
        """Steering: commands in the exec partitions, applied by their owner (commands.py)."""
        settings, queue = self._settings, self._queue
        n = names(settings)
        self._book = SteeringBook(
            queue.name,
            self._ws.steering_grace(queue),
            steering_stores or memory_steering_stores(),
        )
        self._steer = CommandApplier(
            queue=queue.name,
            book=self._book,
            recorder=self._batch,
            topics=n,
            placer=TimerPlacer(settings.wheel),
            worker_id=self._worker_id,
            metrics=self._metrics,
            key_state=_key_state(self._batch.pending_final),
            max_timer_bytes=(follow_ups or FollowUpSetup()).max_record_bytes,
        )
        self._batch.steering = self._steer
        groups = self._steer.groups.book
        self._steering_loader = SteeringLoader(
            settings,
            topic=n.steering(queue.name),
            queue=queue.name,
            quarantine=self._quarantine,
            group=self._group,
            metrics=self._metrics,
            on_groups=lambda p, staged, whole: groups.load(p, staged, whole=whole),
            groups_unread=groups.unread,
        )

    def _open_series(self) -> None:
        """Series a dashboard rates over exist from the start (at 0), not from the first event."""
        metrics, queue = self._metrics, self._queue
        metrics.duplicates_skipped.labels(queue.name)
        for tier in queue.retry_tiers_ms:
            metrics.retries.labels(queue.name, tier_label(tier))
        metrics.retries.labels(queue.name, WHEEL)  # retries longer than the top tier
        metrics.in_flight.labels(queue.name).set(0)

    def _build_parts(
        self,
        registry: TaskRegistry,
        executor: JobExecutor,
        slots: Slots,
        hooks: HookRunner | None,
    ) -> None:
        """The collaborators that run the queue (see the module's docstring)."""
        self._build_commits()
        self._build_attempts(executor, slots, hooks)
        self._build_dispatcher(registry, slots)
        self._build_rebalance()
        self._build_gauges()
        self._build_assignment_check()

    def _build_commits(self) -> None:
        """The partitions' intake, the doubt about membership, and the commit loop."""
        queue, ws = self._queue, self._ws
        commit_soon = asyncio.Event()
        self._intake = Intake(
            queue=queue.name,
            group=self._group,
            fetch_batch=ws.fetch_batch,
            concurrency=ws.concurrency,
            life=self._life,
            metrics=self._metrics,
            overlap=self._overlap,
        )
        self._doubt = MembershipDoubt(
            queue=queue.name,
            heartbeat_ms=ws.heartbeat_ms,
            life=self._life,
            on_doubt=commit_soon.set,
            on_confirmed=self._start_again,
        )
        self._commits = CommitLoop(
            self._settings,
            queue=queue.name,
            group=self._group,
            worker_id=self._worker_id,
            life=self._life,
            feeds=self._intake.feeds,
            running=self._running,
            recorder=self._batch,
            doubt=self._doubt,
            soon=commit_soon,
            metrics=self._metrics,
            stamp_now=self._stamp_now,
            restart_soon=self._restart_soon,
            read_limits=lambda: self._read_limits(again=True),
        )

    def _build_attempts(
        self, executor: JobExecutor, slots: Slots, hooks: HookRunner | None
    ) -> None:
        self._attempts = Attempts(
            self._settings,
            self._queue,
            life=self._life,
            intake=self._intake,
            slots=slots,
            executor=executor,
            recorder=self._batch,
            commits=self._commits,
            running=self._running,
            overlap=self._overlap,
            metrics=self._metrics,
            tracer=self._tracer,
            hooks=hooks,
            worker_id=self._worker_id,
            stamp_now=self._stamp_now,
            schedule_pump=lambda: self._dispatcher.schedule_pump(),
            restart_soon=self._restart_soon,
        )

    def _build_dispatcher(self, registry: TaskRegistry, slots: Slots) -> None:
        asks = self._metrics.lead_fence_asks
        self._fence = LeadFence(
            queue=self._queue.name,
            due_now=self._due_now,
            on_reached=lambda feed: self._dispatcher.fence_reached(feed),
            position=lambda tp: settled_position(self._intake.poller, tp),
            count_ask=lambda result: asks.labels(self._queue.name, result).inc(),
        )
        queue, ws = self._queue, self._ws
        self._dispatcher = Dispatcher(
            queue=queue.name,
            life=self._life,
            intake=self._intake,
            doubt=self._doubt,
            slots=slots,
            recorder=self._batch,
            running=self._running,
            overlap=self._overlap,
            registry=registry,
            rates=self._rates,
            book=self._book,
            steer=self._steer,
            quarantine=self._quarantine,
            metrics=self._metrics,
            limits=WireLimits(skew_ms=ws.max_clock_skew_ms, tiers_ms=tuple(queue.retry_tiers_ms)),
            due_now=self._due_now,
            start=self._attempts.start,
            recheck=lambda feed: self._rebalance.recheck(feed),
            fence=self._fence,
            margin_ms=ws.steering_margin_ms,
        )

    def _build_rebalance(self) -> None:
        """The rebalance callbacks, and the connection they are given to."""
        queue = self._queue
        tier_of: dict[str, int | None] = {self._exec_topic: None}
        tier_of.update(zip(self._tier_topics, queue.retry_tiers_ms, strict=True))
        self._rebalance = RebalanceHandler(
            queue=queue.name,
            life=self._life,
            intake=self._intake,
            tail=self._tail,
            book=self._book,
            steer=self._steer,
            steering_loader=self._steering_loader,
            recorder=self._batch,
            planner=self._chain,
            progress=self._progress,
            tier_of=tier_of,
            rates=self._rates,
            doubt=self._doubt,
            inflight_changed=self._attempts.inflight_changed,
            grace_s=self._ws.rebalance_grace_s,
            commit_now=self.commit_now,
            restart=self._restart,
            pump=self._dispatcher.pump,
        )
        self._connection = GroupConnection(
            self._settings,
            queue=queue.name,
            group=self._group,
            topics=[self._exec_topic, *self._tier_topics],
            life=self._life,
            intake=self._intake,
            recorder=self._batch,
            commits=self._commits,
            doubt=self._doubt,
            rebalance=self._rebalance,
            on_batch=self._on_batch,
        )

    def _build_gauges(self) -> None:
        """What the queue reports, on the commit loop's ticks (and its expiries)."""
        queue, metrics = self._queue, self._metrics
        dlq = names(self._settings).dlq(queue.name)
        self._dlq_depth = DlqDepth(dlq, queue.partitions, metrics.dlq_depth.labels(queue.name).set)
        self._gauges = QueueGauges(
            queue=queue.name,
            group=self._group,
            metrics=metrics,
            intake=self._intake,
            book=self._book,
            dlq_depth=self._dlq_depth,
        )
        self._commits.every(GAUGES_EVERY_S, self._gauges.update, first_after=0.0)
        self._commits.every(_EXPIRE_EVERY_S, self._expire, first_after=_EXPIRE_EVERY_S)
        self._commits.every(DLQ_DEPTH_EVERY_S, self._gauges.report_dlq_depth, first_after=1.0)

    def _build_assignment_check(self) -> None:
        """The check that the consumer holds what the coordinator gave it (KIP-848)."""
        ws, connection = self._ws, self._connection
        self._assignment: AssignmentCheck | None = None
        asker = self._group_asker
        if asker is None or not (incremental(ws) and ws.assignment_check_s > 0):
            return
        self._assignment = AssignmentCheck(
            queue=self._queue.name,
            group=self._group,
            describe=asker.members,
            held=connection.held,
            settled=connection.settled,
            rejoin=connection.rejoin,
            count=self._metrics.worker_rejoins.labels(self._queue.name).inc,
        )
        every = ws.assignment_check_s
        self._commits.every(every, self._assignment.tick, first_after=every)

    # ================================================================== lifecycle

    @property
    def queue(self) -> str:
        return self._queue.name

    @property
    def spec(self) -> QueueSpec:
        return self._queue

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return sorted(self._intake.feeds)

    async def start(self) -> None:
        """Set the group's broker-side configs, create the clients, join, consume."""
        configs = worker_group_configs(self._ws)
        admin = make_admin(self._settings)
        if configs:
            await self._loop.run_in_executor(
                None, lambda: apply_group_configs(admin, [self._group], configs)
            )
        self._dlq_depth.start(admin)
        self._fence.start(admin)
        self._tail.start()
        await self._read_limits()
        self._steering_loader.start()
        await self._connection.connect_until_up(first=True)
        self._commits.start()
        self._doubt.alive()

    def readiness(self) -> str | None:
        """None while the queue runs and its consumer is a member of the group,
        connected to the coordinator; else why not (read from any thread)."""
        if not self._life.running:
            return f"queue {self._life.now.value}"
        return self._connection.group_stats.reason()

    async def _read_limits(self, *, again: bool = False) -> None:
        """Read the limits of the queue's topics (off the loop) for the recorder."""
        reader = self._topic_limits
        if reader is None:
            return
        if again:
            reader.forget(self.queue)
        limits = await self._loop.run_in_executor(None, reader.of, self._queue)
        self._batch.limits = WriteLimits(limits)
        self._on_limits(limits)

    def _on_limits(self, limits: QueueLimits) -> None:
        """The quarantine writer learns its topic's limit too."""
        self._quarantine.limit = RecordLimit(
            limits.quarantine.topic, limits.quarantine.max_bytes, limits.producer_max_bytes
        )

    def _on_batch(self, msgs: list[Any]) -> None:
        self._intake.on_batch(msgs, load=self._rebalance.load, pump=self._dispatcher.pump)

    def _start_again(self) -> None:
        """Membership confirmed: every partition not held may start jobs again."""
        self._intake.ready_all()
        self._dispatcher.schedule_pump()

    @property
    def paused(self) -> bool:
        return self._intake.operator_paused

    def set_paused(self, paused: bool) -> None:
        """An operator paused (or resumed) the queue: stop (or go on) starting its jobs.

        Its partitions are paused in the consumer (running jobs finish and
        commit; the group membership stays), so the records wait in Kafka.
        """
        intake = self._intake
        if paused == intake.operator_paused:
            return
        intake.operator_paused = paused
        event(_LOG, "queue paused" if paused else "queue resumed", queue=self.queue)
        intake.sync_all()
        if not paused:
            self._start_again()

    def stop_taking(self) -> None:
        """Shutdown, step 1: start nothing new and stop fetching."""
        self._life.move(RuntimeEvent.STOP)
        self._intake.sync_all()

    @property
    def in_flight(self) -> int:
        return self._intake.in_flight

    async def close(self, *, leave: bool = True) -> None:
        """Shutdown, step 2: commit what finished, leave the group, close the clients.

        ``leave=False`` commits and stops without leaving the group (see
        :meth:`GroupPoller.stop`): the process exits right after.
        """
        self._life.move(RuntimeEvent.STOP)
        poller = self._intake.poller
        if poller is not None:
            if not leave and not self._life.restarting:
                await self.commit_now()
            poller.stop(leave=leave)
            await poller.wait_closed()  # when leaving, the final revoke commits
        self._life.move(RuntimeEvent.CLOSE)
        self._doubt.stop()
        await self._commits.stop()
        await self._tail.close()
        await self._steering_loader.close()
        self._book.close()

    async def _restart(self, reason: str) -> None:
        await self._connection.restart(reason)

    def _restart_soon(self, reason: str, *, since_ms: int | None = None) -> None:
        self._connection.restart_soon(reason, since_ms=since_ms)

    # ================================================================== blocked loop

    def owns(self, d: Any) -> bool:
        """Whether ``d`` is a delivery of a partition this runtime holds (any thread)."""
        feed = getattr(d, "feed", None)
        return feed is not None and self._intake.feeds.get((feed.topic, feed.partition)) is feed

    def take_blocked(
        self, step: Step, watch: LoopWatch, blocked_s: float
    ) -> concurrent.futures.Future[Any] | None:
        """Record the attempt of ``step``, whose handler blocks the event loop past its
        deadline, as timed out (see :meth:`Attempts.take_blocked`)."""
        return self._attempts.take_blocked(step, watch, blocked_s)

    # ================================================================== commits

    async def commit_now(self, *, validate: bool = False) -> bool:
        """Commit what finished so far in one transaction; False when it failed
        (see :meth:`CommitLoop.commit_now`)."""
        return await self._commits.commit_now(validate=validate)

    def _expire(self) -> None:
        """Forget idempotency keys past their retention, and steering tokens only an
        outage longer than the grace could deliver (their changes commit with the
        next batch)."""
        self._tail.expire(int(time.time() * 1000))
        if not self._life.running or not (len(self._book) or len(self._steer.groups.book)):
            return
        exec_feeds = {
            f.partition: f for f in self._intake.feeds.values() if f.tier_ms is None and f.loaded
        }
        if self._steer.sweep(exec_feeds, self._due_now()):
            self._commits.soon.set()

    def stats(self) -> dict[str, Any]:
        """A snapshot for tests and the CLI."""
        return self._gauges.stats(keys=self._tail.keys, pending_records=len(self._batch))
