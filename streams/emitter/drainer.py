"""The wheel drainer: what the active emitter does with every timer record.

It applies the rules of :mod:`dueflow.drain` to the records the
:class:`~dueflow.streams.emitter.wheel_source.WheelSource` delivers, keeps the
heap of timers that fire soon, fires them through the
:class:`~dueflow.streams.emitter.outbox.Outbox`, pauses and resumes
partitions around the drain clock, and says which offsets (with their
checkpoints) the next transaction commits. It owns no client: the source,
the outbox and the clock readings are passed in.

The hot path (near and level-0 records) reads headers only and keeps the
original message for firing, so the value bytes are forwarded unchanged.
"""

from __future__ import annotations

import heapq
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.drain import (
    Checkpoint,
    OpenOffsets,
    TimerKey,
    TokenBucket,
    cascade_ready_ms,
    classify_timer,
    heap_horizon_ms,
    landed_late,
    latest_fired,
    next_drain_ms,
    read_ahead_ms,
)
from dueflow.logs import event
from dueflow.metrics import Metrics
from dueflow.streams.emitter.quarantine import quarantine_record, reason_label
from dueflow.topics import names
from dueflow.wheel import NEAR_LEVEL, place_timer

log = logging.getLogger("dueflow.emitter.drain")

_EOF = KafkaError._PARTITION_EOF
_FIRED = hdr.FIRED
_SOURCE = hdr.SOURCE


class PartitionControl(Protocol):
    def pause(self, partition: int, next_offset: int) -> None: ...
    def resume(self, partition: int) -> None: ...


class Sender(Protocol):
    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None: ...


class CronFiring(Protocol):
    """What the drainer calls for a due cron occurrence instead of forwarding it."""

    def fire_occurrence(self, message: Message, due_ms: int, now_ms: int) -> int:
        """Handle one occurrence; return how many jobs it fired."""
        ...


