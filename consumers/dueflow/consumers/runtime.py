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
of :mod:`dueflow.consumers.lifecycle`.

A finished attempt adds its records to the current batch: success ->
idempotency ``done`` + outcome ``succeeded``; retriable failure -> retry
tier record + outcome ``retrying``; permanent or exhausted -> DLQ record +
idempotency ``dead`` + outcome ``dead``. The batch commits with the offsets
(lowest unfinished per partition) in one transaction every
``commit_interval_ms``. Outcome ``started`` is not written: it would double
the writes per job, and "running" is what a job is between ``fired`` (or
``retrying``) and its next outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.committer import (
    PASSING_START_ERRORS,
    WEDGE_GRACE_S,
    CommitFailed,
    TransactionalCommitter,
)
from dueflow.consumers.context import TaskContext
from dueflow.consumers.decision import Kind, decide
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import (
    Delivery,
    PartitionFeed,
    attempt_limits,
    prepare,
    trace_id,
)
from dueflow.consumers.follow_ups import FollowUpPlanner, FollowUpSetup
from dueflow.consumers.hooks import HookRunner
from dueflow.consumers.lifecycle import FeedState, RuntimeEvent, RuntimeState, runtime_move
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.polling import GroupPoller
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.ratelimit import QueueRates
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.spans import end_attempt, start_attempt
from dueflow.consumers.store import StoreFactory
from dueflow.consumers.tail import KeyTail
from dueflow.errors import DueflowError
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor, abandon
from dueflow.kafka.clients import make_admin, make_consumer
from dueflow.kafka.clock_probe import ClockProbe
from dueflow.kafka.group_config import (
    apply_group_configs,
    incremental,
    worker_consumer_config,
    worker_group_configs,
)
from dueflow.kafka.topics import names, tier_label
from dueflow.observability.logs import JOB_STARTED, event, job_event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.fast import F_JOB_ID, F_TASK
from dueflow.rules.backoff import WHEEL
from dueflow.wall_clock import wall_ms as _wall_ms

_LOG = logging.getLogger("dueflow.worker")
_EXPIRE_EVERY_S = 60.0
_GAUGES_EVERY_S = 1.0
_ALIVE_EVERY_S = 0.1
_DLQ_DEPTH_EVERY_S = 15.0
_WEDGE_CHECK_S = 0.25  # how often a commit in progress is asked whether it is wedged
# Consumer errors after which this member may have been expelled unawares.
_CONNECTION_LOST = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT})


