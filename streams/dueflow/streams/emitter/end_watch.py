"""Watching the end offsets of parked timer partitions.

The drainer parks slot partitions that were read to their end and whose next
visit is far away (they leave the fetch requests). A record that lands in one
of them is read in time when its visit comes near, as long as its producer
followed the placement rules. One written against them (a producer clock far
behind the broker's) would wait for that visit, up to a full round of its
level. So every ``END_WATCH_MS`` the active emitter asks for the
``read_committed`` end offset of every parked partition (one ListOffsets batch,
answered through futures, never blocking the loop) and resumes those whose end
moved past where they stopped.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, Protocol

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dueflow.observability.logs import event

log = logging.getLogger("dueflow.emitter.end_watch")

END_WATCH_MS = 1000


class Parking(Protocol):
    @property
    def parked(self) -> dict[int, int]: ...

    def wake_parked(self, ends: dict[int, int], now_ms: int) -> int: ...


class EndWatch:
    """Asks for the end offsets of parked partitions; driven by :meth:`tick`."""

    def __init__(self, topic: str, interval_ms: int = END_WATCH_MS) -> None:
        self._topic = topic
        self._interval = interval_ms
        self._admin: AdminClient | None = None
        self._next_ms = 0
        self._ends: dict[TopicPartition, Future[Any]] = {}
        self.woken = 0  # partitions resumed because their end moved

    def start(self, admin: AdminClient) -> None:
        self._admin = admin

    def tick(self, now_ms: int, parking: Parking) -> None:
        if self._ends and all(f.done() for f in self._ends.values()):
            ends: dict[int, int] = {}
            for tp, fut in self._ends.items():
                if fut.exception() is None:
                    ends[tp.partition] = fut.result().offset
            self._ends = {}
            woken = parking.wake_parked(ends, now_ms)
            if woken:
                self.woken += woken
                event(log, "parked timer partitions written to", logging.DEBUG, woken=woken)
        if now_ms < self._next_ms or self._admin is None or self._ends:
            return
        self._next_ms = now_ms + self._interval
        parked = parking.parked
        if not parked:
            return
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        self._ends = self._admin.list_offsets(
            {TopicPartition(self._topic, p): latest for p in parked},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=max(1.0, 5 * self._interval / 1000.0),
        )

    def close(self) -> None:
        self._admin = None
        self._ends = {}
