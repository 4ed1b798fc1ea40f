"""What the drainer writes besides fired jobs: timers placed again in the wheel, and
timers quarantined.

A timer is placed again when it has to move down the wheel (a slot of level 1
or up opened before it is due), or when a heap feeder reads one due too far
from when it was written (a producer clock far ahead). While the limits are
being checked after a write was refused as too large
(:meth:`~dueflow.streams.emitter.limits.EmitterLimits.measures_cascades`), a
timer the timer topic no longer takes is quarantined instead. A timer that
cannot be read as one is quarantined with the reason.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

from confluent_kafka import Message

from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.reasons import RECORD_TOO_LARGE, reason_label, with_detail
from dueflow.rules.wheel import WheelGeometry, place_timer
from dueflow.streams.emitter.firing import Sender
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.quarantine_records import count_cut, quarantine_record

log = logging.getLogger("dueflow.emitter.drain")


class TimerRewrites:
    """Places timers again and quarantines them, for one shard's drainer."""

    def __init__(
        self,
        *,
        sender: Sender,
        geometry: WheelGeometry,
        timer_topic: str,
        quarantine_topic: str,
        limits: EmitterLimits,
        metrics: Metrics,
    ) -> None:
        self._send = sender.send
        self._geo = geometry
        self._topic = timer_topic
        self._quarantine_topic = quarantine_topic
        self._limits = limits
        self._metrics = metrics

    def placement(self, m: Message, due: int, now_ms: int) -> int:
        """The timer partition the timer ``m``, due at ``due``, belongs in now."""
        spread = zlib.crc32(m.key() or b"")
        return place_timer(due_ms=due, now_ms=now_ms, geometry=self._geo, spread=spread).partition

    def place(self, m: Message, p: int, off: int, partition: int, now_ms: int, level: str) -> None:
        """Write the timer ``m`` (at ``p``/``off``) again, into ``partition``; counted as
        cascaded from ``level``."""
        if self._too_large(m, p, off, now_ms):
            return
        self._send(self._topic, m.value(), m.key(), m.headers(), partition)
        self._metrics.cascaded.labels(level).inc()

    def quarantine(self, m: Message, p: int, off: int, reason: str, now_ms: int) -> None:
        """Set the timer ``m`` (at ``p``/``off``) aside, with ``reason``."""
        record = quarantine_record(
            reason=reason,
            topic=self._topic,
            partition=p,
            offset=off,
            key=m.key(),
            value=m.value(),
            headers=m.headers(),  # type: ignore[arg-type]
            at_ms=now_ms,
            limit=self._limits.quarantine,
        )
        self._send(self._quarantine_topic, record.value, record.key, record.headers)
        count_cut(self._metrics, record)
        self._metrics.quarantined.labels("emitter", reason_label(reason)).inc()
        event(log, "timer quarantined", logging.WARNING, reason=reason, partition=p, offset=off)

    def _too_large(self, m: Message, p: int, off: int, now_ms: int) -> bool:
        """A timer to place again: while the limits are being checked after a refusal,
        quarantine it when the timer topic no longer takes it. True: quarantined."""
        if not self._limits.measures_cascades(now_ms):
            return False
        headers: Any = m.headers() or []
        why = self._limits.too_large(self._topic, m.key(), m.value(), headers, what="timer record")
        if why is None:
            return False
        self.quarantine(m, p, off, with_detail(RECORD_TOO_LARGE, why), now_ms)
        self._metrics.too_large.labels("emitter", "timer record").inc()
        return True
