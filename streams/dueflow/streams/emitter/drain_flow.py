"""Flow control of the wheel drainer: why each timer partition it paused waits,
and when it goes on.

A heap feeder is read until a record is due more than its read-ahead plus one
level-0 slot past the drain clock, or until the heap holds ``heap_budget``
timers: it is *held* at that record (its blocker), and resumes when the drain
clock comes within its read-ahead of that record (or that record fired), and
the heap is below half its budget. A slot of level 1 or up is read record by
record and stops at the first one not ready, until the drain clock reaches the
time it is ready (or, firing an overdue record, until the catch-up rate has a
token again). Firing in turn waits for reading: nothing fires past the due
time a feeder has been read up to (:meth:`DrainFlow.fire_limits`).

Parked: slot partitions read to their end and paused until their next visit
comes near, so a fetch asks only for the partitions that can hold a record
needed soon: without parking, at 5k timers/s every fetch would carry all 260
partitions of the default wheel, and the broker would read each of them ~150
times a second.

The pauses themselves are :class:`~dueflow.streams.emitter.pauses.PartitionPauses`;
resuming a partition (reading the records kept for it first) is the drainer's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from dueflow.rules.drain import Checkpoint, idle_until_ms
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import WheelGeometry
from dueflow.streams.emitter.pauses import PartitionPauses
from dueflow.streams.emitter.shard_layout import ShardLayout

PARK_PASS_MS = 100  # how often partitions read to their end are looked at for parking


class DrainFlow:
    """The paused timer partitions of one active period by what they wait for:
    held feeders, slots not ready, slots out of tokens, parked slots."""

    def __init__(
        self, pauses: PartitionPauses, *, geometry: WheelGeometry, layout: ShardLayout
    ) -> None:
        self._pauses = pauses
        self._geo = geometry
        self._level = layout.level
        self._index = layout.index
        self._lead_slot = layout.lead_slot
        self._feeders = layout.feeders
        self._ahead = layout.ahead
        self._slot = geometry.levels[0].width_ms
        # The containers are never replaced: the drainer reads them on its hot path.
        self.feeder_queue: list[tuple[int, int]] = []  # (blocker due - read-ahead, p)
        self.blocker: dict[int, int] = {}  # paused feeder -> offset of its blocker
        self.full: set[int] = set()  # feeders paused because the heap was full
        self.slot_queue: list[tuple[int, int]] = []  # (ready time, p), slots of level >= 1
        self.rate_paused: set[int] = set()  # slots waiting for tokens
        self._park_min = self._slot  # not parked for less than this
        self._next_park_ms = 0

    def fire_limits(
        self, now_ms: int, *, frontier: list[int], read_to: list[int]
    ) -> tuple[int, int | None]:
        """How far firing may go at ``now_ms``: not past a feeder not read that far
        (``frontier``: the due time each was read up to; ``read_to``: its next
        offset). And the earliest due time a reading feeder may still deliver
        within its read-ahead (None: none is reading)."""
        pauses = self._pauses
        paused, eof, ahead, slot = pauses.paused, pauses.eof, self._ahead, self._slot
        end_offset = pauses.source.end_offset
        limit: int | None = None
        fire_limit = now_ms
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
                if read_to[p] >= end_offset(p) >= 0:
                    # Read to its end, and the end event has not come yet (it can
                    # take a while when the fetch queue is full): nothing there.
                    eof.add(p)
                    continue
                fire_limit = at + ahead[p] + slot
            if limit is None or at + ahead[p] < limit:
                limit = at + ahead[p]
        return fire_limit, limit

    def hold(self, p: int, off: int, key: int) -> None:
        """Pause a feeder at its record ``off``, due past its read-ahead (its blocker),
        until ``key``; what it delivered after that record is kept."""
        self._pauses.hold(p, off + 1, key)
        self.blocker[p] = off
        heapq.heappush(self.feeder_queue, (key, p))

    def pause_slot(self, p: int, offset: int, ready_ms: int) -> None:
        """Stop a slot at its record ``offset``, not ready before ``ready_ms``."""
        self._pauses.pause(p, offset, ready_ms)
        heapq.heappush(self.slot_queue, (ready_ms, p))

    def wait_for_tokens(self, p: int, offset: int, ready_ms: int) -> None:
        """Stop a slot at its overdue record ``offset`` until the catch-up rate has a token."""
        self._pauses.pause(p, offset, ready_ms)
        self.rate_paused.add(p)

    def resume_due(
        self,
        drain_ms: int,
        now_ms: int,
        *,
        roomy: bool,
        bucket: TokenBucket,
        resume: Callable[[int, int], None],
    ) -> None:
        """``resume`` the partitions whose time came at drain clock ``drain_ms``:
        held feeders (one held because the heap was full only when it is ``roomy``),
        slots that are ready, slots out of tokens when there are tokens again."""
        paused = self._pauses.paused
        feeders = self.feeder_queue
        waiting = []
        while feeders and feeders[0][0] <= drain_ms:
            at, p = heapq.heappop(feeders)
            if paused.get(p) == at and p in self.blocker:
                if p in self.full and not roomy:
                    waiting.append((at, p))
                else:
                    resume(p, now_ms)
        for item in waiting:
            heapq.heappush(feeders, item)
        slots = self.slot_queue
        while slots and slots[0][0] <= drain_ms:
            at, p = heapq.heappop(slots)
            if paused.get(p) == at and p not in self.rate_paused:
                resume(p, now_ms)
        if self.rate_paused and bucket.available(now_ms) >= 1:
            for p in list(self.rate_paused):
                self.rate_paused.discard(p)
                if p in paused:
                    resume(p, now_ms)

    def park_idle(
        self, drain_ms: int, now_ms: int, *, read_to: list[int], replay: dict[int, Checkpoint]
    ) -> None:
        """Every :data:`PARK_PASS_MS`: pause every slot partition read to its end
        whose next visit is more than ``_park_min`` away, until it comes near
        (level 0: a slot before the feeder would be read anyway; level 1 up: when
        it opens). ``read_to`` and ``replay``: the drainer's read offsets and the
        feeders it re-reads after a takeover.

        A parked partition stays "at its end": nothing it can hold holds up
        firing. A record written into it against the placement rules (a producer
        clock far behind) is noticed by the drainer's ``wake_parked``.
        """
        if now_ms < self._next_park_ms:
            return
        self._next_park_ms = now_ms + PARK_PASS_MS
        pauses = self._pauses
        paused, level_of, index, geo = pauses.paused, self._level, self._index, self._geo
        eof_at = pauses.eof_at
        horizon = drain_ms + self._park_min
        for p in pauses.eof:
            level = level_of[p]
            if level < 0 or p in paused or p in replay:
                continue
            key = idle_until_ms(geometry=geo, level=level, index=index[p], drain_ms=drain_ms)
            if level == 0:
                key -= self._lead_slot[p]
            if key <= horizon:
                continue
            at = max(eof_at.get(p, 0), read_to[p])
            pauses.park(p, at, key)
            heapq.heappush(self.slot_queue, (key, p))

    def wake_parked(
        self, ends: dict[int, int], now_ms: int, *, resume: Callable[[int, int], None]
    ) -> int:
        """``resume`` the parked partitions whose end offset (``ends``) moved past
        where they stopped. Returns how many."""
        pauses = self._pauses
        woken = 0
        for p, end in ends.items():
            at = pauses.parked.get(p)
            if at is not None and end > at:
                pauses.eof.discard(p)  # records are on their way (or its next end is)
                resume(p, now_ms)
                woken += 1
        return woken

    def wake_ms(self, at: int, now_ms: int, *, steady: bool, bucket: TokenBucket) -> int:
        """``at``, or earlier when a paused partition may go on before: a queued
        resume (``steady``: the drain clock is the wall clock), or tokens for a slot."""
        if steady:
            if self.feeder_queue:
                at = min(at, max(self.feeder_queue[0][0], now_ms))
            if self.slot_queue:
                at = min(at, max(self.slot_queue[0][0], now_ms))
        if self.rate_paused:
            at = min(at, now_ms + max(1, bucket.wait(now_ms)))
        return at
