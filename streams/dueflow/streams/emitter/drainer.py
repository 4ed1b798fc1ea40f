"""The wheel drainer: what the active emitter does with every timer record.

It applies the rules of :mod:`dueflow.rules.drain` to the records the
:class:`~dueflow.streams.emitter.wheel_source.WheelSource` delivers, keeps the
heap of timers that fire soon, fires them through the
:class:`~dueflow.streams.emitter.outbox.Outbox`, pauses and resumes
partitions around the drain clock, and says which offsets (with their
checkpoints) the next transaction commits. It owns no client: the source,
the outbox and the clock readings are passed in.

Flow control. A heap feeder is read until a record is due more than its
read-ahead plus one level-0 slot past the drain clock, or until the heap
holds ``heap_budget`` timers; it resumes when the drain clock comes within
its read-ahead of that record (or that record fired), and the heap is below
half its budget. A slot of level 1 or up is read record by record and stops
at the first one not ready. The drain clock stays within one level-0 slot of
the earliest unfired timer, so slots open in due order and memory holds the
timers due within a few seconds of it, at most about the budget.

The hot path (near and level-0 records) reads headers only and keeps the
original message for firing, so the value bytes are forwarded unchanged.
Every timer fires through :class:`~dueflow.streams.emitter.firing.Firing`
(the one fire path: the size bound, the fire headers, tracing, the send).
Partition pauses are :class:`~dueflow.streams.emitter.pauses.PartitionPauses`.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.reasons import UNKNOWN_QUEUE, reason_label
from dueflow.rules.drain import (
    Checkpoint,
    TimerKey,
    cascade_ready_ms,
    classify_timer,
    heap_horizon_ms,
    idle_until_ms,
    landed_late,
    latest_fired,
    next_drain_ms,
)
from dueflow.rules.due_queue import DueQueue
from dueflow.rules.open_offsets import OpenOffsets
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import NEAR_LEVEL
from dueflow.streams.emitter.firing import CronFiring, Firing, Sender
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.pauses import PartitionControl, PartitionPauses
from dueflow.streams.emitter.rewrites import TimerRewrites
from dueflow.streams.emitter.shard_layout import ShardLayout
from dueflow.streams.emitter.target_queues import QueueTopics

log = logging.getLogger("dueflow.emitter.drain")

_EOF = KafkaError._PARTITION_EOF
PARK_PASS_MS = 100  # how often partitions read to their end are looked at for parking

# A timer in the queue, under its due time: (partition, offset, message, exec topic,
# is cron, headers, exec partition or -1: by key).
Entry = tuple[int, int, Message, str, bool, list[Any], int]


@dataclass(frozen=True, slots=True)
class SealedCommit:
    """A transaction handed over to commit: its timer offsets (with checkpoints)
    and the due times it fired, per exec topic."""

    offsets: list[TopicPartition]
    fired: dict[str, list[int]]


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
    ) -> None:
        geo = settings.wheel  # this shard's (WheelGeometry.of_shard)
        em = settings.emitter
        self._geo = geo
        self._topic = names(settings).timers
        self._source = source
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
        )
        self._horizon = heap_horizon_ms(geo)
        self._slot = geo.levels[0].width_ms  # lag of the drain clock, pause hysteresis
        self._budget = em.heap_budget
        self._bucket = TokenBucket(
            em.catchup_max_rate_per_s / 1000.0,  # per ms
            capacity=max(1.0, em.catchup_max_rate_per_s / 20.0),
            now=now_ms,
        )
        self._lay_out_partitions(committed)
        self._queue = DueQueue()
        self._pauses = PartitionPauses(source, stash_cap=max(1, em.heap_budget // 2))
        # The pauses' own containers (never replaced), read on the hot path.
        self._paused = self._pauses.paused  # partition -> resume key
        self._eof = self._pauses.eof
        self._eof_at = self._pauses.eof_at
        self._parked = self._pauses.parked
        self._feeder_queue: list[tuple[int, int]] = []  # (blocker due - read-ahead, p)
        self._blocker: dict[int, int] = {}  # paused feeder -> offset of its blocker
        self._full: set[int] = set()  # feeders paused because the heap was full
        self._slot_queue: list[tuple[int, int]] = []  # (ready time, p), slots of level >= 1
        self._rate_paused: set[int] = set()  # slots waiting for tokens
        # Parked: slot partitions read to their end and paused until their next
        # visit comes near (see _park_idle), so a fetch asks only for the
        # partitions that can hold a record needed soon: at 5k timers/s every
        # fetch used to carry all 260 partitions of the default wheel, and the
        # broker read each of them ~150 times a second.
        self._park_min = self._slot  # not parked for less than this
        self._next_park_ms = 0
        self._touched: set[int] = set()

    def _lay_out_partitions(self, committed: dict[int, tuple[int, Checkpoint | None]]) -> None:
        """Per-partition state, from the wheel and the committed offsets (with their
        checkpoints)."""
        geo = self._geo
        ours = geo.partitions
        # Per-partition lists are indexed by partition: this shard's are
        # ours.start .. n-1 (the entries below are never used).
        n = ours.stop
        layout = ShardLayout.of(geo)
        self._level = layout.level
        self._index = layout.index
        self._feeders = layout.feeders
        self._ahead = layout.ahead
        self._lead = layout.lead
        self._lead_slot = layout.lead_slot
        self._open = [OpenOffsets() if lv <= 0 else None for lv in self._level]
        self._read_to = [max(committed.get(p, (-1, None))[0], 0) for p in range(n)]
        # Due time a feeder has been read up to. Firing does not pass it (records
        # of one partition come in due order: a near partition's as they are
        # written, a level-0 partition's slot after slot), so a backlog fires in
        # due order; with nothing in the heap, neither does the drain clock.
        self._frontier = [0] * n
        self.fire_limit_ms = 0
        self.committed_offsets = {p: committed.get(p, (-1, None))[0] for p in ours}

        # Heap feeders re-read after a takeover, up to the previous emitter's read
        # offset: nothing fires until they are (it is a short stretch).
        self._replay: dict[int, Checkpoint] = {}
        checkpoints = []
        for p in self._feeders:
            offset, ck = committed.get(p, (-1, None))
            checkpoints.append(ck)
            if ck is not None and ck.read_to > max(offset, 0):
                self._replay[p] = ck
        self.fired: TimerKey | None = latest_fired(checkpoints)
        # Firing without transactions, the previous active emitter may have fired
        # timers after its last commit: those this period fires again are due by the
        # time it started. Counted (an upper bound) as re-fires; None: not counted.
        self.refire_before_ms: int | None = None
        self.drain_ms = self.fired[0] if self.fired is not None else 0
        self._unheard = set(self._feeders)  # feeders with neither a record nor an end yet

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
                self._from_slot(m, p, off, level, now_ms)
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
                found = self._unknown_queue(m, headers, found)
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
                self._hold(p, off, due - self._lead[p])
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

    def _from_slot(self, m: Message, p: int, off: int, level: int, now_ms: int) -> None:
        """A record of a level >= 1 slot: handle it when ready, else stop the partition."""
        found = classify_timer(m.headers(), m.key(), self._exec_topics, self._exec_partitions)
        if isinstance(found, str):
            found = self._unknown_queue(m, m.headers(), found)
        if isinstance(found, str):
            self._quarantine(m, p, off, found, now_ms)
            self._read_to[p] = off + 1
            return
        due, topic, cron, target = found
        ts = m.timestamp()[1]
        ready = cascade_ready_ms(
            geometry=self._geo, level=level, index=self._index[p], due_ms=due, append_ms=ts
        )
        if ready > self.drain_ms:
            self._pause_slot(p, off, ready)
            return
        if due <= now_ms:  # overdue (a catch-up, or written late): fire it from here
            if self._bucket.available(now_ms) < 1:
                self._pause(p, off, ready)
                self._rate_paused.add(p)
                return
            self._bucket.take(1)
            if landed_late(geometry=self._geo, level=level, due_ms=due, append_ms=ts):
                self._metrics.late_timers.inc()
            headers: Any = m.headers()
            self._firing.at(now_ms)(m, p, off, due, topic, cron, headers, target)
        else:
            to = self._rewrites.placement(m, due, now_ms)
            if to == p:  # cannot happen for a ready record; never loop
                self._pause_slot(p, off, ready + self._geo.levels[level].width_ms)
                return
            self._rewrites.place(m, p, off, to, now_ms, str(level))
        self._read_to[p] = off + 1
        self._touched.add(p)

    def _unknown_queue(
        self, m: Message, headers: Any, reason: str
    ) -> tuple[int, str, bool, int] | str:
        """A timer classified bad: when for a queue not known, ask the registry first
        (it may have been created a moment ago); classify it again if it exists."""
        if reason_label(reason) != UNKNOWN_QUEUE:
            return reason
        queue = hdr.header(headers, hdr.QUEUE)
        if queue is None or not self._queues.learn(queue, m.timestamp()[1]):
            return reason
        return classify_timer(headers, m.key(), self._exec_topics, self._exec_partitions)

    def _place_again(self, m: Message, p: int, off: int, due: int, level: int, now_ms: int) -> None:
        """A heap feeder's record due too far from when it was written (a producer
        clock far ahead): put it where it belongs now."""
        to = self._rewrites.placement(m, due, now_ms)
        self._rewrites.place(m, p, off, to, now_ms, "near" if level == NEAR_LEVEL else str(level))
        self._touched.add(p)

    def _quarantine(self, m: Message, p: int, off: int, reason: str, now_ms: int) -> None:
        self._rewrites.quarantine(m, p, off, reason, now_ms)
        self._touched.add(p)

    def _pause(self, p: int, next_offset: int, key: int) -> None:
        self._pauses.pause(p, next_offset, key)

    def _hold(self, p: int, off: int, key: int) -> None:
        """Pause a feeder at its record ``off``, due past its read-ahead (its blocker),
        until ``key``; what it delivered after that record is kept."""
        self._pauses.hold(p, off + 1, key)
        self._blocker[p] = off
        heapq.heappush(self._feeder_queue, (key, p))

    def _pause_slot(self, p: int, offset: int, ready_ms: int) -> None:
        self._pause(p, offset, ready_ms)
        heapq.heappush(self._slot_queue, (ready_ms, p))

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
        limit: int | None = None
        fire_limit = now_ms
        paused, eof, ahead, frontier = self._paused, self._eof, self._ahead, self._frontier
        slot = self._slot
        for p in self._feeders:
            if p in eof:
                continue
            # A paused feeder was read up to its blocker, a reading one up to its
            # frontier: nothing due later fires before it caught up (a reading one
            # gets one level-0 slot of slack, so a fetch in flight rarely stalls).
            at = frontier[p]
            if p in paused:
                if at < fire_limit:
                    fire_limit = at
                continue
            if at + ahead[p] + slot < fire_limit:
                if self._read_to[p] >= self._source.end_offset(p) >= 0:
                    # Read to its end, and the end event has not come yet (it can
                    # take a while when the fetch queue is full): nothing there.
                    eof.add(p)
                    continue
                fire_limit = at + ahead[p] + slot
            if limit is None or at + ahead[p] < limit:
                limit = at + ahead[p]
        self.fire_limit_ms = fire_limit
        drain = self.drain_ms = next_drain_ms(
            drain_ms=self.drain_ms,
            now_ms=now_ms,
            earliest_due_ms=queue.first_due(),
            lag_ms=slot,
            reading_limit_ms=None if queue else limit,
        )
        # A feeder paused by the drain clock resumes when its time comes; one paused
        # because the heap was full, also not before the heap is half empty.
        feeders = self._feeder_queue
        roomy = len(queue) < self._budget // 2
        waiting = []
        while feeders and feeders[0][0] <= drain:
            at, p = heapq.heappop(feeders)
            if self._paused.get(p) == at and p in self._blocker:
                if p in self._full and not roomy:
                    waiting.append((at, p))
                else:
                    self._resume(p, now_ms)
        for item in waiting:
            heapq.heappush(feeders, item)
        slots = self._slot_queue
        while slots and slots[0][0] <= drain:
            at, p = heapq.heappop(slots)
            if self._paused.get(p) == at and p not in self._rate_paused:
                self._resume(p, now_ms)
        if self._rate_paused and self._bucket.available(now_ms) >= 1:
            for p in list(self._rate_paused):
                self._rate_paused.discard(p)
                if p in self._paused:
                    self._resume(p, now_ms)
        if now_ms >= self._next_park_ms:
            self._next_park_ms = now_ms + PARK_PASS_MS
            self._park_idle(drain)

    def _park_idle(self, drain_ms: int) -> None:
        """Pause every slot partition read to its end whose next visit is more than
        ``_park_min`` away, until it comes near (level 0: a slot before the feeder
        would be read anyway; level 1 up: when it opens).

        A parked partition stays "at its end": nothing it can hold holds up
        firing. A record written into it against the placement rules (a producer
        clock far behind) is noticed by :meth:`wake_parked`.
        """
        paused, level_of, index, geo = self._paused, self._level, self._index, self._geo
        eof_at, read_to, replay = self._eof_at, self._read_to, self._replay
        horizon = drain_ms + self._park_min
        for p in self._eof:
            level = level_of[p]
            if level < 0 or p in paused or p in replay:
                continue
            key = idle_until_ms(geometry=geo, level=level, index=index[p], drain_ms=drain_ms)
            if level == 0:
                key -= self._lead_slot[p]
            if key <= horizon:
                continue
            at = max(eof_at.get(p, 0), read_to[p])
            self._pauses.park(p, at, key)
            heapq.heappush(self._slot_queue, (key, p))

    @property
    def parked(self) -> dict[int, int]:
        """Parked partitions and the offset each goes on at (a copy)."""
        return dict(self._parked)

    def wake_parked(self, ends: dict[int, int], now_ms: int) -> int:
        """Resume the parked partitions whose end offset (``ends``, read_committed)
        moved past where they stopped: a record landed there out of turn. Returns
        how many."""
        woken = 0
        for p, end in ends.items():
            at = self._parked.get(p)
            if at is not None and end > at:
                self._eof.discard(p)  # records are on their way (or its next end is)
                self._resume(p, now_ms)
                woken += 1
        return woken

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
        if self.drain_ms >= now_ms - 1:  # steady state: the drain clock is the wall clock
            if self._feeder_queue:
                at = min(at, max(self._feeder_queue[0][0], now_ms))
            if self._slot_queue:
                at = min(at, max(self._slot_queue[0][0], now_ms))
        if self._rate_paused:
            at = min(at, now_ms + max(1, self._bucket.wait(now_ms)))
        return at

    # ------------------------------------------------------------------ commits
    def commit_offsets(self) -> list[TopicPartition]:
        """Offsets and checkpoints of every partition changed since the last commit."""
        out = []
        fired = self.fired
        for p in self._touched:
            opens = self._open[p]
            if opens is not None:
                offset = opens.lowest(self._read_to[p])
                meta = Checkpoint(self._read_to[p], fired).encode()
            else:
                offset = self._read_to[p]
                meta = Checkpoint(offset).encode()
            out.append(TopicPartition(self._topic, p, offset, meta))
        return out

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
