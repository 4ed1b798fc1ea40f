"""An emitter process: active while it holds the lease, a hot standby otherwise.

The loop polls the lease every turn. On acquiring it the process starts an
:class:`~dueflow.streams.emitter.session.ActiveSession` (which fences every
older emitter); on losing it, or on being fenced, it stops emitting at once
and aborts the open transaction. A failed transaction is aborted and the
session starts again from the committed offsets. A stop request commits the
open transaction and leaves the group, so a standby takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dueflow.clock_probe import ClockProbe
from dueflow.config import Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.logs import event
from dueflow.metrics import Metrics
from dueflow.streams.emitter.lease import Lease
from dueflow.streams.emitter.outbox import Outbox, TransactionAborted
from dueflow.streams.emitter.queues import EmitterQueues
from dueflow.streams.emitter.schedules import ScheduleTable
from dueflow.streams.emitter.session import ActiveSession
from dueflow.streams.emitter.wheel_source import WheelSource
from dueflow.tracing import JobTracer

log = logging.getLogger("dueflow.emitter")
_SCHEDULES_EVERY_S = 0.01
_QUEUES_EVERY_S = 0.1


class EmitterProcess:
    """Runs until ``stop`` is set: lease, active sessions, standby."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        clock_ms: Callable[[], int] | None = None,
        tracer: JobTracer | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        # Timers are due on the broker's clock: unless a clock is given, the
        # emitter reads "now" as the earliest the broker's clock can read.
        self._probe = None if clock_ms is not None else ClockProbe(settings, component="emitter")
        self._clock = clock_ms if clock_ms is not None else self._probe_now
        self._tracer = tracer
        self.lease = Lease(settings)
        # Static and registered queues; read before the schedules that name them.
        self.queues = EmitterQueues(settings, clock_ms=self._clock)
        self.schedules = ScheduleTable(settings, known_queue=self.queues.knows)
        self.source = WheelSource(settings)
        self.session: ActiveSession | None = None
        self._cooldown_until = 0.0
        self._schedules_at = 0.0  # monotonic time of the next schedules poll
        self._queues_at = 0.0  # ... and of the next queue registry poll
        self._outbox: Outbox | None = None  # the next active period's, prepared
        metrics.emitter_leader.set(0)
        for queue in settings.queue_names:  # series at 0 from the start, not from the first fire
            metrics.fires.labels(queue)
            metrics.fire_lateness.labels(queue)

    def _probe_now(self) -> int:
        assert self._probe is not None
        return self._probe.due_now_ms()

    def run(self, stop: threading.Event) -> None:
        if self._probe is not None:
            self._probe.report_to(self._metrics.clock_offset)
            self._probe.start()
            self._probe.wait_first()
        self.queues.start()
        self.schedules.start()
        self.source.start()
        self._prepare_outbox()
        self.lease.start()
        event(log, "emitter started", role="standby")
        try:
            while not stop.is_set():
                self._turn()
        finally:
            self._deactivate("shutdown", commit=True, prepare=False)
            if self._outbox is not None:
                self._outbox.close(abort=False)
            self.lease.close()
            self.queues.close()
            self.schedules.close()
            self.source.close()
            if self._probe is not None:
                self._probe.close()
            event(log, "emitter stopped")

    def _turn(self) -> None:
        held = self.lease.poll(0.0 if self.session is not None else 0.05)
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
        if not held:
            if self.session is not None:
                self._deactivate("lease lost", commit=False)
            return
        if self.session is None:
            if time.monotonic() < self._cooldown_until:
                return
            self._activate()
            return
        try:
            if self.queues.reader.bad:
                self.session.quarantine_queue_records()
            if changed or self.schedules.bad:
                self.session.on_schedules(changed)
            self.session.step()
        except FencedError as exc:
            event(log, "emitter fenced", logging.WARNING, error=str(exc))
            self._deactivate("fenced", commit=False)
            self._cooldown_until = (
                time.monotonic() + self._settings.emitter.session_timeout_ms / 1e3
            )
        except TransactionAborted as exc:
            self._metrics.emitter_transactions.labels("aborted").inc()
            event(
                log,
                "transaction aborted; restarting from committed",
                logging.WARNING,
                error=str(exc),
            )
            self._deactivate("transaction aborted", commit=False)
        except KafkaOperationError as exc:
            event(log, "emitter error; restarting from committed", logging.ERROR, error=str(exc))
            self._deactivate("error", commit=False)
            self._cooldown_until = time.monotonic() + 1.0

    def _prepare_outbox(self) -> None:
        """Make the next active period's producers now (a hot standby), so that
        taking over only fences."""
        outbox, self._outbox = Outbox(self._settings, clock_ms=self._clock), None
        try:
            outbox.prepare()
        except KafkaOperationError as exc:  # the takeover makes them then
            event(log, "could not prepare producers", logging.WARNING, error=str(exc))
        self._outbox = outbox

    def _activate(self) -> None:
        outbox, self._outbox = self._outbox, None
        session = ActiveSession(
            self._settings,
            self._metrics,
            schedules=self.schedules,
            source=self.source,
            clock_ms=self._clock,
            tracer=self._tracer,
            outbox=outbox,
            queues=self.queues,
        )
        started = time.monotonic()
        try:
            session.start()
        except (FencedError, KafkaOperationError) as exc:
            event(log, "emitter could not start", logging.ERROR, error=str(exc))
            session.close(commit=False)
            self._cooldown_until = time.monotonic() + 1.0
            self.source.renew()  # the next try with fresh clients
            self._prepare_outbox()
            return
        self.session = session
        self._metrics.emitter_leader.set(1)
        self._metrics.emitter_failovers.inc()
        event(
            log,
            "emitter is active",
            role="active",
            start_ms=round((time.monotonic() - started) * 1000),
        )

    def _deactivate(self, why: str, *, commit: bool, prepare: bool = True) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        self._metrics.emitter_leader.set(0)
        # Only the active emitter measures pending timers: a standby's old numbers
        # would go stale (and dashboards take the least report per level).
        self._metrics.timers_pending.clear()
        try:
            session.close(commit=commit)
        except (FencedError, KafkaOperationError) as exc:
            event(log, "closing the active session failed", logging.WARNING, error=str(exc))
        if prepare:
            self._prepare_outbox()
        event(log, "emitter is standby", role="standby", reason=why)
