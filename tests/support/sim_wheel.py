"""An in-memory timer topic and transaction log for driving the drainer without a broker.

``SimWheel`` plays the consumer (positions, pause with seek, resume, partition
ends, read_committed visibility) and the producer. Transactional (the
default): records written in a transaction become visible, and fired jobs
count, only when it commits; a crash discards them. ``acked``: every record
written is delivered some time later (:meth:`SimWheel.deliver`), the offsets
sealed at one moment are committed only once everything written before is
delivered (:meth:`SimWheel.seal`, :meth:`SimWheel.commit_acked`), and a crash
delivers or drops each record not delivered yet, at random. Time is whatever
the test says.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.rules.drain import Checkpoint
from dueflow.rules.wheel import place_timer
from dueflow.streams.emitter.drainer import WheelDrainer
from dueflow.streams.emitter.firing import CronFiring
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.target_queues import QueueTopics


@dataclass
class Stored:
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    append_ms: int


@dataclass
class FiredJob:
    key: bytes
    due_ms: int
    fired_ms: int
    partition: int = -1  # the exec partition it was sent to (-1: by key)
    topic: str = ""


@dataclass
class SimWheel:
    settings: Settings
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    per_partition: int = 4  # most records one consume() takes from a partition
    logs: dict[int, list[Stored]] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)
    eof_sent: set[int] = field(default_factory=set)
    committed: dict[int, tuple[int, Checkpoint | None]] = field(default_factory=dict)
    fired: list[FiredJob] = field(default_factory=list)  # committed fires
    quarantined: list[bytes] = field(default_factory=list)
    quarantine_reasons: list[str] = field(default_factory=list)  # as committed
    watch_ms: int = 200  # how often parked partitions' ends are looked at
    next_watch_ms: int = 0
    woken: int = 0  # parked partitions resumed because records landed there
    queues: QueueTopics | None = None  # the emitter's queues (default: the static ones)
    limits: EmitterLimits | None = None  # the topics' size limits (default: the broker's)
    acked: bool = False  # without transactions (see the module doc)
    now_ms: int = 0  # when a record is written (acked), as the test says
    _unacked: list[tuple[str, bytes | None, bytes | None, Any, int]] = field(default_factory=list)
    _delivered: int = 0  # records delivered so far (acked), in write order
    _sealed: tuple[list[TopicPartition], int] | None = None  # offsets, records written before
    cron: CronFiring | None = None  # who fires cron occurrences (default: fired as jobs)
    _pending_fires: list[FiredJob] = field(default_factory=list)
    _pending_timers: list[tuple[int, Stored]] = field(default_factory=list)
    _pending_quarantine: list[bytes] = field(default_factory=list)
    _pending_reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for p in range(self.settings.wheel.total_partitions):
            self.logs.setdefault(p, [])
        self.topic = names(self.settings).timers

    # ------------------------------------------------------------ producers
    def append(self, partition: int, record: Stored) -> int:
        self.logs[partition].append(record)
        self.eof_sent.discard(partition)
        return len(self.logs[partition]) - 1

    def schedule(
        self,
        key: str,
        due_ms: int,
        at_ms: int,
        *,
        queue: str = "default",
        extra: Sequence[tuple[str, str | int | bytes]] = (),
        value: bytes | None = None,
    ) -> int:
        """A producer writes a timer at ``at_ms`` (broker time), with ``extra`` headers
        (and ``value``, default ``value-<key>``)."""
        kb = key.encode()
        placement = place_timer(
            due_ms=due_ms, now_ms=at_ms, geometry=self.settings.wheel, spread=zlib.crc32(kb)
        )
        headers = hdr.encode([(hdr.DUE, due_ms), (hdr.QUEUE, queue), *extra])
        body = b"value-" + kb if value is None else value
        self.append(placement.partition, Stored(kb, body, headers, at_ms))
        return placement.partition

    # ------------------------------------------------------------ consumer
    def start_session(self) -> None:
        self.positions = {p: max(off, 0) for p, (off, _) in self.committed.items()}
        for p in self.logs:
            self.positions.setdefault(p, 0)
        self.paused.clear()
        self.eof_sent.clear()
        self._pending_fires.clear()
        self._pending_timers.clear()
        self._pending_quarantine.clear()
        self._pending_reasons.clear()

    def pause(self, partition: int, next_offset: int) -> None:
        self.paused.add(partition)
        self.positions[partition] = next_offset
        self.eof_sent.discard(partition)

    def hold(self, partition: int) -> None:
        self.paused.add(partition)
        self.eof_sent.discard(partition)

    def resume(self, partition: int) -> None:
        self.paused.discard(partition)

    def end_offset(self, partition: int) -> int:
        """As of the last "fetch": the end, or unknown (at random), as librdkafka's cache."""
        if self.rng.random() < 0.3:
            return -1
        return len(self.logs[partition])

    def consume(self, max_messages: int) -> list[Message]:
        """Up to ``max_messages`` from unpaused partitions, interleaved at random."""
        out: list[Message] = []
        live = [p for p in self.logs if p not in self.paused]
        self.rng.shuffle(live)
        for p in live:
            log = self.logs[p]
            take = self.rng.randint(1, self.per_partition)
            while take and self.positions[p] < len(log) and len(out) < max_messages:
                off = self.positions[p]
                r = log[off]
                out.append(
                    Message(
                        topic=self.topic,
                        partition=p,
                        offset=off,
                        key=r.key,
                        value=r.value,
                        headers=list(r.headers),
                        timestamp=(TIMESTAMP_LOG_APPEND_TIME, r.append_ms),
                    )
                )
                self.positions[p] = off + 1
                take -= 1
            if self.positions[p] >= len(log) and p not in self.eof_sent:
                self.eof_sent.add(p)
                out.append(
                    Message(
                        topic=self.topic,
                        partition=p,
                        offset=len(log),
                        error=KafkaError(KafkaError._PARTITION_EOF),
                    )
                )
        return out

    # ------------------------------------------------------------ producer side
    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None:
        if self.acked:
            self._unacked.append((topic, value, key, list(headers or []), partition))
            return
        if topic == self.topic:
            self._pending_timers.append((partition, Stored(key or b"", value or b"", headers, 0)))
        elif topic.endswith(".quarantine"):
            self._pending_quarantine.append(key or b"")
            self._pending_reasons.append(codec.decode("quarantined", value or b"")["reason"])
        else:
            due = hdr.header_int(headers, hdr.DUE)
            fired = hdr.header_int(headers, hdr.FIRED)
            assert due is not None
            assert fired is not None
            self._pending_fires.append(FiredJob(key or b"", due, fired, partition, topic))

    def commit(self, drainer: WheelDrainer, now_ms: int) -> None:
        sealed = drainer.seal()
        offsets: list[TopicPartition] = sealed.offsets
        for tp in offsets:
            self.committed[tp.partition] = (tp.offset, Checkpoint.decode(tp.metadata))
        for partition, stored in self._pending_timers:
            stored.append_ms = now_ms
            self.append(partition, stored)
        self.fired.extend(self._pending_fires)
        self.quarantined.extend(self._pending_quarantine)
        self.quarantine_reasons.extend(self._pending_reasons)
        self._pending_fires.clear()
        self._pending_timers.clear()
        self._pending_quarantine.clear()
        self._pending_reasons.clear()
        drainer.on_committed(sealed, now_ms)

    # ------------------------------------------------------------ acked
    def deliver(self, count: int | None = None) -> None:
        """The next ``count`` records written (all: None) reach the broker now."""
        todo = self._unacked[:] if count is None else self._unacked[:count]
        del self._unacked[: len(todo)]
        for topic, value, key, headers, partition in todo:
            self._delivered += 1
            if topic == self.topic:
                self.append(partition, Stored(key or b"", value or b"", headers, self.now_ms))
            elif topic.endswith(".quarantine"):
                self.quarantined.append(key or b"")
                self.quarantine_reasons.append(codec.decode("quarantined", value or b"")["reason"])
            else:
                due = hdr.header_int(headers, hdr.DUE)
                fired = hdr.header_int(headers, hdr.FIRED)
                assert due is not None
                assert fired is not None
                self.fired.append(FiredJob(key or b"", due, fired, partition, topic))

    def seal(self, drainer: WheelDrainer) -> None:
        """The offsets to commit once everything written so far is delivered."""
        if self._sealed is None:
            written = self._delivered + len(self._unacked)
            self._sealed = (drainer.seal().offsets, written)

    def commit_acked(self, drainer: WheelDrainer) -> bool:
        """Commit the sealed offsets if everything written before them is delivered."""
        if self._sealed is None or self._delivered < self._sealed[1]:
            return False
        offsets, _ = self._sealed
        for tp in offsets:
            self.committed[tp.partition] = (tp.offset, Checkpoint.decode(tp.metadata))
        drainer.confirm(offsets)
        self._sealed = None
        return True

    def crash(self) -> None:
        """The emitter dies: each record not delivered yet is delivered or lost."""
        keep = [w for w in self._unacked if self.rng.random() < 0.5]
        self._unacked = keep
        self.deliver()
        self._sealed = None

    def drainer(self, now_ms: int) -> WheelDrainer:
        """A new active period (a takeover): starts from the committed offsets."""
        self.start_session()
        return WheelDrainer(
            settings=self.settings,
            source=self,
            sender=self,
            metrics=Metrics(),
            committed=dict(self.committed),
            now_ms=now_ms,
            queues=self.queues,
            limits=self.limits,
            cron=self.cron,
        )

    def step(self, drainer: WheelDrainer, now_ms: int, max_messages: int = 50) -> None:
        drainer.on_messages(self.consume(max_messages), now_ms)
        drainer.advance(now_ms)
        drainer.fire_due(now_ms)
        if now_ms >= self.next_watch_ms:  # the emitter's EndWatch
            self.next_watch_ms = now_ms + self.watch_ms
            self.woken += drainer.wake_parked(
                {p: len(self.logs[p]) for p in drainer.parked}, now_ms
            )
