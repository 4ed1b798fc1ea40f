"""The wheel's slots of level 1 and up, read as they open: each record is read
once its slot is ready for it, then fires (overdue) or moves down the wheel.

A slot is read record by record and stops at the first record not ready
(:func:`~dueflow.rules.drain.cascade_ready_ms`), until the drain clock reaches
that time; an overdue record fires from the slot, one catch-up token each, and
the slot stops when the tokens run out. Nothing of a slot goes to the heap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Message

from dueflow.observability.metrics import Metrics
from dueflow.rules.drain import cascade_ready_ms, classify_timer, landed_late
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import WheelGeometry
from dueflow.streams.emitter.drain_flow import DrainFlow
from dueflow.streams.emitter.firing import Firing
from dueflow.streams.emitter.rewrites import TimerRewrites
from dueflow.streams.emitter.target_queues import QueueTopics

# quarantine(message, partition, offset, reason, now_ms)
Quarantine = Callable[[Message, int, int, str, int], None]


class SlotCascade:
    """The slot records of one shard's drainer. ``read_to`` and ``touched`` are the
    drainer's (indexed by partition; the partitions changed since its last commit)."""

    def __init__(
        self,
        *,
        geometry: WheelGeometry,
        index: list[int],
        queues: QueueTopics,
        rewrites: TimerRewrites,
        firing: Firing,
        quarantine: Quarantine,
        flow: DrainFlow,
        bucket: TokenBucket,
        metrics: Metrics,
        read_to: list[int],
        touched: set[int],
    ) -> None:
        self._geo = geometry
        self._index = index
        self._queues = queues
        self._exec_topics = queues.exec_topics
        self._exec_partitions = queues.exec_partitions
        self._rewrites = rewrites
        self._firing = firing
        self._quarantine = quarantine
        self._flow = flow
        self._bucket = bucket
        self._metrics = metrics
        self._read_to = read_to
        self._touched = touched

    def read(self, m: Message, p: int, off: int, level: int, now_ms: int, drain_ms: int) -> None:
        """A record of a level >= 1 slot: handle it when ready at drain clock
        ``drain_ms``, else stop the partition."""
        found = classify_timer(m.headers(), m.key(), self._exec_topics, self._exec_partitions)
        if isinstance(found, str):
            found = self._queues.classify_again(m, m.headers(), found)
        if isinstance(found, str):
            self._quarantine(m, p, off, found, now_ms)
            self._read_to[p] = off + 1
            return
        due, topic, cron, target = found
        ts = m.timestamp()[1]
        ready = cascade_ready_ms(
            geometry=self._geo, level=level, index=self._index[p], due_ms=due, append_ms=ts
        )
        if ready > drain_ms:
            self._flow.pause_slot(p, off, ready)
            return
        if due <= now_ms:  # overdue (a catch-up, or written late): fire it from here
            if self._bucket.available(now_ms) < 1:
                self._flow.wait_for_tokens(p, off, ready)
                return
            self._bucket.take(1)
            if landed_late(geometry=self._geo, level=level, due_ms=due, append_ms=ts):
                self._metrics.late_timers.inc()
            headers: Any = m.headers()
            self._firing.at(now_ms)(m, p, off, due, topic, cron, headers, target)
        else:
            to = self._rewrites.placement(m, due, now_ms)
            if to == p:  # cannot happen for a ready record; never loop
                self._flow.pause_slot(p, off, ready + self._geo.levels[level].width_ms)
                return
            self._rewrites.place(m, p, off, to, now_ms, str(level))
        self._read_to[p] = off + 1
        self._touched.add(p)
