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

from dueflow.config import Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.logs import event
from dueflow.metrics import Metrics
from dueflow.streams.emitter.lease import Lease
from dueflow.streams.emitter.outbox import TransactionAborted
from dueflow.streams.emitter.schedules import ScheduleTable
from dueflow.streams.emitter.session import ActiveSession, wall_ms
from dueflow.streams.emitter.wheel_source import WheelSource
from dueflow.tracing import JobTracer

log = logging.getLogger("dueflow.emitter")


class EmitterProcess:
    """Runs until ``stop`` is set: lease, active sessions, standby."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        tracer: JobTracer | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._clock = clock_ms
        self._tracer = tracer
        self.lease = Lease(settings)
        self.schedules = ScheduleTable(settings)
        self.source = WheelSource(settings)
        self.session: ActiveSession | None = None
        self._cooldown_until = 0.0
        metrics.emitter_leader.set(0)
        for queue in settings.queue_names:  # series at 0 from the start, not from the first fire
            metrics.fires.labels(queue)
            metrics.fire_lateness.labels(queue)

    def run(self, stop: threading.Event) -> None:
        self.schedules.start()
        self.source.start()
        self.lease.start()
        event(log, "emitter started", role="standby")
        try:
            while not stop.is_set():
                self._turn()
        finally:
            self._deactivate("shutdown", commit=True)
            self.lease.close()
            self.schedules.close()
            self.source.close()
            event(log, "emitter stopped")

    def _turn(self) -> None:
        held = self.lease.poll(0.0 if self.session is not None else 0.05)
        changed = self.schedules.poll()  # standbys keep the table warm too
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

    def _activate(self) -> None:
        session = ActiveSession(
            self._settings,
            self._metrics,
            schedules=self.schedules,
            source=self.source,
            clock_ms=self._clock,
            tracer=self._tracer,
        )
        started = time.monotonic()
        try:
            session.start()
        except (FencedError, KafkaOperationError) as exc:
            event(log, "emitter could not start", logging.ERROR, error=str(exc))
            session.close(commit=False)
            self._cooldown_until = time.monotonic() + 1.0
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

    def _deactivate(self, why: str, *, commit: bool) -> None:
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
        event(log, "emitter is standby", role="standby", reason=why)
