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
"""

from __future__ import annotations

import heapq
import logging
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics, observe_ages
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
    read_ahead_ms,
)
from dueflow.rules.due_queue import DueQueue
from dueflow.rules.open_offsets import OpenOffsets
from dueflow.rules.token_bucket import TokenBucket
from dueflow.rules.wheel import NEAR_LEVEL, place_timer
from dueflow.streams.emitter.quarantine import quarantine_record
from dueflow.streams.emitter.queues import QueueTopics

log = logging.getLogger("dueflow.emitter.drain")

_EOF = KafkaError._PARTITION_EOF
PARK_PASS_MS = 100  # how often partitions read to their end are looked at for parking
_FIRED = hdr.FIRED
_SOURCE = hdr.SOURCE

# A timer in the queue, under its due time: (partition, offset, message, exec topic,
# is cron, headers, exec partition or -1: by key).
Entry = tuple[int, int, Message, str, bool, list[Any], int]


@dataclass(frozen=True, slots=True)
class SealedCommit:
    """A transaction handed over to commit: its timer offsets (with checkpoints)
    and the due times it fired, per exec topic."""

    offsets: list[TopicPartition]
    fired: dict[str, list[int]]


class PartitionControl(Protocol):
    def pause(self, partition: int, next_offset: int) -> None:
        """Stop fetching; continue at ``next_offset`` on resume."""

    def hold(self, partition: int) -> None:
        """Stop fetching; continue after the last record delivered on resume."""

    def resume(self, partition: int) -> None: ...

    def end_offset(self, partition: int) -> int:
        """The partition's end offset as of the last fetch (no request); -1: unknown."""


class Sender(Protocol):
    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None: ...


class Emit(Protocol):
    """Fire one job into its exec topic in the open transaction (adds df-fired and
    counts the fire); ``partition`` -1: the key's (Kafka's partitioner)."""

    def __call__(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[Any],
        due: int,
        partition: int = -1,
    ) -> None: ...


