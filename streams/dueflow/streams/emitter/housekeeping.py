"""Off the hot path: pending timers per level and DeleteRecords.

Every ``housekeeping_interval_ms`` the active emitter of a shard asks the
cluster for the end offset of every timer partition of the shard (one
ListOffsets batch, answered through futures, never blocking the loop) and
exports high watermark minus committed offset per level as
``dueflow_timers_pending`` (a process driving several shards adds them
up). Records below a committed offset were handled for good, so they are
deleted with DeleteRecords; the timer topic has no time retention, so nothing
else removes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dueflow.config import Settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.rules.wheel import NEAR_LEVEL

log = logging.getLogger("dueflow.emitter.housekeeping")


def level_label(level: int) -> str:
    return "near" if level == NEAR_LEVEL else str(level)


def pending_by_level(
    *, ends: Mapping[int, int], committed: Mapping[int, int], levels: Mapping[int, int]
) -> dict[str, int]:
    """Timers not yet handled per level label: end offset minus committed offset (pure)."""
    out: dict[str, int] = {}
    for p, level in levels.items():
        label = level_label(level)
        end = ends.get(p)
        out.setdefault(label, 0)
        if end is not None:
            out[label] += max(0, end - max(committed.get(p, 0), 0))
    return out


class Housekeeping:
    """Periodic jobs of the active emitter, driven by :meth:`tick`."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        report: Callable[[int, dict[str, int]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._topic = names(settings).timers
        self._interval = settings.emitter.housekeeping_interval_ms
        geo = settings.wheel  # this shard's
        self._shard = geo.shard
        self._levels = {p: geo.locate(p)[0] for p in geo.partitions}
        # The process adds up its shards' counts (PendingTotals); alone, set them.
        self._report = report if report is not None else self._set_gauges
        self._admin: AdminClient | None = None
        self._next_ms = 0
        self._ends: dict[TopicPartition, Future[Any]] = {}
        self._deletes: dict[TopicPartition, Future[Any]] = {}
        self._deleted: dict[int, int] = {}
        self.pending: dict[str, int] = {}

    def start(self) -> None:
        self._admin = make_admin(self._settings)

    @property
    def admin(self) -> AdminClient:
        """The admin client (shared with the other periodic jobs of the active period)."""
        assert self._admin is not None, "start() first"
        return self._admin

    def tick(self, now_ms: int, committed: Mapping[int, int]) -> None:
        if now_ms < self._next_ms or self._admin is None:
            return
        self._next_ms = now_ms + self._interval
        self._collect(committed)
        admin = self._admin
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        specs = {TopicPartition(self._topic, p): latest for p in self._levels}
        self._ends = admin.list_offsets(specs, request_timeout=self._interval / 1000.0)
        todo = [
            TopicPartition(self._topic, p, off)
            for p, off in committed.items()
            if off > self._deleted.get(p, 0)
        ]
        if todo and not self._deletes:
            self._deletes = admin.delete_records(todo, operation_timeout=0)
            for tp in todo:
                self._deleted[tp.partition] = tp.offset

    def _collect(self, committed: Mapping[int, int]) -> None:
        if self._ends and all(f.done() for f in self._ends.values()):
            ends: dict[int, int] = {}
            for tp, fut in self._ends.items():
                if fut.exception() is None:
                    ends[tp.partition] = fut.result().offset
            self.pending = pending_by_level(ends=ends, committed=committed, levels=self._levels)
            self._report(self._shard, self.pending)
            self._ends = {}
        if self._deletes and all(f.done() for f in self._deletes.values()):
            for tp, fut in self._deletes.items():
                exc = fut.exception()
                if exc is not None:
                    self._deleted.pop(tp.partition, None)  # try again next time
                    event(
                        log,
                        "delete records failed",
                        logging.WARNING,
                        partition=tp.partition,
                        error=str(exc),
                    )
            self._deletes = {}

    def _set_gauges(self, _shard: int, pending: dict[str, int]) -> None:
        for label, count in pending.items():
            self._metrics.timers_pending.labels(label).set(count)

    def close(self) -> None:
        self._admin = None


class PendingTotals:
    """``dueflow_timers_pending`` of a process that drives several shards: per
    level, the sum of the latest count of each shard it drives."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._by_shard: dict[int, dict[str, int]] = {}

    def report(self, shard: int, pending: dict[str, int]) -> None:
        self._by_shard[shard] = dict(pending)
        self._publish()

    def forget(self, shard: int) -> None:
        """The shard is no longer driven here: its counts go (another emitter's now)."""
        if self._by_shard.pop(shard, None) is not None:
            self._metrics.timers_pending.clear()
            self._publish()

    def _publish(self) -> None:
        totals: dict[str, int] = {}
        for pending in self._by_shard.values():
            for label, count in pending.items():
                totals[label] = totals.get(label, 0) + count
        for label, count in totals.items():
            self._metrics.timers_pending.labels(label).set(count)