@dataclass(slots=True)
class _Replay:
    """A heap feeder re-read after a takeover, up to the previous emitter's read offset."""

    checkpoint: Checkpoint


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
    ) -> None:
        geo = settings.wheel
        self._geo = geo
        self._topic = names(settings).timers
        self._quarantine_topic = names(settings).quarantine
        self._source = source
        self._send = sender.send
        self._metrics = metrics
        self._cron = cron
        self._exec_topics = {q.encode(): names(settings).exec(q) for q in settings.queue_names}
        self._queue_of_topic = {t: q.decode() for q, t in self._exec_topics.items()}
        self._horizon = heap_horizon_ms(geo)
        self._lag = geo.levels[0].width_ms
        em = settings.emitter
        self._bucket = TokenBucket(
            rate_per_s=em.catchup_max_rate_per_s,
            burst=max(1.0, em.catchup_max_rate_per_s / 20.0),
            now_ms=now_ms,
        )

        n = geo.total_partitions
        self._level = [geo.locate(p)[0] for p in range(n)]
        self._index = [geo.locate(p)[1] for p in range(n)]
        self._feeders = [p for p in range(n) if self._level[p] <= 0]
        self._ahead = [read_ahead_ms(geo, lv) if lv <= 0 else 0 for lv in self._level]
        self._open = [OpenOffsets() if lv <= 0 else None for lv in self._level]
        self._read_to = [max(committed.get(p, (-1, None))[0], 0) for p in range(n)]
        self._last_append = [0] * n
        # Least due time any unread record of a feeder can have (records of a near
        # partition are due no earlier than written; a level-0 partition holds its
        # slots in rotation order). Timers due later wait until every feeder that
        # is still reading got that far, so a backlog fires in due order.
        self._frontier = [0] * n
        self._w0 = geo.levels[0].width_ms
        self.fire_limit_ms = -1
        self._replay: dict[int, _Replay] = {}
        checkpoints = []
        for p in self._feeders:
            offset, ck = committed.get(p, (-1, None))
            checkpoints.append(ck)
            if ck is not None and ck.read_to > max(offset, 0):
                self._replay[p] = _Replay(ck)
        self.fired: TimerKey | None = latest_fired(checkpoints)
        self.drain_ms = self.fired[0] if self.fired is not None else 0

        self._heap: list[tuple[int, int, int, Message, str, bool]] = []
        self._paused: dict[int, int] = {}  # partition -> resume at (drain clock)
        self._pause_queue: list[tuple[int, int]] = []
        self._rate_paused: set[int] = set()  # cascade sources waiting for tokens
        self._eof: set[int] = set()
        self._unheard = set(self._feeders)  # feeders with neither a record nor an end yet
        self._touched: set[int] = set()
        self._batch: dict[str, list[int]] = {}  # exec topic -> due times fired, this txn
        self._cron_fired = 0
        self.committed_offsets = {p: committed.get(p, (-1, None))[0] for p in range(n)}

    # ------------------------------------------------------------------ state
    @property
    def heap_size(self) -> int:
        return len(self._heap)

    @property
    def replaying(self) -> bool:
        return bool(self._replay)

    @property
    def touched(self) -> bool:
        return bool(self._touched)

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    # ------------------------------------------------------------------ reading
    def on_messages(self, messages: list[Message], now_ms: int) -> None:
        """Handle a batch of records (and partition-end events) from the source."""
        level_of = self._level
        read_to = self._read_to
        paused = self._paused
        classify = classify_timer
        exec_topics = self._exec_topics
        horizon = self._horizon
        heap = self._heap
        push = heapq.heappush
        opens = self._open
        ahead = self._ahead
        last_append = self._last_append
        touched = self._touched
        replay = self._replay
        unheard = self._unheard
        eof = self._eof
        frontier = self._frontier
        w0 = self._w0
        for m in messages:
            p: int = m.partition()  # type: ignore[assignment]
            if p in paused:
                continue  # fetched before the pause; read again on resume
            err = m.error()
            if err is not None:
                if err.code() == _EOF:
                    eof.add(p)
                    unheard.discard(p)
                    rp = replay.get(p)
                    if rp is not None and m.offset() >= rp.checkpoint.read_to:  # type: ignore[operator]
                        del replay[p]
                    continue
                event(log, "timer consumer error", logging.WARNING, error=str(err))
                continue
            off: int = m.offset()  # type: ignore[assignment]
            if off < read_to[p]:
                continue
            eof.discard(p)
            level = level_of[p]
            if level > 0:
                self._from_slot(m, p, off, level, now_ms)
                continue
            unheard.discard(p)
            ts = m.timestamp()[1]
            last_append[p] = ts
            rp = replay.get(p)
            if rp is not None and off + 1 >= rp.checkpoint.read_to:
                del replay[p]  # this is the last record the previous emitter read
                if off >= rp.checkpoint.read_to:
                    rp = None
            found = classify(m.headers(), m.key(), exec_topics)
            if isinstance(found, str):
                read_to[p] = off + 1
                if rp is None:
                    self._quarantine(m, p, off, found, now_ms)
                continue
            due, topic, cron = found
            frontier[p] = ts if level == NEAR_LEVEL else due - due % w0
            if due - ts > horizon:
                read_to[p] = off + 1
                if rp is None:
                    self._place_again(m, p, off, due, level, now_ms)
                continue
            read_to[p] = off + 1
            key = (due, p, off)
            if rp is not None:
                fired_then = rp.checkpoint.fired
                if fired_then is not None and key <= fired_then:
                    continue  # fired by the previous emitter
            fired = self.fired
            if fired is not None and key < fired:
                # Read after later timers fired (written overdue, or cascaded during a
                # catch-up): due already, fire it now so no commit leaves it behind.
                # It still spends a token: the rate limit holds on average.
                self._fire(m, p, off, due, topic, cron, now_ms)
                self._bucket.take(1)
                touched.add(p)
                continue
            opens[p].add(off)  # type: ignore[union-attr]
            push(heap, (due, p, off, m, topic, cron))
            if due > self.drain_ms + ahead[p] and rp is None:
                self._pause(p, off + 1, due - ahead[p])

    def _from_slot(self, m: Message, p: int, off: int, level: int, now_ms: int) -> None:
        """A record of a level >= 1 slot: handle it when ready, else stop the partition."""
        found = classify_timer(m.headers(), m.key(), self._exec_topics)
        if isinstance(found, str):
            self._quarantine(m, p, off, found, now_ms)
            self._read_to[p] = off + 1
            return
        due, topic, cron = found
        ts = m.timestamp()[1]
        ready = cascade_ready_ms(
            geometry=self._geo, level=level, index=self._index[p], due_ms=due, append_ms=ts
        )
        if ready > self.drain_ms:
            self._pause(p, off, ready)
            return
        if due <= now_ms:
            if self._bucket.available(now_ms) < 1:
                self._pause(p, off, ready)
                self._rate_paused.add(p)
                return
            self._bucket.take(1)
            if landed_late(geometry=self._geo, level=level, due_ms=due, append_ms=ts):
                self._metrics.late_timers.inc()
            self._fire(m, p, off, due, topic, cron, now_ms)
        else:
            placement = place_timer(
                due_ms=due, now_ms=now_ms, geometry=self._geo, spread=zlib.crc32(m.key() or b"")
            )
            if placement.partition == p:  # cannot happen for a ready record; never loop
                self._pause(p, off, ready + self._geo.levels[level].width_ms)
                return
            self._send(self._topic, m.value(), m.key(), m.headers(), placement.partition)
            self._metrics.cascaded.labels(str(level)).inc()
        self._read_to[p] = off + 1
        self._touched.add(p)

    def _place_again(self, m: Message, p: int, off: int, due: int, level: int, now_ms: int) -> None:
        placement = place_timer(
            due_ms=due, now_ms=now_ms, geometry=self._geo, spread=zlib.crc32(m.key() or b"")
        )
        self._send(self._topic, m.value(), m.key(), m.headers(), placement.partition)
        self._metrics.cascaded.labels("near" if level == NEAR_LEVEL else str(level)).inc()
        self._touched.add(p)

    def _quarantine(self, m: Message, p: int, off: int, reason: str, now_ms: int) -> None:
        value, headers = quarantine_record(
            reason=reason,
            topic=self._topic,
            partition=p,
            offset=off,
            key=m.key(),
            value=m.value(),
            headers=m.headers(),  # type: ignore[arg-type]
            at_ms=now_ms,
        )
        self._send(self._quarantine_topic, value, m.key(), headers)
        self._metrics.quarantined.labels("emitter", reason_label(reason)).inc()
        event(log, "timer quarantined", logging.WARNING, reason=reason, partition=p, offset=off)
        self._touched.add(p)

    def _pause(self, p: int, next_offset: int, resume_at_ms: int) -> None:
        self._source.pause(p, next_offset)
        self._paused[p] = resume_at_ms
        heapq.heappush(self._pause_queue, (resume_at_ms, p))
        self._eof.discard(p)

    # ------------------------------------------------------------------ firing
    def _fire(
        self, m: Message, p: int, off: int, due: int, topic: str, cron: bool, now_ms: int
    ) -> None:
        if cron and self._cron is not None:
            self._cron_fired += self._cron.fire_occurrence(m, due, now_ms)
            return
        headers: list[Any] = m.headers() or []  # type: ignore[assignment]
        headers.append((_FIRED, str(now_ms).encode()))
        headers.append((_SOURCE, f"{self._topic}:{p}:{off}".encode()))
        self._send(topic, m.value(), m.key(), headers)
        batch = self._batch.get(topic)
        if batch is None:
            batch = self._batch[topic] = []
        batch.append(due)

    def fire_due(self, now_ms: int) -> int:
        """Fire heap timers due at ``now_ms`` in key order, within the rate limit.

        Only up to :attr:`fire_limit_ms`, which :meth:`advance` computes: never
        past a feeder still reading records that may be due earlier.
        """
        heap = self._heap
        limit = min(now_ms, self.fire_limit_ms)
        if not heap or heap[0][0] > limit:
            return 0
        budget = self._bucket.available(now_ms)
        pop = heapq.heappop
        opens = self._open
        touched = self._touched
        fire = self._fire
        count = 0
        key: TimerKey | None = None
        while heap and heap[0][0] <= limit and count < budget:
            due, p, off, m, topic, cron = pop(heap)
            fire(m, p, off, due, topic, cron, now_ms)
            opens[p].finish(off)  # type: ignore[union-attr]
            touched.add(p)
            key = (due, p, off)
            count += 1
        if key is not None:
            self.fired = key
            self._bucket.take(count)
        return count

    # ------------------------------------------------------------------ clock
    def advance(self, now_ms: int) -> None:
        """Move the drain clock, resume the partitions whose time came, and set the
        fire limit (call before :meth:`fire_due`)."""
        heap = self._heap
        if self._unheard or self._replay:
            limit: int | None = self.drain_ms
            fire_limit = -1
        else:
            limit = None
            fire_limit = now_ms
            paused, eof, last, ahead = self._paused, self._eof, self._last_append, self._ahead
            frontier = self._frontier
            for p in self._feeders:
                if p not in paused and p not in eof:
                    bound = last[p] + ahead[p]
                    if limit is None or bound < limit:
                        limit = bound
                    if frontier[p] < fire_limit:
                        fire_limit = frontier[p]
        self.fire_limit_ms = fire_limit
        self.drain_ms = next_drain_ms(
            drain_ms=self.drain_ms,
            now_ms=now_ms,
            heap_top_due_ms=heap[0][0] if heap else None,
            lag_ms=self._lag,
            reading_limit_ms=limit,
        )
        queue = self._pause_queue
        while queue and queue[0][0] <= self.drain_ms:
            at, p = heapq.heappop(queue)
            if self._paused.get(p) == at and p not in self._rate_paused:
                self._resume(p)
        if self._rate_paused and self._bucket.available(now_ms) >= 1:
            for p in list(self._rate_paused):
                self._rate_paused.discard(p)
                if p in self._paused:
                    self._resume(p)

    def _resume(self, p: int) -> None:
        del self._paused[p]
        self._source.resume(p)
        if self._level[p] <= 0 and self._frontier[p] < self.fire_limit_ms:
            # Reading again: nothing beyond what it has read so far fires until it
            # catches up (its records after the pause may be due earlier).
            self.fire_limit_ms = self._frontier[p]

    def wake_ms(self, now_ms: int) -> int:
        """Wall-clock time the loop should look again at the latest."""
        at = now_ms + 50
        if self._heap:
            top = self._heap[0][0]
            if top > now_ms:
                at = min(at, top)
            elif top <= self.fire_limit_ms:
                at = min(at, now_ms + self._bucket.wait_ms(now_ms))
            else:  # a feeder is still reading: its records wake the loop
                at = min(at, now_ms + 5)
        if self._pause_queue and self.drain_ms >= now_ms - 1:
            at = min(at, max(self._pause_queue[0][0], now_ms))
        if self._rate_paused:
            at = min(at, now_ms + max(1, self._bucket.wait_ms(now_ms)))
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

    def on_committed(self, offsets: list[TopicPartition], done_ms: int) -> None:
        """The transaction with ``offsets`` committed at ``done_ms``: count and measure."""
        for tp in offsets:
            self.committed_offsets[tp.partition] = tp.offset
        self._touched.clear()
        metrics = self._metrics
        for topic, dues in self._batch.items():
            queue = self._queue_of_topic.get(topic, topic)
            metrics.fires.labels(queue).inc(len(dues))
            observe_lateness(metrics.fire_lateness.labels(queue).observe, dues, done_ms)
        self._batch.clear()
        self._cron_fired = 0

    def fired_in_transaction(self) -> int:
        """Jobs fired in the open transaction."""
        return sum(len(d) for d in self._batch.values()) + self._cron_fired


def observe_lateness(observe: Callable[[float], None], dues: list[int], done_ms: int) -> None:
    for due in dues:
        observe(max(0, done_ms - due) / 1000.0)