class CronFiring(Protocol):
    """What the drainer calls for a due cron occurrence instead of forwarding it."""

    def fire_occurrence(
        self,
        message: Message,
        due_ms: int,
        topic: str,
        headers: list[Any],
        now_ms: int,
        emit: Emit,
    ) -> None:
        """Handle one occurrence in the open transaction, firing through ``emit``."""


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
    ) -> None:
        geo = settings.wheel  # this shard's (WheelGeometry.of_shard)
        em = settings.emitter
        ours = geo.partitions
        # Per-partition lists are indexed by partition: this shard's are
        # ours.start .. n-1 (the entries below are never used).
        n = ours.stop
        self._geo = geo
        self._topic = names(settings).timers
        self._quarantine_topic = names(settings).quarantine
        self._source = source
        self._send = sender.send
        self._metrics = metrics
        self._cron = cron
        # Off unless OTEL_TRACES_EXPORTER says otherwise: then every fire is a span.
        self._tracer = tracer if tracer is not None and tracer.enabled else None
        # Kept current by the emitter as queues are registered (shared dicts).
        self._queues = queues if queues is not None else QueueTopics(settings)
        self._exec_topics = self._queues.exec_topics
        self._exec_partitions = self._queues.exec_partitions
        self._queue_of_topic = self._queues.queue_of_topic
        self._horizon = heap_horizon_ms(geo)
        self._slot = geo.levels[0].width_ms  # lag of the drain clock, pause hysteresis
        self._budget = em.heap_budget
        self._bucket = TokenBucket(
            em.catchup_max_rate_per_s / 1000.0,  # per ms
            capacity=max(1.0, em.catchup_max_rate_per_s / 20.0),
            now=now_ms,
        )

        self._level = [geo.locate(p)[0] for p in range(n)]
        self._index = [geo.locate(p)[1] for p in range(n)]
        self._feeders = [p for p in ours if self._level[p] <= 0]
        self._ahead = [read_ahead_ms(geo, lv) if lv <= 0 else 0 for lv in self._level]
        # Flow control reads a level-0 feeder one slot further ahead than firing
        # needs: while a backlog drains, the drain clock moves many seconds per
        # second, and a feeder resumed only just in time would stop firing until
        # its first fetch comes back.
        self._lead = [
            a + self._slot if lv == 0 else a for a, lv in zip(self._ahead, self._level, strict=True)
        ]
        self._lead_slot = [a + self._slot for a in self._lead]  # a feeder pauses past this
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
        self.drain_ms = self.fired[0] if self.fired is not None else 0
        self._unheard = set(self._feeders)  # feeders with neither a record nor an end yet

        self._queue = DueQueue()
        self._paused: dict[int, int] = {}  # partition -> resume key
        self._feeder_queue: list[tuple[int, int]] = []  # (blocker due - read-ahead, p)
        self._blocker: dict[int, int] = {}  # paused feeder -> offset of its blocker
        self._full: set[int] = set()  # feeders paused because the heap was full
        self._slot_queue: list[tuple[int, int]] = []  # (ready time, p), slots of level >= 1
        self._rate_paused: set[int] = set()  # slots waiting for tokens
        # Records a feeder delivered past the one that paused it (kept, up to a cap,
        # so a resume needs no fetch) and the offset the next one must have.
        self._stash: dict[int, list[Message]] = {}
        self._stash_next: dict[int, int] = {}
        self._stashed = 0
        self._stash_cap = max(1, em.heap_budget // 2)
        self._eof: set[int] = set()
        self._eof_at: dict[int, int] = {}  # partition -> offset of its last end event
        # Parked: slot partitions read to their end and paused until their next
        # visit comes near (see _park_idle), so a fetch asks only for the
        # partitions that can hold a record needed soon: at 5k timers/s every
        # fetch used to carry all 260 partitions of the default wheel, and the
        # broker read each of them ~150 times a second. Offset: where it goes on.
        self._parked: dict[int, int] = {}
        self._park_min = self._slot  # not parked for less than this
        self._next_park_ms = 0
        self._touched: set[int] = set()
        # df-source value of a record: self._sources[p] % offset.
        self._sources = [
            f"{self._topic}:{p}:".encode().replace(b"%", b"%%") + b"%d" for p in range(n)
        ]
        self._batch: dict[str, list[int]] = {}  # exec topic -> due times fired, this txn

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
        level_of = self._level
        read_to = self._read_to
        paused = self._paused
        classify = classify_timer
        exec_topics = self._exec_topics
        exec_partitions = self._exec_partitions
        horizon = self._horizon
        push = self._queue.push
        opens = self._open
        lead = self._lead
        touched = self._touched
        replay = self._replay
        unheard = self._unheard
        eof = self._eof
        frontier = self._frontier
        budget = self._budget
        drain = self.drain_ms  # not moved while records are read
        lead_slot = self._lead_slot
        # The last fired key (it does not change while records are read), due first:
        # most records are due after it and cost one comparison.
        fired = self.fired
        fired_due = fired[0] if fired is not None else -1
        fired_at = fired[1:] if fired is not None else (-1, -1)
        at_once = 0
        # Firing as read (below) without a call, unless traced or a cron occurrence.
        plain = self._tracer is None
        has_cron = self._cron is not None
        send = self._send
        sources = self._sources
        batches = self._batch
        fire_pair: tuple[str, bytes] | None = None  # (df-fired, now), made once
        for m in messages:
            p: int = m.partition()  # type: ignore[assignment]
            if p in paused:
                self._keep(p, m)  # delivered after the pause: kept, or fetched again
                continue
            err = m.error()
            if err is not None:
                if err.code() == _EOF:
                    eof.add(p)
                    self._eof_at[p] = m.offset()  # type: ignore[assignment]
                    unheard.discard(p)
                    ck = replay.get(p)
                    if ck is not None and m.offset() >= ck.read_to:  # type: ignore[operator]
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
                    self._place_again(m, p, due, level, now_ms)
                continue
            if ck is not None and ck.fired is not None and (due, p, off) <= ck.fired:
                continue  # fired by the previous emitter
            if due <= fired_due and (due < fired_due or (p, off) < fired_at):
                # Read after later timers fired (written overdue, or placed again
                # during a catch-up): due already, fire it now so no commit leaves it
                # behind. It still spends a token: the rate limit holds on average.
                if plain and not (cron and has_cron):  # what _fire does, inline
                    if fire_pair is None:
                        fire_pair = (_FIRED, str(now_ms).encode())
                    headers.append(fire_pair)
                    headers.append((_SOURCE, sources[p] % off))
                    send(topic, m.value(), m.key(), headers, target)
                    fired_here = batches.get(topic)
                    if fired_here is None:
                        fired_here = batches[topic] = []
                    fired_here.append(due)
                else:
                    self._fire(m, p, off, due, topic, cron, headers, now_ms, target)
                at_once += 1
                touched.add(p)
                continue
            opens[p].add(off)  # type: ignore[union-attr]
            held = push(due, (p, off, m, topic, cron, headers, target))
            if ck is None and (held >= budget or (level == 0 and due > drain + lead_slot[p])):
                self._hold(p, off + 1, due - lead[p])
                self._blocker[p] = off
                heapq.heappush(self._feeder_queue, (due - lead[p], p))
                if held >= budget:
                    self._full.add(p)
        if at_once:
            self._bucket.take(at_once)

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
            self._fire(m, p, off, due, topic, cron, m.headers(), now_ms, target)  # type: ignore[arg-type]
        else:
            placement = place_timer(
                due_ms=due, now_ms=now_ms, geometry=self._geo, spread=zlib.crc32(m.key() or b"")
            )
            if placement.partition == p:  # cannot happen for a ready record; never loop
                self._pause_slot(p, off, ready + self._geo.levels[level].width_ms)
                return
            self._send(self._topic, m.value(), m.key(), m.headers(), placement.partition)
            self._metrics.cascaded.labels(str(level)).inc()
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

    def _place_again(self, m: Message, p: int, due: int, level: int, now_ms: int) -> None:
        """A heap feeder's record due too far from when it was written (a producer
        clock far ahead): put it where it belongs now."""
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

    def _pause(self, p: int, next_offset: int, key: int) -> None:
        self._source.pause(p, next_offset)
        self._paused[p] = key
        self._eof.discard(p)

    def _hold(self, p: int, next_offset: int, key: int) -> None:
        """Pause a feeder but keep what it already delivered (see :meth:`_keep`)."""
        self._source.hold(p)
        self._paused[p] = key
        self._eof.discard(p)
        self._stash[p] = []
        self._stash_next[p] = next_offset

    def _keep(self, p: int, m: Message) -> None:
        stash = self._stash.get(p)
        if stash is None or m.error() is not None:
            return  # a slot's records are read again on resume; ends are reported again
        off: int = m.offset()  # type: ignore[assignment]
        nxt = self._stash_next[p]
        if off < nxt:
            return
        if nxt >= 0 and self._stashed < self._stash_cap:
            stash.append(m)
            self._stashed += 1
            self._stash_next[p] = off + 1
        elif nxt >= 0:  # too much kept already: fetch the rest again on resume
            self._source.pause(p, nxt)
            self._stash_next[p] = -1

    def _pause_slot(self, p: int, offset: int, ready_ms: int) -> None:
        self._pause(p, offset, ready_ms)
        heapq.heappush(self._slot_queue, (ready_ms, p))

    def _resume(self, p: int, now_ms: int) -> None:
        del self._paused[p]
        self._parked.pop(p, None)
        self._full.discard(p)
        self._blocker.pop(p, None)
        self._stash_next.pop(p, None)
        stash = self._stash.pop(p, None)
        if stash:
            self._stashed -= len(stash)
            self.on_messages(stash, now_ms)  # may pause it again, keeping the rest
        if p not in self._paused:
            self._source.resume(p)

    # ------------------------------------------------------------------ firing
    def _fire(
        self,
        m: Message,
        p: int,
        off: int,
        due: int,
        topic: str,
        cron: bool,
        headers: list[Any] | None,
        now_ms: int,
        target: int = -1,
    ) -> None:
        """Fire one timer into ``topic`` (partition ``target``; -1: by its key)."""
        headers = headers if headers is not None else []
        if cron and self._cron is not None:
            self._cron.fire_occurrence(m, due, topic, headers, now_ms, self._emitter(now_ms))
            return
        hdr.fired(headers, fired_at=str(now_ms).encode(), source=self._sources[p] % off)
        if self._tracer is not None:
            step = self._tracer.span_for_fire(
                headers,
                job_id=(m.key() or b"").decode("utf-8", "replace"),
                queue=self._queue_of_topic.get(topic),
                lateness_ms=now_ms - due,
            )
            headers = hdr.replace(headers, step.headers)
            step.end()
        self._send(topic, m.value(), m.key(), headers, target)
        batch = self._batch.get(topic)
        if batch is None:
            batch = self._batch[topic] = []
        batch.append(due)

    def _emitter(self, now_ms: int) -> Emit:
        fired_at = str(now_ms).encode()

        def emit(
            topic: str,
            value: bytes | None,
            key: bytes | None,
            headers: list[Any],
            due: int,
            partition: int = -1,
        ) -> None:
            hdr.fired(headers, fired_at=fired_at)
            if self._tracer is not None:
                step = self._tracer.span_for_fire(
                    headers,
                    job_id=(key or b"").decode("utf-8", "replace"),
                    queue=self._queue_of_topic.get(topic),
                    lateness_ms=now_ms - due,
                )
                headers = hdr.replace(headers, step.headers)
                step.end()
            self._send(topic, value, key, headers, partition)
            self._batch.setdefault(topic, []).append(due)

        return emit

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
        send = self._send
        batches = self._batch
        sources = self._sources
        fire_pair = (_FIRED, str(now_ms).encode())
        traced = self._tracer is not None
        cron_keeper = self._cron
        count = 0
        last: TimerKey | None = None
        while count < budget:
            got = queue.pop_bucket(limit)
            if got is None:
                break
            due, entries = got
            fired_here: list[int] | None = None
            n = 0
            for p, off, m, topic, cron, headers, target in entries:
                if count >= budget:
                    break
                if traced:
                    self._fire(m, p, off, due, topic, cron, headers, now_ms, target)
                elif cron and cron_keeper is not None:
                    cron_keeper.fire_occurrence(
                        m, due, topic, headers, now_ms, self._emitter(now_ms)
                    )
                else:
                    headers.append(fire_pair)
                    headers.append((_SOURCE, sources[p] % off))
                    send(topic, m.value(), m.key(), headers, target)
                    fired_here = batches.get(topic)
                    if fired_here is None:
                        fired_here = batches[topic] = []
                    fired_here.append(due)
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
        parked, eof_at, read_to, replay = self._parked, self._eof_at, self._read_to, self._replay
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
            self._source.pause(p, at)
            paused[p] = key
            parked[p] = at
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
        sealed = SealedCommit(self.commit_offsets(), self._batch)
        self._touched.clear()
        self._batch = {}
        return sealed

    def on_committed(self, sealed: SealedCommit, done_ms: int) -> None:
        """The transaction :meth:`seal` described committed at ``done_ms``: count
        and measure.

        Lateness is measured here, at commit: a fired job is visible to workers
        (read_committed) only from now on.
        """
        for tp in sealed.offsets:
            self.committed_offsets[tp.partition] = tp.offset
        metrics = self._metrics
        for topic, dues in sealed.fired.items():
            queue = self._queue_of_topic.get(topic, topic)
            metrics.fires.labels(queue).inc(len(dues))
            observe_ages(metrics.fire_lateness.labels(queue), done_ms, dues)
