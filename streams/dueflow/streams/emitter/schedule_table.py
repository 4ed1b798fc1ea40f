"""The schedules table: every cron schedule, read from the compacted schedules topic.

Active and standby emitters both keep it current (a standby is hot: on
takeover the table is there), and with it the cron state (which version of
each schedule has its occurrence in the wheel, ``<prefix>.emitter.cron``),
which an emitter that takes over reads to its end once the old one is fenced
(:meth:`ScheduleTable.sync_cron_state`). It reads every partition from the beginning,
decodes each value (Avro ``Schedule``; the writer's version from the
``df-schema`` header), and keeps the latest of each schedule id; a tombstone
(null value) deletes it. A record that cannot be a schedule (undecodable,
invalid, key and id differ, unknown queue) is remembered with the reason; the
active emitter quarantines it (:mod:`dueflow.streams.emitter.cron_keeper`).
Not the hot path: a schedule changes rarely.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import Settings
from dueflow.errors import DueflowError, KafkaOperationError
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.records import codec
from dueflow.records.cron_occurrence import CronState
from dueflow.rules.cron import CronSchedule

log = logging.getLogger("dueflow.emitter.schedules")

MAX_REMEMBERED_BAD = 1_000


@dataclass(frozen=True, slots=True)
class BadSchedule:
    """A schedules-topic record that is no schedule, and why."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    reason: str