def _passing(exc: BaseException) -> bool:
    """A client error that says "not now" (retry), not "never"."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (
        err.retriable() or (err.code() in PASSING_START_ERRORS and not err.fatal())
    )


class Slots:
    """The per-process concurrency bound, shared by every queue's runtime."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiting: list[Any] = []
        self._scheduled = False

    def wait(self, pump: Any) -> None:
        """Call ``pump`` when a slot frees."""
        if pump not in self._waiting:
            self._waiting.append(pump)

    def release(self) -> None:
        self.free += 1
        if self._waiting and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        for pump in waiting:
            pump()


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
    ) -> None:
        self._settings = settings
        # "Is it due?" is asked of the broker's clock, as near as it is known.
        self._due_now = clock.due_now_ms if clock is not None else _wall_ms
        self._stamp_now = clock.stamp_now_ms if clock is not None else _wall_ms
        self._tracer = tracer or JobTracer()
        self._tracing = self._tracer.enabled
        self._log_starts = settings.observability.job_log == "all"
        self._ws = settings.worker
        self._queue = queue
        self._registry = registry
        self._executor = executor
        self._slots = slots
        self._metrics = metrics
        n = names(settings)
        self._exec_topic = n.exec(queue.name)
        self._tier_topics = [n.retry(queue.name, tier) for tier in queue.retry_tiers_ms]
        self._tier_of: dict[str, int | None] = {self._exec_topic: None}
        self._tier_of.update(zip(self._tier_topics, queue.retry_tiers_ms, strict=True))
        self._group = n.worker_group(queue.name)
        # Unique per process and queue; zombies are fenced by the group generation (KIP-447).
        self._worker_id = worker_id
        self._txn_id = self._new_txn_id()
        self._tail = KeyTail(
            settings,
            topic=n.idempotency(queue.name),
            retention_ms=queue.idempotency_retention_ms,
            stores=stores,
            quarantine=quarantine,
            group=self._group,
        )
        self._running: dict[bytes, Delivery] = {}  # key -> its running attempt
        # ctx.schedule: follow-ups written with their attempt's success (follow_ups.py).
        self._chain = FollowUpPlanner.of_runtime(
            settings, registry, self._stamp_now, self._running, self._tracing, follow_ups
        )
        self._batch = BatchRecorder(
            settings,
            queue,
            worker_id=worker_id,
            metrics=metrics,
            tracer=self._tracer,
            rng=rng or random.Random(),
            follow_ups=self._chain,
        )
        self._hooks = hooks if hooks is not None and hooks.has_failure_hooks else None
        self._rates = QueueRates(
            queue.rate_limit_per_s,
            task_rates={
                t.spec.name: t.spec.rate_limit for t in registry if t.spec.rate_limit is not None
            },
            partitions=queue.partitions,
            now=time.monotonic(),
        )
        # Series a dashboard rates over exist from the start (at 0), not from the first event.
        metrics.duplicates_skipped.labels(queue.name)
        for tier in queue.retry_tiers_ms:
            metrics.retries.labels(queue.name, tier_label(tier))
        metrics.retries.labels(queue.name, WHEEL)  # retries longer than the top tier
        metrics.in_flight.labels(queue.name).set(0)
        # Back pressure: a partition whose backlog reaches _high stops fetching until _low.
        self._high = max(2 * self._ws.fetch_batch, 2 * self._ws.concurrency)
        self._low = self._high // 2
        self._feeds: dict[tuple[str, int], PartitionFeed] = {}
        self._ready: deque[PartitionFeed] = deque()
        self._held: dict[bytes, list[Delivery]] = {}  # key -> replays waiting for it
        self._overlap = OverlapGuard()  # cron occurrences of schedules with a policy
        self._queue_held = False
        self._operator_paused = False  # `dueflow queue pause`: start nothing, keep the group
        # Whether this member may have been expelled without knowing it yet (see
        # _doubt_membership): no job starts until a commit has proved otherwise.
        self._in_doubt = False
        self._doubts = 0  # times doubt arose: a commit cut before the last one proves nothing
        self._alive_at = time.monotonic()
        self._stall_s = _ALIVE_EVERY_S + max(1.0, self._ws.heartbeat_ms / 1000)
        # A batch not committed this long after its cut is aborted (see
        # committer._still_ours): by then the member may have been expelled.
        self._commit_window_s = max(
            1.0, (self._ws.session_timeout_ms - self._ws.heartbeat_ms) / 1000
        )
        self._ticker: asyncio.TimerHandle | None = None
        self._pump_scheduled = False
        self._life = RuntimeState.RUNNING  # closing, restarting, closed (lifecycle.py)
        self._inflight_changed = asyncio.Event()
        self._commit_soon = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._consumer: Consumer | None = None
        self._committer: TransactionalCommitter | None = None
        self._poller: GroupPoller | None = None
        self._txn_thread = DaemonThreadExecutor(f"dueflow-txn-{queue.name}")
        # A commit that takes longer than this is given up (librdkafka can block
        # in send_offsets_to_transaction forever, see dueflow.kafka.blocking): the
        # producer is abandoned and the queue starts over from committed offsets.
        # A commit's own calls end by the transaction timeout (plus a bounded abort).
        self._commit_deadline_s = max(5.0, self._ws.transaction_timeout_ms / 1000) + 7.0
        self._commit_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    # ================================================================== lifecycle

    @property
    def queue(self) -> str:
        return self._queue.name

    @property
    def spec(self) -> QueueSpec:
        return self._queue

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return sorted(self._feeds)

    async def start(self) -> None:
        """Set the group's broker-side configs, create the clients, join, consume."""
        configs = worker_group_configs(self._ws)
        if configs:
            admin = make_admin(self._settings)
            await self._loop.run_in_executor(
                None, lambda: apply_group_configs(admin, [self._group], configs)
            )
        self._tail.start()
        await self._connect_until_up(first=True)
        self._commit_task = self._loop.create_task(self._commit_loop())
        self._alive()

    async def _connect(self) -> None:
        ws = self._ws
        self._consumer = make_consumer(
            self._settings,
            self._group,
            **{
                **worker_consumer_config(ws),
                "error_cb": self._on_client_error,
                "fetch.wait.max.ms": 100,
                "queued.max.messages.kbytes": 32_768,
            },
        )
        poller = GroupPoller(
            self._consumer,
            [self._exec_topic, *self._tier_topics],
            batch_size=ws.fetch_batch,
            on_batch=self._on_batch,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
            name=f"dueflow-poll-{self._queue.name}",
            incremental=incremental(ws),
        )
        if self._committer is not None and self._committer.resumable:
            # The last start timed out: resume its registration, never race it.
            self._committer.bind(lambda: poller.group_metadata)
        else:
            self._committer = TransactionalCommitter(
                self._settings,
                self._txn_id,
                lambda: poller.group_metadata,
                queue=self._queue.name,
                incremental=incremental(ws),
            )
        try:
            await self._in_txn_thread(self._committer.start)
        except BaseException:
            self._consumer.close()  # never subscribed: closes at once
            raise
        self._poller = poller
        poller.start()

    @property
    def paused(self) -> bool:
        return self._operator_paused

    def set_paused(self, paused: bool) -> None:
        """An operator paused (or resumed) the queue: stop (or go on) starting its jobs.

        Its partitions are paused in the consumer (running jobs finish and
        commit; the group membership stays), so the records wait in Kafka.
        """
        if paused == self._operator_paused:
            return
        self._operator_paused = paused
        event(_LOG, "queue paused" if paused else "queue resumed", queue=self.queue)
        for feed in self._feeds.values():
            self._sync_pause(feed)
        if not paused:
            for feed in self._feeds.values():
                if not feed.held:
                    self._make_ready(feed)
            self._schedule_pump()

    def stop_taking(self) -> None:
        """Shutdown, step 1: start nothing new and stop fetching."""
        self._move(RuntimeEvent.STOP)
        for feed in self._feeds.values():
            self._sync_pause(feed)

    @property
    def in_flight(self) -> int:
        return sum(f.inflight for f in self._feeds.values())

    async def close(self, *, leave: bool = True) -> None:
        """Shutdown, step 2: commit what finished, leave the group, close the clients.

        ``leave=False`` commits and stops without leaving the group (see
        :meth:`GroupPoller.stop`): the process exits right after.
        """
        self._move(RuntimeEvent.STOP)
        if self._poller is not None:
            if not leave and not self._life.restarting:
                await self.commit_now()
            self._poller.stop(leave=leave)
            await self._poller.wait_closed()  # when leaving, the final revoke commits
        self._move(RuntimeEvent.CLOSE)
        if self._ticker is not None:
            self._ticker.cancel()
        self._commit_soon.set()
        if self._commit_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
        if self._committer is not None:
            with contextlib.suppress(ClientWedged):
                await self._in_txn_thread(self._committer.close)
        await self._tail.close()
        self._txn_thread.shutdown(wait=False)

    def _move(self, on: RuntimeEvent) -> None:
        self._life = runtime_move(self._life, on)

    def _begin_restart(self) -> bool:
        """Enter a restart (nothing starts or commits meanwhile); False when one is
        under way already or the runtime is closed."""
        if not self._life.may_restart:
            return False
        self._move(RuntimeEvent.RESTART)
        return True

    async def _restart(self, reason: str, since_ms: int | None = None) -> None:
        """Forget all uncommitted work and rejoin: redelivery and the key store do the rest.

        Called after :meth:`_begin_restart` said yes.
        """
        doubt = {} if since_ms is None else {"in_doubt_since_ms": since_ms}
        event(
            _LOG,
            "worker restarting queue",
            logging.WARNING,
            queue=self.queue,
            reason=reason,
            **doubt,
        )
        for feed in self._feeds.values():
            self._forget(feed)
        self._feeds.clear()
        self._ready.clear()
        self._batch.clear()
        self._held.clear()
        if self._poller is not None:
            self._poller.stop()
            await self._poller.wait_closed()
        if self._committer is not None:
            with contextlib.suppress(ClientWedged):
                await self._in_txn_thread(self._committer.close)
        await self._connect_until_up(first=False)
        self._move(RuntimeEvent.RESTARTED)

    async def _connect_until_up(self, *, first: bool) -> None:
        """Connect, again every second while the cluster is not ready for it (a
        broker restarting, a transaction coordinator moving or still loading:
        init_transactions times out or says COORDINATOR_LOAD_IN_PROGRESS). At the
        first start only such passing errors are retried; anything else (a
        refused authorization, bad settings) is raised to the caller."""
        while not self._life.closing:
            try:
                await self._connect()
                return
            except ClientWedged as exc:
                self._abandon_producer()
                why = str(exc)
            except (KafkaException, DueflowError) as exc:
                if first and not _passing(exc):
                    raise
                why = str(exc)
                await asyncio.sleep(1.0)
            event(
                _LOG,
                "worker start failed; again" if first else "worker reconnect failed",
                logging.WARNING,
                queue=self.queue,
                error=why,
            )

    def _restart_soon(self, reason: str, *, since_ms: int | None = None) -> None:
        """Start over from the committed offsets, in a task of its own.

        ``since_ms``: the wall time the dropped work has been in doubt since (a
        wedged commit's start), logged with the restart.

        Never awaited where it is decided: a commit can fail inside a rebalance
        callback, whose consumer thread waits for the callback, while the
        restart waits for that thread to close its consumer.
        """
        if self._begin_restart():
            self._loop.create_task(self._restart(reason, since_ms))

    # ================================================================== rebalance

    async def _on_assign(self, partitions: list[TopicPartition]) -> None:
        # The coordinator just told this member what it owns (also after an
        # incremental change: the whole assignment is current).
        self._membership_confirmed()
        for tp in partitions:
            if (tp.topic, tp.partition) in self._feeds:
                continue
            keys = self._tail.attach(tp.partition)
            tier = self._tier_of.get(tp.topic)
            feed = PartitionFeed(tp.topic, tp.partition, tier, keys, self._chain)
            self._feeds[(tp.topic, tp.partition)] = feed
        self._tail.drop_parked()
        self._recompute_rates()
        event(
            _LOG,
            "partitions assigned",
            queue=self.queue,
            partitions=sorted({tp.partition for tp in partitions}),
        )

    async def _on_revoke(self, partitions: list[TopicPartition]) -> None:
        feeds = [f for tp in partitions if (f := self._feeds.get((tp.topic, tp.partition)))]
        for feed in feeds:
            feed.advance(FeedState.REVOKED)
            feed.backlog.clear()  # undispatched: the next owner reads them again
        self._ready = deque(f for f in self._ready if not f.revoked)
        grace = 0.0 if self._life is not RuntimeState.RUNNING else self._ws.rebalance_grace_s
        deadline = self._loop.time() + grace
        while any(f.inflight for f in feeds):
            left = deadline - self._loop.time()
            if left <= 0:
                event(
                    _LOG,
                    "abandoning in-flight jobs of revoked partitions",
                    logging.WARNING,
                    queue=self.queue,
                    jobs=sum(f.inflight for f in feeds),
                )
                break
            self._inflight_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._inflight_changed.wait(), left)
        if not self._life.restarting:
            # Commits what finished; never past an unfinished (or abandoned) job.
            await self.commit_now()
        for feed in feeds:
            self._forget(feed)
            self._feeds.pop((feed.topic, feed.partition), None)
        for p in {f.partition for f in feeds}:
            if not any(f.partition == p for f in self._feeds.values()):
                self._tail.park(p)
        self._recompute_rates()

    async def _on_lost(self, partitions: list[TopicPartition]) -> None:
        event(_LOG, "partitions lost", logging.WARNING, queue=self.queue)
        for tp in partitions:
            feed = self._feeds.pop((tp.topic, tp.partition), None)
            if feed is not None:
                self._forget(feed)
        self._ready = deque(f for f in self._ready if not f.gone)
        self._batch.lost()
        for p in {tp.partition for tp in partitions}:
            if not any(f.partition == p for f in self._feeds.values()):
                self._tail.park(p)
        self._recompute_rates()

    def _forget(self, feed: PartitionFeed) -> None:
        feed.advance(FeedState.GONE)
        feed.backlog.clear()
        with contextlib.suppress(KeyError):  # its lag is the new owner's to report now
            self._metrics.consumer_lag.remove(self._group, feed.topic, str(feed.partition))
        if feed.timer is not None:
            feed.timer.cancel()
            feed.timer = None
        self._held = {
            k: kept for k, v in self._held.items() if (kept := [d for d in v if not d.feed.gone])
        }
        self._overlap.forget_gone()

    # ================================================================== intake

    def _on_batch(self, msgs: list[Any]) -> None:
        if self._poller is not None:
            self._poller.batch_taken()
        if self._life.restarting:
            return
        feeds = self._feeds
        # Offsets per feed, added to its tracker once per batch (hot path).
        touched: dict[PartitionFeed, list[int]] = {}
        last: tuple[str, int] | None = None
        feed: PartitionFeed | None = None
        offsets: list[int] = []
        append = None
        for msg in msgs:
            if msg.error() is not None:
                err = msg.error()
                if err.code() != KafkaError._PARTITION_EOF:
                    event(_LOG, "consume error", logging.WARNING, queue=self.queue, error=str(err))
                continue
            where = (msg.topic(), msg.partition())
            if where != last:
                last = where
                feed = feeds.get(where)
                if feed is not None and not feed.revoked:
                    offsets = touched.setdefault(feed, [])
                    append = feed.backlog.append
                else:
                    feed = None
            if feed is None or append is None:
                continue  # no longer ours: the next owner reads it
            offset = msg.offset()
            offsets.append(offset)
            append(Delivery(feed, msg, offset))
        for feed, seen in touched.items():
            feed.tracker.extend(seen)
        for feed in touched:
            if feed.state is FeedState.ASSIGNED:
                # First records since assignment: the group's offsets for this
                # partition are stable now; load the keys up to now before any
                # record of it runs.
                feed.committed = feed.backlog[0].offset if feed.backlog else None
                feed.advance(FeedState.LOADING)
                self._loop.create_task(self._load_keys(feed))
            elif feed.loaded and not feed.held:
                self._make_ready(feed)
            self._sync_pause(feed)
        self._pump()

    async def _keys_caught_up(self, feed: PartitionFeed) -> bool:
        """Wait until the key store holds the partition's idempotency records;
        False when cancelled or when reading them failed (the runtime restarts)."""
        try:
            await self._tail.caught_up(feed.partition)
        except asyncio.CancelledError:
            return False
        except KafkaException as exc:
            if self._begin_restart():
                await self._restart(f"key store load failed: {exc}")
            return False
        return True

    async def _load_keys(self, feed: PartitionFeed) -> None:
        if not await self._keys_caught_up(feed):
            return
        if feed.gone:
            return
        if feed.state is FeedState.LOADING:  # revoked meanwhile: stays revoked
            feed.advance(FeedState.LOADED)
        self._make_ready(feed)
        self._pump()

    def _recheck(self, feed: PartitionFeed) -> None:
        feed.checking = True
        self._sync_pause(feed)
        self._loop.create_task(self._recheck_keys(feed))

    async def _recheck_keys(self, feed: PartitionFeed) -> None:
        if not await self._keys_caught_up(feed):
            return
        feed.checking = False
        if feed.gone:
            return
        self._sync_pause(feed)
        self._make_ready(feed)
        self._pump()

    def _make_ready(self, feed: PartitionFeed) -> None:
        if not feed.in_ready and feed.backlog and feed.loaded:
            feed.in_ready = True
            self._ready.append(feed)

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    # ================================================================== dispatch

    def _stalled(self) -> bool:
        return (
            self._life is not RuntimeState.RUNNING
            or self._queue_held
            or self._operator_paused
            or self._in_doubt
        )

    # ================================================================== membership

    def _doubt_membership(self, why: str) -> None:
        """This member may have lost its partitions without having been told yet.

        A member learns that the group expelled it (its session ran out while
        the coordinator was unreachable, or while this process was stopped or
        starved) only from its next heartbeat; until then it would go on
        starting jobs from the records it holds, while the partitions' new owner
        runs them too. So after a broker connection failure, or when this loop
        finds it did not run for a heartbeat interval, it starts nothing until
        a commit of offsets with its current group metadata was accepted (the
        coordinator validates the member and its epoch), or a rebalance told it
        what it owns.
        """
        self._doubts += 1
        if self._in_doubt or self._life.closing:
            return
        self._in_doubt = True
        event(
            _LOG, "membership in doubt: starting nothing until confirmed", queue=self.queue, why=why
        )
        self._commit_soon.set()

    def _membership_confirmed(self) -> None:
        if not self._in_doubt:
            return
        self._in_doubt = False
        event(_LOG, "membership confirmed", queue=self.queue)
        for feed in self._feeds.values():
            if not feed.held:
                self._make_ready(feed)
        self._schedule_pump()

    def _alive(self) -> None:
        """Every 100 ms on the loop; a longer gap means this process did not run
        (stopped, starved) for long enough to have missed heartbeats."""
        now = time.monotonic()
        gap = now - self._alive_at
        self._alive_at = now
        if gap > self._stall_s:
            self._doubt_membership(f"this process did not run for {gap:.1f} s")
        if self._ticker is not None:
            self._ticker.cancel()
        if not self._life.closed:
            self._ticker = self._loop.call_later(_ALIVE_EVERY_S, self._alive)

    def _on_client_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (on the consumer's thread)."""
        if err.code() in _CONNECTION_LOST:
            self._loop.call_soon_threadsafe(self._doubt_membership, f"consumer: {err.str()}")

    def _pump(self) -> None:
        """Start jobs from the ready partitions, round robin, while slots are free."""
        self._pump_scheduled = False
        if time.monotonic() - self._alive_at > self._stall_s:
            self._alive()  # the process was stopped or starved: first, doubt
        if self._stalled():
            return
        ready = self._ready
        slots = self._slots
        while ready:
            if slots.free <= 0:
                slots.wait(self._pump)
                return
            feed = ready[0]
            finished = self._dispatch(feed)
            if self._stalled():
                return
            if finished:
                if ready and ready[0] is feed:
                    ready.popleft()
                feed.in_ready = False
            else:
                ready.rotate(-1)

    def _dispatch(self, feed: PartitionFeed) -> bool:
        """Start what can start from ``feed``; True when it has nothing startable now.

        What each head record gets is :func:`~dueflow.consumers.decision.decide`'s
        verdict; this carries it out.
        """
        backlog = feed.backlog
        slots = self._slots
        pending_final = self._batch.pending_final
        running = self._running
        store = feed.keys
        overlap = self._overlap
        registry = self._registry
        limited = self._rates.limited
        now_ms = self._due_now()
        budget = 256  # then let other partitions have a turn
        while backlog:
            if slots.free <= 0 or budget <= 0 or feed.gone:
                self._sync_pause(feed)
                return feed.gone
            d = backlog[0]
            if d.fields is None and d.bad is None:
                prepare(d, registry)
            verdict = decide(
                d,
                store=store,
                pending=pending_final,
                running=running,
                occurrences=overlap,
                now_ms=now_ms,
            )
            kind = verdict.kind
            if kind is Kind.HOLD:
                now_ms = self._due_now()  # read at the start of the turn: maybe due by now
                verdict = decide(
                    d,
                    store=store,
                    pending=pending_final,
                    running=running,
                    occurrences=overlap,
                    now_ms=now_ms,
                )
                kind = verdict.kind
                if kind is Kind.HOLD:
                    self._hold(feed, verdict.until_ms, now_ms)
                    return True
            if kind is Kind.RUN:
                if limited and not self._take_token(feed, d):
                    return True
                backlog.popleft()
                budget -= 1
                self._start(d)
                continue
            if kind is Kind.RECHECK:
                d.rechecked = True
                self._recheck(feed)
                return True
            backlog.popleft()
            if kind is Kind.WAIT:
                self._held.setdefault(d.key, []).append(d)
                continue
            if kind is Kind.BUFFER_OCCURRENCE:  # waits for the running one
                overlap.buffer(d)
                continue
            if kind is Kind.DUPLICATE or kind is Kind.CANCELLED:
                assert verdict.state is not None
                self._batch.skipped(d, verdict.state, now_ms)
            elif kind is Kind.RESCHEDULED:
                self._batch.superseded(d, now_ms)
            elif kind is Kind.EXPIRED:
                self._batch.expired(d, now_ms)
            elif kind is Kind.DEAD_LETTER:
                assert verdict.failure is not None
                self._batch.dead(d, verdict.reason, verdict.failure, now_ms, started=False)
            elif kind is Kind.SKIP_OCCURRENCE:
                self._batch.skipped_occurrence(d, now_ms)
            else:  # pragma: no cover - every kind is handled above
                raise AssertionError(f"unhandled verdict {verdict}")
            feed.tracker.finish(d.offset)
        self._sync_pause(feed)
        return True

    def _take_token(self, feed: PartitionFeed, d: Delivery) -> bool:
        """Rate limits: False (and the partitions pause) when no token is available now."""
        now = time.monotonic()
        task_bucket = self._rates.task(d.task.spec.name) if d.task is not None else None
        if task_bucket is not None:
            wait = task_bucket.try_take(now)
            if wait > 0:
                self._metrics.rate_limited.labels(self.queue).inc()
                feed.rate_held = True
                self._sync_pause(feed)
                feed.timer = self._loop.call_later(wait, self._release, feed)
                return False
        if self._rates.queue is not None:
            wait = self._rates.queue.try_take(now)
            if wait > 0:
                if task_bucket is not None:
                    task_bucket.refund()
                self._metrics.rate_limited.labels(self.queue).inc()
                self._queue_held = True
                for f in self._feeds.values():
                    self._sync_pause(f)
                self._loop.call_later(wait, self._queue_release)
                return False
        return True

    def _hold(self, feed: PartitionFeed, until_ms: int, now_ms: int) -> None:
        """The head record is not due: the partition waits (paused) until it is."""
        feed.held_until = until_ms
        self._sync_pause(feed)
        if feed.timer is not None:
            feed.timer.cancel()
        feed.timer = self._loop.call_later((until_ms - now_ms) / 1000, self._release, feed)

    def _release(self, feed: PartitionFeed) -> None:
        feed.timer = None
        feed.held_until = 0
        feed.rate_held = False
        if feed.gone:
            return
        self._sync_pause(feed)
        self._make_ready(feed)
        self._pump()

    def _queue_release(self) -> None:
        self._queue_held = False
        for feed in self._feeds.values():
            self._sync_pause(feed)
        self._pump()

    def _sync_pause(self, feed: PartitionFeed) -> None:
        """Pause fetching while a partition is held or its backlog is full; resume after.

        Pausing is back pressure, not correctness: records fetched before the
        pause takes effect simply join the backlog.
        """
        poller = self._poller
        if feed.gone or poller is None:
            return
        size = len(feed.backlog)
        held = feed.held or self._queue_held or self._life.closing or self._operator_paused
        want = held or (size > self._low if feed.paused else size >= self._high)
        if want == feed.paused:
            return
        feed.paused = want
        tp = feed.tp
        if want:
            poller.post(lambda c: c.pause([tp]))
        else:
            poller.post(lambda c: c.resume([tp]))

    # ================================================================== running

    def _start(self, d: Delivery) -> None:
        feed = d.feed
        task = d.task
        fields = d.fields
        assert task is not None
        assert fields is not None
        self._slots.free -= 1
        feed.inflight += 1
        self._running[d.key] = d
        if hdr.OVERLAP in d.hmap:
            self._overlap.started(d)
        d.max_attempts, timeout_s = attempt_limits(task, fields, self._ws)
        otel = None
        if self._tracing:
            d.span, otel = start_attempt(
                self._tracer,
                headers=d.msg.headers(),
                attempt=d.attempt,
                job_id=fields[F_JOB_ID],
                queue=self._queue.name,
                task=fields[F_TASK],
            )
        if self._log_starts and _LOG.isEnabledFor(logging.INFO):
            job_event(
                _LOG,
                JOB_STARTED,
                job_id=fields[F_JOB_ID],
                queue=self._queue.name,
                task=fields[F_TASK],
                attempt=d.attempt,
                trace_id=trace_id(d),
                max_attempts=d.max_attempts,
            )
        source = (feed.topic, feed.partition, d.offset)
        ctx = TaskContext(fields, d.attempt, d.max_attempts, d.hmap, source, otel, d)
        self._executor.run(d, task, d.payload, ctx, timeout_s, self._finished)

    def _finished(self, d: Delivery, failure: Failure | None, seconds: float) -> None:
        """An attempt ended (maybe synchronously inside ``_start``)."""
        self._slots.release()
        feed = d.feed
        feed.inflight -= 1
        key = d.key
        if self._running.get(key) is d:
            del self._running[key]
        if hdr.OVERLAP in d.hmap:
            waited = self._overlap.finished(d)
            if waited is not None:  # buffer_one: the occurrence that waited for this one
                self._requeue([waited])
        held = self._held.pop(key, None)
        if held:
            # Records of the same key waiting for this attempt: maybe read again
            # from a later assignment of the same partition (this attempt's feed
            # is gone then): decide them now, whatever became of this one.
            self._requeue(held)
        if feed.gone:
            # Abandoned (revoked after the grace period, lost, restarting):
            # nothing is written; the record is read again from the committed
            # offset by whoever owns the partition now.
            self._batch.drop_follow_ups(d)
            return
        now_ms = self._stamp_now()  # a retry's "not before" counts from here
        if failure is None:
            self._batch.succeeded(d, seconds, now_ms)
        else:
            self._batch.failed(d, failure, seconds, now_ms)
            if self._hooks is not None:
                self._hooks.attempt_failed(d, failure)
        if d.span is not None:
            end_attempt(d.span, failure)
        feed.tracker.finish(d.offset)
        if feed.revoked:
            self._inflight_changed.set()
        if len(self._batch) >= 2 * self._ws.commit_max_jobs:
            self._commit_soon.set()

    def _requeue(self, held: list[Delivery]) -> None:
        """Replays of a key that just finished: decide again, first in their partitions."""
        for d in reversed(held):
            if not d.feed.gone and not d.feed.revoked:
                d.feed.backlog.appendleft(d)
                self._make_ready(d.feed)
        self._schedule_pump()

    # ================================================================== rates

    def _recompute_rates(self) -> None:
        owned = sum(1 for f in self._feeds.values() if f.tier_ms is None)
        self._rates.set_owned(owned, now=time.monotonic())

    # ================================================================== commits

    async def _commit_loop(self) -> None:
        interval = self._ws.commit_interval_ms / 1000
        next_expiry = self._loop.time() + _EXPIRE_EVERY_S
        next_gauges = self._loop.time()
        next_depth = self._loop.time() + 1.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_soon.wait(), interval)
            self._commit_soon.clear()
            if self._life.closed:
                return
            if not self._life.restarting:
                await self.commit_now(validate=self._in_doubt)
            now = self._loop.time()
            if now >= next_gauges:
                next_gauges = now + _GAUGES_EVERY_S
                self._update_gauges()
            if now >= next_expiry:
                next_expiry = now + _EXPIRE_EVERY_S
                self._tail.expire(int(time.time() * 1000))
            if now >= next_depth:
                next_depth = now + _DLQ_DEPTH_EVERY_S
                self._report_dlq_depth()

    async def commit_now(self, *, validate: bool = False) -> bool:
        """Commit what finished so far in one transaction; False when it failed.

        ``validate``: also when nothing finished, send every partition's committed
        offset again: an accepted commit proves this member still owns them. A
        commit counts as proof only when it was cut after the last doubt arose.
        """
        async with self._commit_lock:
            feeds = list(self._feeds.values())
            doubts = self._doubts
            cut = self._batch.cut(feeds, resend=validate)
            if cut is None:
                self._batch.flush_metrics()
                return True
            batch, finals, marks = cut
            batch.commit_by = time.monotonic() + self._commit_window_s
            proof_only = not batch.records and not marks  # nothing of it is work
            assert self._committer is not None
            began_ms = _wall_ms()
            try:
                await self._in_txn_thread(
                    self._committer.commit, batch, wedged=self._committer.wedged
                )
            except ClientWedged as exc:
                self._metrics.worker_transactions.labels(self.queue, "failed").inc()
                self._abandon_producer()
                # What this commit held was in doubt from its start: another member
                # may have taken the partitions and run it again meanwhile.
                self._restart_soon(f"transactional producer wedged: {exc}", since_ms=began_ms)
                return False
            except CommitFailed as exc:
                self._metrics.worker_transactions.labels(self.queue, "failed").inc()
                if proof_only and not exc.fatal:
                    # Nothing to drop: stay in doubt and ask again. An expelled
                    # member hears of it from the group (partitions lost) anyway.
                    event(
                        _LOG,
                        "membership not confirmed",
                        logging.WARNING,
                        queue=self.queue,
                        error=str(exc),
                    )
                    return False
                self._restart_soon(str(exc))
                return False
            self._metrics.worker_transactions.labels(self.queue, "committed").inc()
            if batch.offsets and doubts == self._doubts:
                self._membership_confirmed()
            self._batch.committed(finals, marks)
            self._batch.flush_metrics()
            return True

    async def _in_txn_thread(
        self, fn: Any, *args: Any, wedged: Callable[[], bool] | None = None
    ) -> Any:
        """``fn(*args)`` on the transaction thread; :class:`ClientWedged` after the
        commit deadline, or as soon as ``wedged()`` says a call of it is stuck
        (asked every ``_WEDGE_CHECK_S``)."""
        future = self._loop.run_in_executor(self._txn_thread, fn, *args)
        name = getattr(fn, "__name__", repr(fn))
        deadline = self._loop.time() + self._commit_deadline_s
        while True:
            left = deadline - self._loop.time()
            if left <= 0:
                future.cancel()
                raise ClientWedged(f"{name} did not return within {self._commit_deadline_s:.0f} s")
            step = left if wedged is None else min(left, _WEDGE_CHECK_S)
            try:
                # shielded: a step that times out leaves the call running
                return await asyncio.wait_for(asyncio.shield(future), step)
            except TimeoutError:
                if wedged is not None and wedged():
                    future.cancel()
                    raise ClientWedged(
                        f"{name}: send_offsets_to_transaction ran past its timeout"
                        f" + {WEDGE_GRACE_S:.0f} s"
                    ) from None

    def _abandon_producer(self) -> None:
        """Leave the wedged producer and its thread alone for good; use new ones.

        Its open transaction is aborted by the broker after the transaction
        timeout. Given up sooner than that (a wedged send_offsets_to_transaction),
        it could still commit if the call came back: only with offsets the
        group coordinator had accepted, and a pending offset commit makes every
        new owner of those partitions, this queue's next consumer included,
        wait for it (KIP-447) and then see its records. Offsets not yet sent go
        out with the old member's metadata, which the group refuses once that
        consumer has left, so the transaction aborts.
        """
        event(
            _LOG,
            "transactional producer wedged: abandoned",
            logging.ERROR,
            queue=self.queue,
            deadline_s=self._commit_deadline_s,
        )
        abandon(self._committer)  # destroying it would block as well
        self._committer = None
        # The abandoned producer may still finish what it was doing (registering
        # its id): under the same id it would fence the next one mid-batch.
        self._txn_id = self._new_txn_id()
        self._txn_thread.shutdown(wait=False)
        self._txn_thread = DaemonThreadExecutor(f"dueflow-txn-{self.queue}")

    def _new_txn_id(self) -> str:
        return f"{self._group}.{self._worker_id}.{uuid.uuid4().hex[:8]}"

    def _update_gauges(self) -> None:
        m = self._metrics
        m.in_flight.labels(self.queue).set(self.in_flight)
        poller = self._poller
        feeds = {
            f.tp: (f.committed, f.tracker.unfinished)
            for f in self._feeds.values()
            if f.committed is not None
        }
        if poller is None or not feeds:
            return
        lag = m.consumer_lag
        group = self._group

        def report(consumer: Consumer) -> None:
            # On the consumer's thread; cached watermarks: no network round trip.
            # Lag = records not read yet (high watermark - position) + records read
            # and not finished. Not "high - committed": the commit marker after the
            # last committed record takes an offset, so a group that finished
            # everything would show a lag of 1 per partition.
            try:
                positions = {
                    (tp.topic, tp.partition): tp.offset for tp in consumer.position(list(feeds))
                }
            except KafkaException:
                positions = {}
            for tp, (committed, unfinished) in feeds.items():
                try:
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                except KafkaException:
                    continue
                if high < 0:
                    continue
                read_to = positions.get((tp.topic, tp.partition), -1)
                if read_to >= committed:
                    behind = max(0, high - read_to) + unfinished
                else:  # nothing read since the assignment
                    behind = max(0, high - committed)
                lag.labels(group, tp.topic, str(tp.partition)).set(behind)

        poller.post(report)

    def _report_dlq_depth(self) -> None:
        """Records in the queue's whole DLQ topic (every reporter reports the same total;
        dashboards take the max per queue)."""
        poller = self._poller
        owned = range(self._queue.partitions)
        if poller is None or not self._feeds:
            return
        topic = names(self._settings).dlq(self.queue)
        gauge = self._metrics.dlq_depth.labels(self.queue)

        def report(consumer: Consumer) -> None:
            depth = 0
            for partition in owned:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=2, cached=False
                    )
                except KafkaException:
                    return
                depth += max(0, high - low)
            gauge.set(depth)

        poller.post(report)

    def stats(self) -> dict[str, Any]:
        """A snapshot for tests and the CLI."""
        return {
            "queue": self.queue,
            "assigned": self.assigned,
            "in_flight": self.in_flight,
            "backlog": sum(len(f.backlog) for f in self._feeds.values()),
            "keys": self._tail.keys,
            "pending_records": len(self._batch),
        }
