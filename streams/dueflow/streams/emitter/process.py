"""An emitter process: active for the shards whose lease it holds, a hot standby
for the others.

The loop polls the lease every turn. On acquiring a shard the process starts an
:class:`~dueflow.streams.emitter.session.ActiveSession` for it: an
:class:`~dueflow.streams.emitter.acked_session.AckedSession` (fires without
transactions, offsets committed through the lease group) or, with
``emitter.transactional``, a
:class:`~dueflow.streams.emitter.txn_session.TransactionalSession`; either
first fences the shard's transactional ids, so an older emitter of that shard
that fires in transactions commits nothing more. On losing a shard, or on being
fenced, it stops emitting that shard at once (inside the lease callback, before
librdkafka rejoins) and commits nothing more; a shard revoked by a rebalance
is committed and handed over. A failed transaction or delivery, or a loop that
did not run for longer than the lease may last, starts the shard's session
again from the committed offsets. A stop request commits every shard and
leaves the group, so the others take over at once.

The shards a process drives share its loop and its timer consumer: one read
per turn, its records handed to each shard's drainer by partition; each shard
has its own transactional producers, drainer, cron keeper and housekeeping.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from confluent_kafka import Message

from dueflow.config import Settings
from dueflow.errors import ConfigError, FencedError, KafkaOperationError
from dueflow.kafka.clock_probe import ClockProbe
from dueflow.kafka.topic_limits import is_too_large
from dueflow.observability.health import Health
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.streams.emitter.acked_outbox import AckedOutbox
from dueflow.streams.emitter.acked_session import AckedSession, EmitterStalled
from dueflow.streams.emitter.housekeeping import PendingTotals
from dueflow.streams.emitter.lease import Lease
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.outbox import Outbox, TransactionAborted
from dueflow.streams.emitter.schedule_table import ScheduleTable
from dueflow.streams.emitter.session import ActiveSession
from dueflow.streams.emitter.shape import check_topic_shape
from dueflow.streams.emitter.target_queues import EmitterQueues
from dueflow.streams.emitter.txn_session import TransactionalSession
from dueflow.streams.emitter.wheel_source import WheelSource

log = logging.getLogger("dueflow.emitter")
# Why an active shard starts over from its committed offsets (not a hand-over).
_RESTARTS = frozenset({"fenced", "stalled", "transaction aborted", "error"})
_SCHEDULES_EVERY_S = 0.01
_QUEUES_EVERY_S = 0.1


class EmitterProcess:
    """Runs until ``stop`` is set: lease, active sessions (one per shard held), standby."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        clock_ms: Callable[[], int] | None = None,
        tracer: JobTracer | None = None,
        health: Health | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        # /livez: the loop beats every turn; /readyz: a member of the emitter group.
        self.health = (
            health
            if health is not None
            else Health(liveness_timeout_s=settings.observability.liveness_timeout_s)
        )
        self._published_at = 0.0
        # Timers are due on the broker's clock: unless a clock is given, the
        # emitter reads "now" as the earliest the broker's clock can read.
        self._probe = None if clock_ms is not None else ClockProbe(settings, component="emitter")
        read = clock_ms if clock_ms is not None else self._probe_now
        # The emitter's clock runs emitter.fire_ahead_ms ahead: timers fire (and
        # everything the emitter stamps or measures happens) that much before they
        # are due; the df-fired stamp alone is the time of the write.
        ahead = settings.emitter.fire_ahead_ms
        self._clock = read if not ahead else (lambda: read() + ahead)
        self._tracer = tracer
        geo = settings.wheel
        self._stride = geo.shard_partitions
        # Each shard's session sees its own geometry (settings.wheel.shard = s).
        self._shard_settings = [
            replace(settings, wheel=geo.of_shard(shard)) for shard in range(geo.shards)
        ]
        self.lease = Lease(settings, on_release=self._on_release)
        # Static and registered queues; read before the schedules that name them.
        self.queues = EmitterQueues(settings, clock_ms=self._clock)
        self.schedules = ScheduleTable(settings, known_queue=self.queues.knows)
        self.source = WheelSource(settings)  # shared by every shard driven here
        # Record size limits of the topics written to (read on first use, shared).
        self.limits = EmitterLimits(settings)
        self.sessions: dict[int, ActiveSession[Any]] = {}
        # Shards being taken over off the loop: session, its start, when asked.
        self._starting: dict[
            int, tuple[ActiveSession[Any], concurrent.futures.Future[None], float]
        ] = {}
        self._transactional = settings.emitter.transactional
        self._pending = PendingTotals(metrics)
        self._cooldown_until: dict[int, float] = {}
        self._schedules_at = 0.0  # monotonic time of the next schedules poll
        self._queues_at = 0.0  # ... and of the next queue registry poll
        # Each shard's next active period's producers, prepared (hot standby).
        self._outboxes: dict[int, Outbox | AckedOutbox] = {}
        metrics.emitter_leader.set(0)
        for queue in settings.queue_names:  # series at 0 from the start, not from the first fire
            metrics.fires.labels(queue)
            metrics.fire_lateness.labels(queue)

    @property
    def session(self) -> ActiveSession[Any] | None:
        """The session of the lowest shard this process drives (None: a standby)."""
        return self.sessions[min(self.sessions)] if self.sessions else None

    def _probe_now(self) -> int:
        assert self._probe is not None
        return self._probe.due_now_ms()

    def run(self, stop: threading.Event) -> None:
        check_topic_shape(self._settings)
        if self._probe is not None:
            self._probe.report_to(self._metrics.clock_offset)
            self._probe.start()
            self._probe.wait_first()
        self.queues.start()
        self.schedules.start()
        self.source.start()
        for shard in range(min(self._settings.wheel.shards, _PREPARED_MAX)):
            self._prepare_outbox(shard)
        self.lease.start()
        self.health.add_check("emitter group", self.lease.readiness)
        event(log, "emitter started", role="standby", shards=self._settings.wheel.shards)
        try:
            while not stop.is_set():
                self._beat()
                self._turn()
        finally:
            self.health.stopping()
            for shard in sorted(self.sessions):
                self._deactivate(shard, "shutdown", commit=True, prepare=False)
            for session, done, _ in self._starting.values():
                with contextlib.suppress(Exception):
                    done.result(timeout=self._settings.emitter.session_timeout_ms / 1000.0)
                with contextlib.suppress(Exception):
                    session.close(commit=False)
            self._starting.clear()
            for outbox in self._outboxes.values():
                _close_prepared(outbox)
            self._outboxes.clear()
            self.lease.close()
            self.queues.close()
            self.schedules.close()
            self.source.close()
            if self._probe is not None:
                self._probe.close()
            event(log, "emitter stopped")

    def _beat(self) -> None:
        """The loop turned (/livez); once a second, the health gauges too."""
        self.health.beat()
        now = time.monotonic()
        if now - self._published_at >= 1.0:
            self._published_at = now
            self.health.publish(self._metrics.ready, self._metrics.loop_heartbeat)

    def _turn(self) -> None:
        held = self.lease.poll(0.0 if self.sessions else 0.05)
        if self.lease.misfit is not None:
            raise ConfigError(
                "wheel.shards",
                self._settings.wheel.shards,
                f"at least {self.lease.misfit + 1}: this emitter was given lease partition "
                f"{self.lease.misfit}; every emitter of a deployment needs the same "
                "wheel.shards (and `dueflow topics ensure` run with it)",
            )
        # Standbys keep the table warm too. An active emitter's loop turns often
        # while a backlog drains: the schedules are read every few milliseconds,
        # not every turn (an empty poll costs as much as a small batch of fires).
        changed: set[str] = set()
        now = time.monotonic()
        if now >= self._queues_at:
            self._queues_at = now + _QUEUES_EVERY_S
            self.queues.poll()
        if now >= self._schedules_at:
            self._schedules_at = now + _SCHEDULES_EVERY_S
            changed = self.schedules.poll()
        for shard in [s for s in self.sessions if s not in held]:
            self._deactivate(shard, "lease lost", commit=False)
        for shard in sorted(held - self.sessions.keys() - self._starting.keys()):
            if time.monotonic() >= self._cooldown_until.get(shard, 0.0):
                if self.sessions or self._starting:
                    self._begin(shard)  # the shards driven now go on meanwhile
                else:
                    self._activate(shard)
        if self._starting:
            self._finish_started(held)
        if not self.sessions:
            if self._starting:
                time.sleep(0.005)  # nothing to drive until a takeover is ready
            return
        for shard, session in list(self.sessions.items()):
            self._guarded(shard, self._shared_work, session, changed)
        if len(self.sessions) == 1:
            shard, session = next(iter(self.sessions.items()))
            self._guarded(shard, session.step)
        else:
            self._step_all()

    def _shared_work(self, session: ActiveSession[Any], changed: set[str]) -> None:
        if self.queues.reader.bad:
            session.quarantine_queue_records()
        if changed or self.schedules.bad:
            session.on_schedules(changed)

    def _step_all(self) -> None:
        """One turn of every shard driven here: one read of the shared timer
        consumer, its records handed to each shard by partition."""
        wake: int | None = None
        now = self._clock()
        for shard, session in list(self.sessions.items()):
            got = self._guarded(shard, session.before_read, False)
            if isinstance(got, tuple):
                wake = got[0] if wake is None else min(wake, got[0])
                now = max(now, got[1])
        if wake is None or not self.sessions:
            return
        messages = self.source.consume(_CONSUME_MAX, max(0, wake - now) / 1000.0)
        now = self._clock()
        by_shard: dict[int, list[Message]] = {}
        stride = self._stride
        first = min(self.sessions)
        for m in messages:
            p = m.partition()
            shard = p // stride if p is not None and p >= 0 else first
            by_shard.setdefault(shard, []).append(m)
        for shard, session in list(self.sessions.items()):
            batch = by_shard.get(shard, [])
            self._guarded(shard, session.after_read, batch, now)

    def _guarded(self, shard: int, work: Callable[..., object], *args: Any) -> object:
        """``work(*args)`` for one shard; a failure ends that shard's session only
        (then None)."""
        if shard not in self.sessions:
            return None
        try:
            return work(*args)
        except FencedError as exc:
            event(log, "emitter fenced", logging.WARNING, error=str(exc), shard=shard)
            self._deactivate(shard, "fenced", commit=False)
            self._cooldown_until[shard] = (
                time.monotonic() + self._settings.emitter.session_timeout_ms / 1e3
            )
        except EmitterStalled as exc:
            event(
                log, "emitter stalled; starting over", logging.WARNING, error=str(exc), shard=shard
            )
            self._deactivate(shard, "stalled", commit=False)
        except TransactionAborted as exc:
            self._metrics.emitter_transactions.labels("aborted").inc()
            self._refused_as_too_large(exc, shard)
            event(
                log,
                "transaction aborted; restarting from committed",
                logging.WARNING,
                error=str(exc),
                shard=shard,
            )
            self._deactivate(shard, "transaction aborted", commit=False)
        except KafkaOperationError as exc:
            event(
                log,
                "emitter error; restarting from committed",
                logging.ERROR,
                error=str(exc),
                shard=shard,
            )
            too_large = self._refused_as_too_large(exc, shard)
            self._deactivate(shard, "error", commit=False)
            if not too_large:
                self._cooldown_until[shard] = time.monotonic() + 1.0
        return None

    def _refused_as_too_large(self, exc: BaseException, shard: int) -> bool:
        """A write was refused as too large (the error says so, or the shard's failed
        deliveries do): the shard starts again from its committed offsets at once,
        with the limits read again and every record measured, so the record that was
        refused is quarantined this time (limits.py)."""
        session = self.sessions.get(shard)
        outbox = session.outbox if session is not None else None
        # (the outbox without transactions fails with the failed delivery's own error)
        refused = is_too_large(exc) or (
            isinstance(outbox, Outbox) and outbox.refused_too_large(wait_s=0.2)
        )
        if not refused:
            return False
        self.limits.refused(self._clock())
        event(
            log,
            "a record was refused as too large: limits read again, records measured",
            logging.WARNING,
            shard=shard,
        )
        return True

    def _on_release(self, shards: frozenset[int], lost: bool) -> None:
        """Lease callback (inside ``lease.poll``): a revoked shard commits and hands
        over before the rebalance completes; a lost one aborts."""
        for shard in sorted(shards):
            if shard in self.sessions:
                self._deactivate(shard, "lease lost" if lost else "lease released", commit=not lost)

    def _prepare_outbox(self, shard: int) -> None:
        """Make a shard's next active period's producers now (a hot standby), so
        that taking it over only fences."""
        if shard >= _PREPARED_MAX:
            return  # made at the takeover
        old = self._outboxes.pop(shard, None)
        if old is not None:
            _close_prepared(old)
        settings = self._shard_settings[shard]
        outbox: Outbox | AckedOutbox = (
            Outbox(settings, clock_ms=self._clock)
            if self._transactional
            else AckedOutbox(settings, clock_ms=self._clock)
        )
        try:
            outbox.prepare()
        except KafkaOperationError as exc:  # the takeover makes them then
            event(log, "could not prepare producers", logging.WARNING, error=str(exc))
        self._outboxes[shard] = outbox

    def _begin(self, shard: int) -> None:
        """Take a shard over on a thread of its own (fencing waits for the broker),
        while the loop drives the shards it has; :meth:`_finish_started` ends it."""
        session = self._new_session(shard)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def prepare() -> None:
            try:
                session.prepare_start(apart=True)
            except BaseException as exc:  # handed to the loop
                done.set_exception(exc)
            else:
                done.set_result(None)

        threading.Thread(target=prepare, name=f"dueflow-emitter-start-{shard}", daemon=True).start()
        self._starting[shard] = (session, done, time.monotonic())

    def _finish_started(self, held: frozenset[int]) -> None:
        for shard, (session, done, started) in list(self._starting.items()):
            if not done.done() or (shard in held and not session.ready_to_finish):
                continue
            del self._starting[shard]
            try:
                done.result()
                if shard not in held:
                    raise KafkaOperationError("the lease went while taking over")
                session.finish_start()
            except (FencedError, KafkaOperationError) as exc:
                self._failed_start(shard, session, exc)
                continue
            self._activated(shard, session, started)

    def _new_session(self, shard: int) -> ActiveSession[Any]:
        settings = self._shard_settings[shard]
        prepared = self._outboxes.pop(shard, None)
        common: dict[str, Any] = {
            "schedules": self.schedules,
            "source": self.source,
            "clock_ms": self._clock,
            "tracer": self._tracer,
            "queues": self.queues,
            "pending": self._pending,
            "limits": self.limits,
            "ahead_ms": settings.emitter.fire_ahead_ms,
        }
        if self._transactional:
            outbox = prepared if isinstance(prepared, Outbox) else None
            return TransactionalSession(
                settings,
                self._metrics,
                outbox=outbox or Outbox(settings, clock_ms=self._clock),
                **common,
            )
        acked = prepared if isinstance(prepared, AckedOutbox) else None
        return AckedSession(
            settings,
            self._metrics,
            outbox=acked or AckedOutbox(settings, clock_ms=self._clock),
            lease=self.lease,
            **common,
        )

    def _failed_start(self, shard: int, session: ActiveSession[Any], exc: Exception) -> None:
        event(log, "emitter could not start", logging.ERROR, error=str(exc), shard=shard)
        session.close(commit=False)
        self._cooldown_until[shard] = time.monotonic() + 1.0
        if not self.sessions and not self._starting:
            self.source.renew()  # the next try with fresh clients
        self._prepare_outbox(shard)

    def _activated(self, shard: int, session: ActiveSession[Any], started: float) -> None:
        self.sessions[shard] = session
        self._metrics.emitter_leader.set(len(self.sessions))
        self._metrics.emitter_failovers.inc()
        event(
            log,
            "emitter is active",
            role="active",
            shard=shard,
            start_ms=round((time.monotonic() - started) * 1000),
        )

    def _activate(self, shard: int) -> None:
        session = self._new_session(shard)
        started = time.monotonic()
        try:
            session.start()
        except (FencedError, KafkaOperationError) as exc:
            self._failed_start(shard, session, exc)
            return
        self._activated(shard, session, started)

    def _deactivate(self, shard: int, why: str, *, commit: bool, prepare: bool = True) -> None:
        session = self.sessions.pop(shard, None)
        if session is None:
            return
        self._metrics.emitter_leader.set(len(self.sessions))
        if why in _RESTARTS:
            self._metrics.emitter_restarts.labels(why).inc()
        # Only a shard's active emitter measures its pending timers: a standby's
        # old numbers would go stale (and dashboards take the least report per level).
        self._pending.forget(shard)
        try:
            session.close(commit=commit)
        except (FencedError, KafkaOperationError) as exc:
            event(log, "closing the active session failed", logging.WARNING, error=str(exc))
        if prepare:
            self._prepare_outbox(shard)
        role = "active" if self.sessions else "standby"
        event(
            log,
            "emitter is standby" if role == "standby" else "emitter shard released",
            role=role,
            reason=why,
            shard=shard,
        )


def _close_prepared(outbox: Outbox | AckedOutbox) -> None:
    if isinstance(outbox, Outbox):
        outbox.close(abort=False)
    else:
        outbox.close()


# Shards whose producers a standby makes ahead: each costs about six idle
# producers in transactions (every transactional id, and spares for a quick
# fence), five without (its producer, and one per transactional id to fence), so
# a process makes them for the first two shards; a shard beyond makes them at
# its takeover (a few tens of milliseconds more on a quiet machine).
_PREPARED_MAX = 2
# One read of the shared consumer when several shards share the loop.
_CONSUME_MAX = 1_000
