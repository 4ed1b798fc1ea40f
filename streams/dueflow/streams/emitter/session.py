"""One period as the active emitter of a shard: read in, drain, commit.

:meth:`ActiveSession.start` reads the committed timer offsets and checkpoints
and the cron state, and assigns every timer partition of the shard;
:meth:`ActiveSession.step` is one turn of the loop: read, fire what is due,
move the drain clock, commit when due. How fires are written and the offsets
committed is a subclass's: :class:`~dueflow.streams.emitter.acked_session.AckedSession`
(an idempotent producer; offsets committed through the lease group once
acknowledged) or :class:`~dueflow.streams.emitter.txn_session.TransactionalSession`
(fires and offsets in Kafka transactions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import Message

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.cron_occurrence import CronState
from dueflow.rules.drain import Checkpoint
from dueflow.streams.emitter.cron_keeper import CronKeeper
from dueflow.streams.emitter.drainer import WheelDrainer
from dueflow.streams.emitter.end_watch import EndWatch
from dueflow.streams.emitter.housekeeping import Housekeeping, PendingTotals
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.schedule_table import ScheduleTable, read_cron_state
from dueflow.streams.emitter.target_queues import EmitterQueues, RegistryQuarantine
from dueflow.streams.emitter.wheel_source import WheelSource
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.emitter")


class SessionOutbox(Protocol):
    """What every active period writes through."""

    def start(self, timeout_s: float = 60.0) -> None: ...

    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None: ...


OutboxT = TypeVar("OutboxT", bound=SessionOutbox)


class ActiveSession(Generic[OutboxT]):
    """The active emitter's clients and drainer, for as long as it holds the lease."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        schedules: ScheduleTable,
        source: WheelSource,
        clock_ms: Callable[[], int] = wall_ms,
        tracer: JobTracer | None = None,
        outbox: OutboxT,
        queues: EmitterQueues | None = None,
        pending: PendingTotals | None = None,
        limits: EmitterLimits | None = None,
        ahead_ms: int = 0,
    ) -> None:
        # settings.wheel is the session's shard (WheelGeometry.of_shard).
        self.shard = settings.wheel.shard
        self.partitions = settings.wheel.partitions
        # Shard 0's emitter quarantines the bad queue registry and schedule records.
        self._singletons = self.shard == 0
        self._settings = settings
        self._queues = queues
        self._metrics = metrics
        self._clock = clock_ms
        # clock_ms runs this far ahead of the wall clock (emitter.fire_ahead_ms).
        self._ahead = ahead_ms
        self._schedules = schedules
        self._tracer = tracer
        self.limits = limits if limits is not None else EmitterLimits(settings)
        self.outbox = outbox  # prepared ahead (a hot standby)
        self.cron = CronKeeper(
            settings,
            metrics,
            schedules,
            self.outbox,
            partitions=queues.exec_partitions if queues is not None else None,
            limits=self.limits,
        )
        self.registry_quarantine = RegistryQuarantine(
            topic=names(settings).queues,
            quarantine_topic=names(settings).quarantine,
            send=self.outbox.send,
            metrics=metrics,
            limit=lambda: self.limits.quarantine,
        )
        self.source = source  # started by the process: warm before the takeover
        self.housekeeping = Housekeeping(
            settings, metrics, report=pending.report if pending is not None else None
        )
        self.end_watch = EndWatch(source.topic)
        self._drainer: WheelDrainer | None = None
        self._started = 0.0
        self._first_commit: float | None = None
        self._read_in: float | None = None
        em = settings.emitter
        self._batch_records = em.batch_max_records
        self._batch_ms = em.batch_max_ms
        # Small reads, so a slot read in one go does not hold up timers due meanwhile.
        self._consume_max = max(1, min(em.batch_max_records, 1_000))
        self._group_metadata: Any = None
        # What prepare_start read, for finish_start.
        self._took: dict[str, int] = {}
        self._committed: dict[int, tuple[int, Checkpoint | None]] = {}
        self._quarantined_to: dict[int, int] = {}
        self._registry_quarantined_to: dict[int, int] = {}
        self._cron_state: dict[str, CronState] = {}

    @property
    def drainer(self) -> WheelDrainer:
        assert self._drainer is not None, "start() first"
        return self._drainer

    def start(self, timeout_s: float = 60.0) -> None:
        """Take over (fence the older emitters that fire in transactions) and start
        reading from the committed offsets."""
        self.prepare_start(timeout_s)
        self.finish_start()

    def prepare_start(self, timeout_s: float = 60.0, *, apart: bool = False) -> None:
        """The waiting part of :meth:`start`: fence the transactional ids, read the
        committed offsets and the cron state. ``apart``: on a thread of its own
        while the process's loop drives other shards (it then touches only this
        session's clients, the shared timer consumer's thread-safe
        ``committed``, and reads the cron state with a consumer of its own)."""
        took = self._took = {}
        t = self._started = time.monotonic()

        def lap(name: str) -> None:
            nonlocal t
            now = time.monotonic()
            took[name] = round((now - t) * 1000)
            t = now

        self.outbox.start()
        lap("fence_ms")
        self._committed = self.source.committed(self.partitions)
        if self._singletons:
            self._quarantined_to = self.source.committed_elsewhere(
                self._schedules.topic, self._settings.schedules_partitions
            )
            self._registry_quarantined_to = self.source.committed_elsewhere(
                names(self._settings).queues, 1
            )
        lap("offsets_ms")
        if apart:
            self._cron_state = read_cron_state(self._settings, timeout_s)
        else:
            # Cron: every schedule known (a missing one would read as deleted), the
            # state of the wheel, and the bad schedule records quarantined so far.
            deadline = time.monotonic() + timeout_s
            while not self._schedules.caught_up:
                if time.monotonic() > deadline:
                    raise KafkaOperationError("the schedules topic could not be read to its end")
                self._schedules.poll(0.1)
            self._cron_state = self._schedules.sync_cron_state(timeout_s)
        lap("cron_ms")

    @property
    def ready_to_finish(self) -> bool:
        """Every schedule is known (the process's table has read its topic to the end)."""
        return self._schedules.caught_up

    def finish_start(self) -> None:
        """The rest of :meth:`start`, on the loop's thread: the drainer, cron keeper
        and quarantines, and the timer partitions assigned."""
        took, t = self._took, time.monotonic()
        committed = self._committed
        now = self._clock()
        self._drainer = WheelDrainer(
            settings=self._settings,
            source=self.source,
            sender=self.outbox,
            metrics=self._metrics,
            committed=committed,
            now_ms=now,
            cron=self.cron,
            tracer=self._tracer,
            queues=self._queues,
            limits=self.limits,
            ahead_ms=self._ahead,
        )
        self.cron.start(state=self._cron_state, quarantined_to=self._quarantined_to, now_ms=now)
        if self._singletons:
            self.registry_quarantine.start(self._registry_quarantined_to.get(0, 0))
            self.quarantine_queue_records()
        self.source.assign({p: off for p, (off, _) in committed.items()})
        self._group_metadata = self.source.group_metadata()
        self.housekeeping.start()
        self.end_watch.start(self.housekeeping.admin)
        took["start_ms"] = round((time.monotonic() - t) * 1000)
        event(
            log,
            "emitter active",
            shard=self.shard,
            replaying=len([1 for _, ck in committed.values() if ck is not None]),
            last_fired=self._drainer.fired,
            **took,
        )

    def step(self) -> None:
        """One turn: read, fire, advance, commit when the batch is due."""
        wake, now = self.before_read()
        messages = self.source.consume(self._consume_max, max(0, wake - now) / 1000.0)
        self.after_read(messages, self._clock())

    def before_read(self, may_wait: bool = True) -> tuple[int, int]:
        """The first half of :meth:`step`: return ``(wake, now)``: until when the
        read may wait for records. ``may_wait`` False (other shards share the
        loop): never wait here."""
        raise NotImplementedError

    def consume_max(self) -> int:
        return self._consume_max

    def after_read(self, messages: list[Message], now: int) -> None:
        """The second half of :meth:`step`: this shard's records read meanwhile."""
        drainer = self.drainer
        if messages:
            drainer.on_messages(messages, now)
        drainer.advance(now)
        drainer.fire_due(now)
        if self._read_in is None and not drainer.starting:
            self._read_in = time.monotonic()
            event(
                log,
                "emitter reading",
                after_start_ms=round((self._read_in - self._started) * 1000),
                unheard=0,
            )
        self._after_fire(now)
        self.housekeeping.tick(now, drainer.committed_offsets)
        self.end_watch.tick(now, drainer)

    def _first_committed(self) -> None:
        if self._first_commit is None:
            self._first_commit = time.monotonic()
            event(
                log,
                "emitter first commit",
                after_start_ms=round((self._first_commit - self._started) * 1000),
            )

    def _after_fire(self, now: int) -> None:
        """After the turn fired: what the way of writing needs (commit when due)."""
        raise NotImplementedError

    def on_schedules(self, changed: set[str]) -> None:
        """Schedules changed (or bad records arrived): bring the wheel in line."""
        now = self._clock()
        self.cron.quarantine_bad(now)
        for schedule_id in sorted(changed):
            self.cron.reconcile(schedule_id, now)

    def quarantine_queue_records(self) -> None:
        """Quarantine the bad queue registry records read since the last call
        (shard 0's emitter does)."""
        if self._queues is not None and self._singletons:
            self.registry_quarantine.put(self._queues.take_bad(), self._clock())

    def close(self, *, commit: bool) -> None:
        """Commit what is fired (a clean handover) or not (lease lost, fenced), and
        close the clients."""
        raise NotImplementedError

    def _close_clients(self) -> None:
        self.source.unassign(self.partitions)
        self.end_watch.close()
        self.housekeeping.close()
