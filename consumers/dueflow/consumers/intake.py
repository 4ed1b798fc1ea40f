"""The partitions a queue's worker holds, and how their records come in.

:class:`Intake` is the queue's subscription state (as aiokafka's
``SubscriptionState`` over its ``TopicPartitionState``s): the assigned
partitions, each a :class:`~dueflow.consumers.feeds.PartitionFeed` with its
backlog and offsets; which of them are ready to dispatch; the replays held
until their key's running attempt ends; and back pressure (a partition whose
backlog is full, or that is held, stops fetching).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError

from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.polling import GroupPoller
from dueflow.consumers.run_state import RunState
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics

_LOG = logging.getLogger("dueflow.worker")


class Intake:
    """One queue's assigned partitions, their readiness and their fetching."""

    def __init__(
        self,
        *,
        queue: str,
        group: str,
        fetch_batch: int,
        concurrency: int,
        life: RunState,
        metrics: Metrics,
        overlap: OverlapGuard,
    ) -> None:
        self._queue = queue
        self._group = group
        self._life = life
        self._metrics = metrics
        self._overlap = overlap
        # Shared with the dispatcher and the rebalance handler: changed in place only.
        self.feeds: dict[tuple[str, int], PartitionFeed] = {}
        self.ready: deque[PartitionFeed] = deque()
        self.held: dict[bytes, list[Delivery]] = {}  # key -> replays waiting for it
        self.queue_held = False  # the queue's rate limit: no token now
        self.operator_paused = False  # `dueflow queue pause`: start nothing, keep the group
        self.poller: GroupPoller | None = None
        # Back pressure: a partition whose backlog reaches _high stops fetching until _low.
        self._high = max(2 * fetch_batch, 2 * concurrency)
        self._low = self._high // 2

    # ------------------------------------------------------------------ records in

    def on_batch(
        self, msgs: list[Any], *, load: Callable[[PartitionFeed], None], pump: Callable[[], None]
    ) -> None:
        """Records fetched: into their partitions' backlogs (``load``: start loading
        the stores of a partition that sees its first records since assignment)."""
        if self.poller is not None:
            self.poller.batch_taken()
        if self._life.restarting:
            return
        touched = self._take(msgs)
        for feed, seen in touched.items():
            feed.tracker.extend(seen)
        for feed in touched:
            if feed.state is FeedState.ASSIGNED:
                # First records since assignment: the group's offsets for this
                # partition are stable now; load the keys up to now before any
                # record of it runs.
                feed.committed = feed.backlog[0].offset if feed.backlog else None
                feed.advance(FeedState.LOADING)
                load(feed)
            elif feed.loaded and not feed.held:
                self.make_ready(feed)
            self.sync_pause(feed)
        pump()

    def _take(self, msgs: list[Any]) -> dict[PartitionFeed, list[int]]:
        """Append each record to its partition's backlog; the offsets per feed, added
        to its tracker once per batch (hot path)."""
        feeds = self.feeds
        touched: dict[PartitionFeed, list[int]] = {}
        last: tuple[str, int] | None = None
        feed: PartitionFeed | None = None
        offsets: list[int] = []
        append = None
        for msg in msgs:
            if msg.error() is not None:
                err = msg.error()
                if err.code() != KafkaError._PARTITION_EOF:
                    event(_LOG, "consume error", logging.WARNING, queue=self._queue, error=str(err))
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
        return touched

    # ------------------------------------------------------------------ readiness

    def make_ready(self, feed: PartitionFeed) -> None:
        if not feed.in_ready and feed.backlog and feed.loaded:
            feed.in_ready = True
            self.ready.append(feed)

    def ready_all(self) -> None:
        """Every partition not held is dispatchable again (once it has records)."""
        for feed in self.feeds.values():
            if not feed.held:
                self.make_ready(feed)

    def requeue(self, held: list[Delivery]) -> None:
        """Replays of a key that just finished: decided again, first in their partitions."""
        for d in reversed(held):
            if not d.feed.gone and not d.feed.revoked:
                d.feed.backlog.appendleft(d)
                self.make_ready(d.feed)

    def unready(self, drop: Callable[[PartitionFeed], bool]) -> None:
        """Take the partitions ``drop`` says out of the ready ones."""
        ready = self.ready
        kept = [f for f in ready if not drop(f)]
        ready.clear()
        ready.extend(kept)

    # ------------------------------------------------------------------ fetching

    def sync_pause(self, feed: PartitionFeed) -> None:
        """Pause fetching while a partition is held or its backlog is full; resume after.

        Pausing is back pressure, not correctness: records fetched before the
        pause takes effect simply join the backlog.
        """
        poller = self.poller
        if feed.gone or poller is None:
            return
        size = feed.waiting
        held = feed.held or self.queue_held or self._life.closing or self.operator_paused
        want = held or (size > self._low if feed.paused else size >= self._high)
        if want == feed.paused:
            return
        feed.paused = want
        tp = feed.tp
        if want:
            poller.post(lambda c: c.pause([tp]))
        else:
            poller.post(lambda c: c.resume([tp]))

    def sync_all(self) -> None:
        for feed in self.feeds.values():
            self.sync_pause(feed)

    # ------------------------------------------------------------------ partitions

    def forget(self, feed: PartitionFeed) -> None:
        """The partition is no longer this member's: what finishes of it writes nothing."""
        feed.advance(FeedState.GONE)
        feed.drop_undispatched()
        with contextlib.suppress(KeyError):  # its lag is the new owner's to report now
            self._metrics.consumer_lag.remove(self._group, feed.topic, str(feed.partition))
        if feed.timer is not None:
            feed.timer.cancel()
            feed.timer = None
        held = self.held
        kept = {k: ds for k, v in held.items() if (ds := [d for d in v if not d.feed.gone])}
        held.clear()
        held.update(kept)
        self._overlap.forget_gone()

    def forget_all(self) -> None:
        """A restart: every partition, ready one and held replay is forgotten."""
        for feed in self.feeds.values():
            self.forget(feed)
        self.feeds.clear()
        self.ready.clear()
        self.held.clear()

    def holds_partition(self, partition: int) -> bool:
        """Whether any topic's ``partition`` (exec or a retry tier) is still held."""
        return any(f.partition == partition for f in self.feeds.values())

    def released(self, partitions: Iterable[int]) -> set[int]:
        """Which of ``partitions`` no topic of the queue holds any more."""
        return {p for p in set(partitions) if not self.holds_partition(p)}

    @property
    def in_flight(self) -> int:
        return sum(f.inflight for f in self.feeds.values())

    @property
    def backlog(self) -> int:
        return sum(f.waiting for f in self.feeds.values())

    @property
    def exec_owned(self) -> int:
        """Exec partitions held (the queue's rate limit is shared out by them)."""
        return sum(1 for f in self.feeds.values() if f.tier_ms is None)