class ScheduleTable:
    """``schedule_id -> CronSchedule``, current with the schedules topic."""

    def __init__(
        self, settings: Settings, *, known_queue: Callable[[str], bool] | None = None
    ) -> None:
        self._settings = settings
        # Whether a schedule's queue exists (the emitter's registry-aware check).
        static = set(settings.queue_names)
        self._known_queue = known_queue or static.__contains__
        self._topic = names(settings).schedules
        self._cron_topic = names(settings).emitter_cron
        self.cron_state: dict[str, CronState] = {}
        self._unreported: set[str] = set()  # changed while reading the cron state
        self._cron_ended = False
        self._consumer: Consumer | None = None
        self._schedules: dict[str, CronSchedule] = {}
        self._ended: set[int] = set()
        self.positions: dict[int, int] = {}  # partition -> next offset to read
        self.bad: list[BadSchedule] = []

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def caught_up(self) -> bool:
        """True once every partition was read to its end at least once."""
        return len(self._ended) >= self._settings.schedules_partitions

    def get(self, schedule_id: str) -> CronSchedule | None:
        return self._schedules.get(schedule_id)

    def ids(self) -> list[str]:
        return list(self._schedules)

    def start(self) -> None:
        self._consumer = make_consumer(
            self._settings,
            names(self._settings).emitter_offsets_group,  # never commits with it
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 50},
        )
        self._consumer.assign(
            [
                TopicPartition(self._topic, p, OFFSET_BEGINNING)
                for p in range(self._settings.schedules_partitions)
            ]
            + [TopicPartition(self._cron_topic, 0, OFFSET_BEGINNING)]
        )

    def sync_cron_state(self, timeout_s: float = 60.0) -> dict[str, CronState]:
        """The cron state, read to its current end (call once older emitters are fenced:
        then every transaction that wrote it has completed)."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        tp = TopicPartition(self._cron_topic, 0)
        (pos,) = consumer.position([tp])
        # Seek to where it is: the end is reported again when it gets there.
        consumer.seek(
            TopicPartition(self._cron_topic, 0, pos.offset if pos.offset >= 0 else OFFSET_BEGINNING)
        )
        self._cron_ended = False
        deadline = time.monotonic() + timeout_s
        while not self._cron_ended:
            if time.monotonic() > deadline:
                raise KafkaOperationError(f"{self._cron_topic} could not be read to its end")
            # Schedules read meanwhile are reported by the next poll (other shards
            # driven by this process must hear of them).
            self._unreported |= self._read(0.05)
        return dict(self.cron_state)

    def poll(self, timeout_s: float = 0.0) -> set[str]:
        """Read what arrived; return the ids of schedules that changed (or went away)."""
        changed = self._read(timeout_s)
        if self._unreported:
            changed |= self._unreported
            self._unreported = set()
        return changed

    def _read(self, timeout_s: float) -> set[str]:
        if self._consumer is None:
            return set()
        first = self._consumer.poll(timeout_s)
        if first is None:
            return set()
        return self.apply([first, *self._consumer.consume(500, 0)])

    def apply(self, messages: Iterable[Message]) -> set[str]:
        """Apply records of the schedules (or cron state) topic read by any reader;
        return the ids of schedules that changed. ``poll`` feeds its consumer's here;
        the in-memory pipeline of :mod:`dueflow.testing` feeds its log's."""
        changed: set[str] = set()
        for m in messages:
            self._apply(m, changed)
        return changed

    def _apply(self, m: Message, changed: set[str]) -> None:
        p: int = m.partition()  # type: ignore[assignment]
        off: int = m.offset()  # type: ignore[assignment]
        err = m.error()
        if m.topic() == self._cron_topic:
            self._apply_cron(m)
            return
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._ended.add(p)
            else:
                event(log, "schedules consumer error", logging.WARNING, error=str(err))
            return
        self.positions[p] = off + 1
        headers: list[tuple[str, bytes | None]] | None = m.headers()  # type: ignore[assignment]
        key = m.key()
        try:
            schedule_id = (key or b"").decode("utf-8")
        except UnicodeDecodeError:
            self._remember(m, headers, reasons.SCHEDULE_KEY_NOT_UTF8)
            return
        if not schedule_id:
            self._remember(m, headers, reasons.MISSING_SCHEDULE_KEY)
            return
        value = m.value()
        if value is None:
            if self._schedules.pop(schedule_id, None) is not None:
                changed.add(schedule_id)
            return
        try:
            version = codec.parse_schema_header(
                hdr.header(headers, hdr.SCHEMA), expected="schedule"
            )
            schedule = CronSchedule.from_record(
                codec.decode("schedule", value, writer_version=version)
            )
        except DueflowError as exc:
            self._remember(m, headers, reasons.with_detail(reasons.UNDECODABLE_SCHEDULE, exc))
            return
        if schedule.schedule_id != schedule_id:
            detail = f"key {schedule_id!r}, schedule id {schedule.schedule_id!r}"
            self._remember(m, headers, reasons.with_detail(reasons.SCHEDULE_KEY_MISMATCH, detail))
            return
        if not self._known_queue(schedule.queue):
            self._remember(
                m, headers, reasons.with_detail(reasons.UNKNOWN_QUEUE, repr(schedule.queue))
            )
            return
        current = self._schedules.get(schedule_id)
        if current is not None and current.version >= schedule.version:
            return  # an older version written late: the newer one stays
        self._schedules[schedule_id] = schedule
        changed.add(schedule_id)

    def _apply_cron(self, m: Message) -> None:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._cron_ended = True
            return
        key = (m.key() or b"").decode("utf-8", "replace")
        state = CronState.decode(m.value())
        if state is None:
            self.cron_state.pop(key, None)
        else:
            self.cron_state[key] = state

    def _remember(
        self, m: Message, headers: list[tuple[str, bytes | None]] | None, reason: str
    ) -> None:
        event(log, "bad schedule record", logging.WARNING, reason=reason, offset=m.offset())
        if len(self.bad) < MAX_REMEMBERED_BAD:
            self.bad.append(
                BadSchedule(
                    m.partition() or 0, m.offset() or 0, m.key(), m.value(), headers, reason
                )
            )

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def read_cron_state(settings: Settings, timeout_s: float = 60.0) -> dict[str, CronState]:
    """The cron state topic read to its end by a consumer of its own (a shard
    taking over while this process drives others reads it off the loop's
    thread; call once the shard's older emitters are fenced)."""
    topic = names(settings).emitter_cron
    consumer = make_consumer(
        settings,
        names(settings).emitter_offsets_group,  # never commits with it
        **{"enable.partition.eof": True, "fetch.wait.max.ms": 10},
    )
    state: dict[str, CronState] = {}
    try:
        # Offset 0, not OFFSET_BEGINNING: an explicit offset spares a new client's
        # offset query (half a second); compaction never moves the log start, and
        # a deleted start falls back to the earliest (auto.offset.reset).
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise KafkaOperationError(f"{topic} could not be read to its end")
            for m in consumer.consume(1_000, 0.05):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return state
                    continue
                key = (m.key() or b"").decode("utf-8", "replace")
                found = CronState.decode(m.value())
                if found is None:
                    state.pop(key, None)
                else:
                    state[key] = found
    finally:
        consumer.close()
