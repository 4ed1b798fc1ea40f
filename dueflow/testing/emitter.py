"""The emitter over the in-memory log: due timers into exec topics, cron occurrences.

What the active emitter does with a timer record, minus the wheel (memory
has no partitions to page through): :func:`~dueflow.rules.drain.classify_timer`
reads its headers (a malformed one is quarantined with the reason), it
fires once due, never before, with ``df-fired`` and ``df-src``, its value
bytes unchanged, keyed into the exec topic of its queue. Cron schedules go
through the emitter's own :class:`~dueflow.streams.emitter.cron_keeper.CronKeeper`
and :class:`~dueflow.streams.emitter.schedule_table.ScheduleTable`: placement,
stale versions, pauses, deletions and misfire plans are theirs. Every timer
fires through the emitter's own :class:`~dueflow.streams.emitter.firing.Firing`
(with the broker's default record size limits: a timer whose exec record would
not fit is quarantined, ``record too large``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Message

from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records.cron_occurrence import CronState
from dueflow.rules.drain import classify_timer
from dueflow.streams.emitter.cron_keeper import CronKeeper
from dueflow.streams.emitter.firing import Firing
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.quarantine_records import quarantine_record
from dueflow.streams.emitter.schedule_table import ScheduleTable
from dueflow.testing.log import MemoryLog, MemoryRecord, as_message, as_messages


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A record the pipeline set aside, and why (the real processes write it to
    ``<prefix>.quarantine``)."""

    topic: str
    partition: int
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class PendingTimer:
    """A timer that has not fired: a one-shot job or the next occurrence of a schedule."""

    due_ms: int
    record: MemoryRecord
    exec_topic: str
    cron: bool
    partition: int = -1  # the exec partition (df-partition), -1: the key's


class MemoryEmitter:
    """The one active emitter of the in-memory pipeline."""

    def __init__(self, settings: Settings, log: MemoryLog, *, metrics: Metrics) -> None:
        self._log = log
        self._metrics = metrics
        # one-shot jobs and cron occurrences apart: "is a job left" is a peek
        self._jobs: list[tuple[int, int, PendingTimer]] = []
        self._cron: list[tuple[int, int, PendingTimer]] = []
        self._seq = itertools.count()
        self._read: dict[str, int] = {}  # topic -> records read
        self._lock = threading.RLock()  # a handler's thread may write a schedule
        self.quarantined: list[Quarantined] = []
        self.configure(settings, now_ms=0)

    def configure(self, settings: Settings, *, now_ms: int) -> None:
        """(Re)start with ``settings``, the way an emitter takes over: the schedules and
        the cron state come from the log, pending timers stay where they are."""
        self._settings = settings
        n = self._names = names(settings)
        self._exec_topics = {q.encode(): n.exec(q) for q in settings.queue_names}
        self._exec_partitions = {q.name.encode(): q.partitions for q in settings.queues}
        self._table = ScheduleTable(settings)
        self._table.apply(as_messages(self._log.records(n.schedules)))
        self._read[n.schedules] = len(self._log.records(n.schedules))
        state: dict[str, CronState] = {}
        for record in self._log.records(n.emitter_cron):
            decoded = CronState.decode(record.value())
            key = (record.key() or b"").decode("utf-8", "replace")
            if decoded is None:
                state.pop(key, None)
            else:
                state[key] = decoded
        self._keeper = CronKeeper(settings, self._metrics, self._table, self)
        self._keeper.start(state=state, quarantined_to={}, now_ms=now_ms)
        self._firing = Firing(
            sender=self,
            timer_topic=n.timers,
            partitions=self._log.partitions(n.timers),
            limits=EmitterLimits(settings, read=lambda topics: {}),
            metrics=self._metrics,
            quarantine=self._quarantine_timer,
            queue_of_topic={},
            cron=self._keeper,
        )

    # ------------------------------------------------------------ the Sender
    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None:
        """Write one record (the keeper's placements, state, quarantine; fired jobs)."""
        self._log.append(topic, key, value, headers, None if partition < 0 else partition)

    # ------------------------------------------------------------ reading
    def poll(self, now_ms: int) -> None:
        """Read what was written since the last poll: schedule changes and timers."""
        n = self._names
        with self._lock:
            changed = self._table.apply(as_messages(self._new(n.schedules)))
            for schedule_id in sorted(changed):
                self._keeper.reconcile(schedule_id, now_ms)
            for record in self._new(n.timers):
                self._take(record, now_ms)

    def _new(self, topic: str) -> list[MemoryRecord]:
        records = self._log.read(topic, self._read.get(topic, 0))
        self._read[topic] = self._read.get(topic, 0) + len(records)
        return records

    def _take(self, record: MemoryRecord, now_ms: int) -> None:
        found = classify_timer(
            record.headers(), record.key(), self._exec_topics, self._exec_partitions
        )
        if isinstance(found, str):
            self._quarantine(record, found, now_ms)
            return
        due, topic, cron, partition = found
        timer = PendingTimer(due, record, topic, cron, partition)
        heapq.heappush(self._cron if cron else self._jobs, (due, next(self._seq), timer))

    def _quarantine_timer(
        self, message: Message, partition: int, offset: int, reason: str, now_ms: int
    ) -> None:
        self._quarantine(cast(MemoryRecord, message), reason, now_ms)

    def _quarantine(self, record: MemoryRecord, reason: str, now_ms: int) -> None:
        quarantined = quarantine_record(
            reason=reason,
            topic=record.topic(),
            partition=record.partition(),
            offset=record.offset(),
            key=record.key(),
            value=record.value(),
            headers=list(record.headers()),
            at_ms=now_ms,
        )
        self._log.append(
            self._names.quarantine, quarantined.key, quarantined.value, quarantined.headers
        )
        self.quarantined.append(
            Quarantined(record.topic(), record.partition(), record.offset(), reason)
        )

    # ------------------------------------------------------------ firing
    def pending(self) -> list[PendingTimer]:
        """Timers not fired yet, by due time."""
        return [t for _, _, t in sorted(self._jobs + self._cron)]

    def next_due(self, *, jobs_only: bool = False) -> int | None:
        """The earliest due time of a pending timer (``jobs_only``: not counting cron
        occurrences), or None."""
        heads = [h[0][0] for h in ((self._jobs,) if jobs_only else (self._jobs, self._cron)) if h]
        return min(heads) if heads else None

    def fire_due(self, now_ms: int, *, eager: bool = False) -> int:
        """Fire every timer due at ``now_ms`` in due order (``eager``: every one-shot
        job too, whatever its due time); return how many fired."""
        fired = 0
        while True:
            self.poll(now_ms)
            with self._lock:
                timer = self._pop_due(now_ms, eager)
                if timer is None:
                    return fired
                self._fire(timer, now_ms)
            fired += 1

    def _pop_due(self, now_ms: int, eager: bool) -> PendingTimer | None:
        due = [h for h in (self._jobs, self._cron) if h and h[0][0] <= now_ms]
        if due:
            return heapq.heappop(min(due, key=lambda h: h[0][:2]))[2]
        if eager and self._jobs:
            return heapq.heappop(self._jobs)[2]
        return None

    def _fire(self, timer: PendingTimer, now_ms: int) -> None:
        record = timer.record
        fire = self._firing.at(now_ms)
        fire(
            as_message(record),
            record.partition(),
            record.offset(),
            timer.due_ms,
            timer.exec_topic,
            timer.cron,
            record.headers(),
            timer.partition,
        )
        self._firing.take_fired()  # fires are counted by the real emitter only
