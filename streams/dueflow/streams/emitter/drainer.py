"""The wheel drainer: what the active emitter does with every timer record.

It applies the rules of :mod:`dueflow.rules.drain` to the records the
:class:`~dueflow.streams.emitter.wheel_source.WheelSource` delivers, keeps the
heap of timers that fire soon, fires them through the
:class:`~dueflow.streams.emitter.outbox.Outbox`, pauses and resumes
partitions around the drain clock, and says which offsets (with their
checkpoints) the next transaction commits. It owns no client: the source,
the outbox and the clock readings are passed in.

The drain clock stays within one level-0 slot of the earliest unfired timer,
so slots open in due order and memory holds the timers due within a few
seconds of it, at most about the heap budget. Which partitions are paused, and
when each goes on, is :class:`~dueflow.streams.emitter.drain_flow.DrainFlow`;
the slots of level 1 and up are read by
:class:`~dueflow.streams.emitter.slot_cascade.SlotCascade`; the offsets and
checkpoints committed are :mod:`~dueflow.streams.emitter.drain_checkpoints`.

The hot path (near and level-0 records) reads headers only and keeps the
original message for firing, so the value bytes are forwarded unchanged.
Every timer fires through :class:`~dueflow.streams.emitter.firing.Firing`
(the one fire path: the size bound, the fire headers, tracing, the send).
Partition pauses are :class:`~dueflow.streams.emitter.pauses.PartitionPauses`.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.rules.drain import (
    Checkpoint,
    TimerKey,
    classify_timer,
    heap_horizon_ms,
    next_drain_ms,
)
from dueflow.rules.due_queue import DueQueue
from dueflow.rules.open_offsets import OpenOffsets
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import NEAR_LEVEL
from dueflow.streams.emitter.drain_checkpoints import DrainStart, commit_offsets
from dueflow.streams.emitter.drain_checkpoints import SealedCommit as SealedCommit
from dueflow.streams.emitter.drain_flow import DrainFlow
from dueflow.streams.emitter.firing import CronFiring, Firing, Sender
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.pauses import PartitionControl, PartitionPauses
from dueflow.streams.emitter.rewrites import TimerRewrites
from dueflow.streams.emitter.shard_layout import ShardLayout
from dueflow.streams.emitter.slot_cascade import SlotCascade
from dueflow.streams.emitter.target_queues import QueueTopics

log = logging.getLogger("dueflow.emitter.drain")

_EOF = KafkaError._PARTITION_EOF

# A timer in the queue, under its due time: (partition, offset, message, exec topic,
# is cron, headers, exec partition or -1: by key).
Entry = tuple[int, int, Message, str, bool, list[Any], int]


class WheelDrainer:
    """Heap, partition states and the drain clock of one active period."""

    def __init__(
        self,
        *,
        settings: Settings,
        source: PartitionControl,
        sender: Sender,
        metrics: Metrics,
        committed: dict[int, tuple[int, Checkpoint | None]],
        now_ms: int,
        cron: CronFiring | None = None,
        tracer: JobTracer | None = None,
        queues: QueueTopics | None = None,
        limits: EmitterLimits | None = None,
        ahead_ms: int = 0,
    ) -> None:
        """``now_ms`` and every clock reading given later run ``ahead_ms`` ahead of
        the wall clock (``emitter.fire_ahead_ms``): timers fire that much before they
        are due, stamped with the wall clock's time."""
        geo = settings.wheel  # this shard's (WheelGeometry.of_shard)
        em = settings.emitter
        self._geo = geo
        self._topic = names(settings).timers
        self._metrics = metrics
        # Kept current by the emitter as queues are registered (shared dicts).
        self._queues = queues if queues is not None else QueueTopics(settings)
        self._exec_topics = self._queues.exec_topics
        self._exec_partitions = self._queues.exec_partitions
        # Record size limits (shared by the process's shards): exec topic -> the
        # largest len(key) + len(value) fired without measuring (see limits.py).
        self._limits = (
            limits if limits is not None else EmitterLimits(settings, read=lambda topics: {})
        )
        self._rewrites = TimerRewrites(
            sender=sender,
            geometry=geo,
            timer_topic=self._topic,
            quarantine_topic=names(settings).quarantine,
            limits=self._limits,
            metrics=metrics,
        )
        self._firing = Firing(
            sender=sender,
            timer_topic=self._topic,
            partitions=geo.partitions.stop,
            limits=self._limits,
            metrics=metrics,
            quarantine=self._quarantine,
            queue_of_topic=self._queues.queue_of_topic,
            cron=cron,
            tracer=tracer,
            ahead_ms=ahead_ms,
        )
        self._horizon = heap_horizon_ms(geo)
        self._slot = geo.levels[0].width_ms  # lag of the drain clock, pause hysteresis
        self._budget = em.heap_budget
        self._bucket = TokenBucket(
            em.catchup_max_rate_per_s / 1000.0,  # per ms
            capacity=max(1.0, em.catchup_max_rate_per_s / 20.0),
            now=now_ms,
        )
        # Per-partition lists are indexed by partition: this shard's are
        # geo.partitions (the entries below its first are never used).
        layout = ShardLayout.of(geo)
        self._level = layout.level
        self._feeders = layout.feeders
        self._lead = layout.lead
        self._lead_slot = layout.lead_slot
        self._open = [OpenOffsets() if lv <= 0 else None for lv in self._level]
        start = DrainStart.of(geo, self._feeders, committed)
        self._read_to = start.read_to
        # Due time a feeder has been read up to. Firing does not pass it (records
        # of one partition come in due order: a near partition's as they are
        # written, a level-0 partition's slot after slot), so a backlog fires in
        # due order; with nothing in the heap, neither does the drain clock.
        self._frontier = [0] * geo.partitions.stop
        self.fire_limit_ms = 0
        self.committed_offsets = start.committed_offsets
        self._replay = start.replay  # feeders re-read after a takeover
        self.fired: TimerKey | None = start.fired
        # Firing without transactions, the previous active emitter may have fired
        # timers after its last commit: those this period fires again are due by the
        # time it started. Counted (an upper bound) as re-fires; None: not counted.
        self.refire_before_ms: int | None = None
        self.drain_ms = self.fired[0] if self.fired is not None else 0
        self._unheard = set(self._feeders)  # feeders with neither a record nor an end yet
        self._queue = DueQueue()
        self._pauses = PartitionPauses(source, stash_cap=max(1, em.heap_budget // 2))
        self._flow = DrainFlow(self._pauses, geometry=geo, layout=layout)
        # The pauses' and the flow's own containers (never replaced), read on the hot path.
        self._paused = self._pauses.paused  # partition -> resume key
        self._eof = self._pauses.eof
        self._eof_at = self._pauses.eof_at
        self._parked = self._pauses.parked
        self._blocker = self._flow.blocker  # paused feeder -> offset of its blocker
        self._full = self._flow.full  # feeders paused because the heap was full
        self._touched: set[int] = set()
        self._cascade = SlotCascade(
            geometry=geo,
            index=layout.index,
            queues=self._queues,
            rewrites=self._rewrites,
            firing=self._firing,
            quarantine=self._quarantine,
            flow=self._flow,
            bucket=self._bucket,
            metrics=metrics,
            read_to=self._read_to,
            touched=self._touched,
        )

    # ------------------------------------------------------------------ state
    @property
    def heap_size(self) -> int:
        return len(self._queue)

    @property
    def starting(self) -> bool:
        """True until every feeder reported once and the re-read after a takeover is done."""
        return bool(self._unheard or self._replay)

    @property
    def touched(self) -> bool:
        return bool(self._touched)

    def has_due(self, now_ms: int) -> bool:
        """True while a timer in the heap is due at ``now_ms`` (fired or not yet firable)."""
        top = self._queue.first_due()
        return top is not None and top <= now_ms

    def overdue_ms(self, now_ms: int) -> int:
        """How long the earliest timer in the heap has been due; -1: none is due."""
        top = self._queue.first_due()
        return now_ms - top if top is not None and top <= now_ms else -1

    # ------------------------------------------------------------------ reading
    def on_messages(self, messages: list[Message], now_ms: int) -> None:
        """Handle a batch of records (and partition-end events) from the source."""
        level_of, read_to, paused, eof = self._level, self._read_to, self._paused, self._eof
        classify = classify_timer
        exec_topics, exec_partitions = self._exec_topics, self._exec_partitions
        push, opens, touched, frontier = self._queue.push, self._open, self._touched, self._frontier
        replay, unheard = self._replay, self._unheard
        horizon, budget, lead_slot = self._horizon, self._budget, self._lead_slot
        drain = self.drain_ms  # not moved while records are read
        # The last fired key (it does not change while records are read), due first:
        # most records are due after it and cost one comparison.
        fired = self.fired
        fired_due = fired[0] if fired is not None else -1
        fired_at = fired[1:] if fired is not None else (-1, -1)
        at_once = 0
        fire = self._firing.at(now_ms)
        from_slot = self._cascade.read
        for m in messages:
            p: int = m.partition()  # type: ignore[assignment]
            if p in paused:
                self._pauses.keep(p, m)  # delivered after the pause: kept, or fetched again
                continue
            if m.error() is not None:
                self._on_event(m, p)
                continue
            off: int = m.offset()  # type: ignore[assignment]
            if off < read_to[p]:
                continue
            eof.discard(p)
            level = level_of[p]
            if level > 0:
                from_slot(m, p, off, level, now_ms, drain)
                continue
            if unheard:
                unheard.discard(p)
            ck = replay.get(p) if replay else None
            if ck is not None and off + 1 >= ck.read_to:
                del replay[p]  # the last record the previous emitter had read
                if off >= ck.read_to:
                    ck = None
            headers: Any = m.headers()
            found = classify(headers, m.key(), exec_topics, exec_partitions)
            read_to[p] = off + 1
            if isinstance(found, str):
                found = self._queues.classify_again(m, headers, found)
            if isinstance(found, str):
                if ck is None:
                    self._quarantine(m, p, off, found, now_ms)
                continue
            due, topic, cron, target = found
            frontier[p] = due
            if due - m.timestamp()[1] > horizon:
                if ck is None:
                    self._place_again(m, p, off, due, level, now_ms)
                continue
            if ck is not None and ck.fired is not None and (due, p, off) <= ck.fired:
                continue  # fired by the previous emitter
            if due <= fired_due and (due < fired_due or (p, off) < fired_at):
                # Read after later timers fired (written overdue, or placed again
                # during a catch-up): due already, fire it now so no commit leaves it
                # behind. It still spends a token: the rate limit holds on average.
                fire(m, p, off, due, topic, cron, headers, target)
                at_once += 1
                touched.add(p)
                continue
            opens[p].add(off)  # type: ignore[union-attr]
            held = push(due, (p, off, m, topic, cron, headers, target))
            if ck is None and (held >= budget or (level == 0 and due > drain + lead_slot[p])):
                self._flow.hold(p, off, due - self._lead[p])
                if held >= budget:
                    self._full.add(p)
        if at_once:
            self._bucket.take(at_once)

    def _on_event(self, m: Message, p: int) -> None:
        """A partition-end event (or a consumer error) of partition ``p``."""
        err = m.error()
        if err.code() != _EOF:  # type: ignore[union-attr]
            event(log, "timer consumer error", logging.WARNING, error=str(err))
            return
        self._eof.add(p)
        self._eof_at[p] = m.offset()  # type: ignore[assignment]
        self._unheard.discard(p)
        ck = self._replay.get(p)
        if ck is not None and m.offset() >= ck.read_to:  # type: ignore[operator]
            del self._replay[p]

    def _place_again(self, m: Message, p: int, off: int, due: int, level: int, now_ms: int) -> None:
        """A heap feeder's record due too far from when it was written (a producer
        clock far ahead): put it where it belongs now."""
        to = self._rewrites.placement(m, due, now_ms)
        self._rewrites.place(m, p, off, to, now_ms, "near" if level == NEAR_LEVEL else str(level))
        self._touched.add(p)

    def _quarantine(self, m: Message, p: int, off: int, reason: str, now_ms: int) -> None:
        self._rewrites.quarantine(m, p, off, reason, now_ms)
        self._touched.add(p)

    def _resume(self, p: int, now_ms: int) -> None:
        self._full.discard(p)
        self._blocker.pop(p, None)
        kept = self._pauses.release(p)
        if kept:
            self.on_messages(kept, now_ms)  # may pause it again, keeping the rest
        self._pauses.resume(p)

    # ------------------------------------------------------------------ firing
    def fire_due(self, now_ms: int) -> int:
        """Fire queued timers due at ``now_ms`` in key order, within the rate limit and
        the fire limit (never past a feeder that has not been read that far)."""
        queue = self._queue
        limit = min(now_ms, self.fire_limit_ms)
        top = queue.first_due()
        if top is None or top > limit or self.starting:
            return 0
        budget = self._bucket.available(now_ms)
        opens = self._open
        touched = self._touched
        blocker = self._blocker
        fire = self._firing.at(now_ms)
        count = 0
        last: TimerKey | None = None
        while count < budget:
            got = queue.pop_bucket(limit)
            if got is None:
                break
            due, entries = got
            n = 0
            for p, off, m, topic, cron, headers, target in entries:
                if count >= budget:
                    break
                fire(m, p, off, due, topic, cron, headers, target)
                opens[p].finish(off)  # type: ignore[union-attr]
                touched.add(p)
                count += 1
                n += 1
                if blocker.get(p) == off:
                    # It stopped at a timer that fired: read on. Records it kept that
                    # are due before that timer must fire now, not wait in the queue (a
                    # checkpoint says every record up to `fired` has fired).
                    self.fired = (due, p, off)
                    self._resume(p, now_ms)
                    limit = min(limit, due + self._slot)
                    break  # what it read may go in this bucket: take it again
            if n:
                last = (due, entries[n - 1][0], entries[n - 1][1])
            if n < len(entries):
                queue.put_back(due, entries[n:])
        if last is not None:
            self.fired = last
            self._bucket.take(count)
        return count

    # ------------------------------------------------------------------ clock
    def advance(self, now_ms: int) -> None:
        """Move the drain clock and resume the partitions whose time came."""
        if self.starting:
            return  # every feeder reports a record or its end first
        queue = self._queue
        fire_limit, limit = self._flow.fire_limits(
            now_ms, frontier=self._frontier, read_to=self._read_to
        )
        self.fire_limit_ms = fire_limit
        drain = self.drain_ms = next_drain_ms(
            drain_ms=self.drain_ms,
            now_ms=now_ms,
            earliest_due_ms=queue.first_due(),
            lag_ms=self._slot,
            reading_limit_ms=None if queue else limit,
        )
        # A feeder paused by the drain clock resumes when its time comes; one paused
        # because the heap was full, also not before the heap is half empty.
        self._flow.resume_due(
            drain,
            now_ms,
            roomy=len(queue) < self._budget // 2,
            bucket=self._bucket,
            resume=self._resume,
        )
        self._flow.park_idle(drain, now_ms, read_to=self._read_to, replay=self._replay)

    @property
    def parked(self) -> dict[int, int]:
        """Parked partitions and the offset each goes on at (a copy)."""
        return dict(self._parked)

    def wake_parked(self, ends: dict[int, int], now_ms: int) -> int:
        """Resume the parked partitions whose end offset (``ends``, read_committed)
        moved past where they stopped: a record landed there out of turn. Returns
        how many."""
        return self._flow.wake_parked(ends, now_ms, resume=self._resume)

    def wake_ms(self, now_ms: int) -> int:
        """Wall-clock time the loop should look again at the latest."""
        if self.starting:
            return now_ms + 5
        at = now_ms + 50
        top = self._queue.first_due()
        if top is not None:
            if top > now_ms:
                at = min(at, top)
            elif top <= self.fire_limit_ms:
                at = min(at, now_ms + self._bucket.wait(now_ms))
            else:  # a feeder is still reading: its records wake the loop
                at = min(at, now_ms + 5)
        # Steady state: the drain clock is the wall clock.
        steady = self.drain_ms >= now_ms - 1
        return self._flow.wake_ms(at, now_ms, steady=steady, bucket=self._bucket)

    # ------------------------------------------------------------------ commits
    def commit_offsets(self) -> list[TopicPartition]:
        """Offsets and checkpoints of every partition changed since the last commit."""
        return commit_offsets(
            topic=self._topic,
            touched=self._touched,
            opens=self._open,
            read_to=self._read_to,
            fired=self.fired,
        )

    def seal(self) -> SealedCommit:
        """The offsets the transaction being committed carries, and the fires in it:
        what follows goes in the next transaction."""
        sealed = SealedCommit(self.commit_offsets(), self._firing.take_fired())
        self._touched.clear()
        return sealed

    def take_fired(self) -> dict[str, list[int]]:
        """The due times fired since the last call (or seal), per exec topic."""
        return self._firing.take_fired()

    def on_committed(self, sealed: SealedCommit, done_ms: int) -> None:
        """The transaction :meth:`seal` described committed at ``done_ms``: count
        and measure.

        Lateness is measured here, at commit: a fired job is visible to workers
        (read_committed) only from now on.
        """
        self.confirm(sealed.offsets)
        self.on_visible(sealed.fired, done_ms)

    def confirm(self, offsets: list[TopicPartition]) -> None:
        """``offsets`` are committed: records below them may be deleted."""
        mine = self.committed_offsets
        for tp in offsets:
            if tp.topic == self._topic and tp.partition in mine:
                mine[tp.partition] = tp.offset

    def on_visible(self, fired: dict[str, list[int]], done_ms: int) -> None:
        """Jobs fired at ``fired`` due times (per exec topic) are visible to consumers
        since ``done_ms``: count them and their lateness, and the re-fires among them."""
        self._firing.count_visible(fired, done_ms, refire_before_ms=self.refire_before_ms)
