"""A queue's partitions coming and going: the group's rebalance callbacks, and
the loading of a partition's stores before any of its records runs.

An assigned partition loads its idempotency keys (the key tail) and its
steering states (by whoever owned it before) up to now first; a revoked one
finishes its running jobs within the rebalance grace, commits what finished
and is forgotten; a lost one is forgotten at once (its uncommitted work is
the next owner's to do).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from confluent_kafka import KafkaException, TopicPartition

from dueflow.consumers.commands import CommandApplier, SteeringBook
from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import PartitionFeed
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.intake import Intake
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.progress import ProgressReporter
from dueflow.consumers.ratelimit import QueueRates
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.run_state import RunState
from dueflow.consumers.steering_loader import SteeringLoader
from dueflow.consumers.tail import KeyTail
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")


class RebalanceHandler:
    """What one queue does when the group assigns, revokes or loses partitions."""

    def __init__(
        self,
        *,
        queue: str,
        life: RunState,
        intake: Intake,
        tail: KeyTail,
        book: SteeringBook,
        steer: CommandApplier,
        steering_loader: SteeringLoader,
        recorder: BatchRecorder,
        planner: FollowUpPlanner,
        progress: ProgressReporter,
        tier_of: dict[str, int | None],
        rates: QueueRates,
        doubt: MembershipDoubt,
        inflight_changed: asyncio.Event,
        grace_s: float,
        commit_now: Callable[[], Awaitable[bool]],
        restart: Callable[[str], Awaitable[None]],
        pump: Callable[[], None],
    ) -> None:
        self._queue = queue
        self._life = life
        self._intake = intake
        self._tail = tail
        self._book = book
        self._steer = steer
        self._steering_loader = steering_loader
        self._batch = recorder
        self._planner = planner
        self._progress = progress
        self._tier_of = tier_of
        self._rates = rates
        self._doubt = doubt
        self._inflight_changed = inflight_changed
        self._grace_s = grace_s
        self._commit_now = commit_now
        self._restart = restart
        self._pump = pump
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ callbacks

    async def on_assign(self, partitions: list[TopicPartition]) -> None:
        # The coordinator just told this member what it owns (also after an
        # incremental change: the whole assignment is current).
        self._doubt.confirmed()
        feeds = self._intake.feeds
        groups = self._steer.groups.book
        for tp in partitions:
            if (tp.topic, tp.partition) in feeds:
                continue
            keys = self._tail.attach(tp.partition)
            self._book.attach(tp.partition)
            groups.attach(tp.partition)
            tier = self._tier_of.get(tp.topic)
            feed = PartitionFeed(tp.topic, tp.partition, tier, keys, self._planner)
            feed.reporter = self._progress
            feeds[(tp.topic, tp.partition)] = feed
        self._tail.drop_parked()
        self._book.drop_parked()
        groups.drop_parked()
        self.recompute_rates()
        event(
            _LOG,
            "partitions assigned",
            queue=self._queue,
            partitions=sorted({tp.partition for tp in partitions}),
        )

    async def on_revoke(self, partitions: list[TopicPartition]) -> None:
        intake = self._intake
        feeds = [f for tp in partitions if (f := intake.feeds.get((tp.topic, tp.partition)))]
        for feed in feeds:
            feed.advance(FeedState.REVOKED)
            feed.drop_undispatched()  # the next owner reads them again
        intake.unready(lambda f: f.revoked)
        await self._finish_running(feeds)
        if not self._life.restarting:
            # Commits what finished; never past an unfinished (or abandoned) job.
            await self._commit_now()
        for feed in feeds:
            intake.forget(feed)
            intake.feeds.pop((feed.topic, feed.partition), None)
        self._park(f.partition for f in feeds)
        self.recompute_rates()

    async def _finish_running(self, feeds: list[PartitionFeed]) -> None:
        """Wait for the running jobs of revoked ``feeds``, within the rebalance grace."""
        grace = self._grace_s if self._life.running else 0.0
        deadline = self._loop.time() + grace
        while any(f.inflight for f in feeds):
            left = deadline - self._loop.time()
            if left <= 0:
                event(
                    _LOG,
                    "abandoning in-flight jobs of revoked partitions",
                    logging.WARNING,
                    queue=self._queue,
                    jobs=sum(f.inflight for f in feeds),
                )
                return
            self._inflight_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._inflight_changed.wait(), left)

    async def on_lost(self, partitions: list[TopicPartition]) -> None:
        event(_LOG, "partitions lost", logging.WARNING, queue=self._queue)
        intake = self._intake
        for tp in partitions:
            feed = intake.feeds.pop((tp.topic, tp.partition), None)
            if feed is not None:
                intake.forget(feed)
        intake.unready(lambda f: f.gone)
        self._batch.lost()
        self._park(tp.partition for tp in partitions)
        self.recompute_rates()

    def _park(self, partitions: Iterable[int]) -> None:
        """Keep the stores of partitions no topic of the queue holds any more, in case
        they come back soon."""
        for p in self._intake.released(partitions):
            self._tail.park(p)
            self._book.park(p)
            self._steer.groups.book.park(p)

    def recompute_rates(self) -> None:
        self._rates.set_owned(self._intake.exec_owned, now=time.monotonic())

    # ------------------------------------------------------------------ loading

    def load(self, feed: PartitionFeed) -> None:
        """Load the stores of a partition's keys and steering states, then dispatch it."""
        self._loop.create_task(self._load(feed))

    async def _load(self, feed: PartitionFeed) -> None:
        # The two stores are read side by side: each waits for its own partition's
        # end, and neither read depends on the other.
        keys, steering = await asyncio.gather(
            self._keys_caught_up(feed), self._steering_caught_up(feed)
        )
        if not (keys and steering) or feed.gone:
            return
        if feed.state is FeedState.LOADING:  # revoked meanwhile: stays revoked
            feed.advance(FeedState.LOADED)
        self._intake.make_ready(feed)
        self._pump()

    def recheck(self, feed: PartitionFeed) -> None:
        """A redriven record: bring the key store up to date before it is judged."""
        feed.checking = True
        self._intake.sync_pause(feed)
        self._loop.create_task(self._recheck(feed))

    async def _recheck(self, feed: PartitionFeed) -> None:
        if not await self._keys_caught_up(feed):
            return
        feed.checking = False
        if feed.gone:
            return
        self._intake.sync_pause(feed)
        self._intake.make_ready(feed)
        self._pump()

    async def _keys_caught_up(self, feed: PartitionFeed) -> bool:
        """Wait until the key store holds the partition's idempotency records;
        False when cancelled or when reading them failed (the runtime restarts)."""
        try:
            await self._tail.caught_up(feed.partition)
        except asyncio.CancelledError:
            return False
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: closed meanwhile
            if self._life.begin_restart():
                await self._restart(f"key store load failed: {exc}")
            return False
        return True

    async def _steering_caught_up(self, feed: PartitionFeed) -> bool:
        """Read the partition's steering states written before now (by whoever owned
        it: this assignment may follow another member's); False when that failed
        (the runtime restarts), was cancelled, or the partition is gone meanwhile."""
        store = self._book.store(feed.partition)
        if store is None:  # revoked meanwhile
            return False
        try:
            available = await self._steering_loader.catch_up(feed.partition, store)
        except asyncio.CancelledError:
            return False
        except (KafkaException, RuntimeError) as exc:
            if self._life.begin_restart():
                await self._restart(f"steering store load failed: {exc}")
            return False
        if available:
            self._book.unavailable.discard(feed.partition)
        else:
            self._book.unavailable.add(feed.partition)
        return not feed.gone
