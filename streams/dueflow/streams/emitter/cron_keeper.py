"""The active emitter's cron keeper: one next occurrence of every schedule in the wheel.

On activation it reads the cron state topic to its end (which version of each
schedule has its occurrence in the wheel), places an occurrence for every
schedule whose version is not there yet, and quarantines the bad schedule
records no earlier emitter quarantined. While active it does the same for
each schedule that changes, and, when an occurrence comes due, drops it
(stale version, deleted, paused) or fires what the misfire plan says and
places the next occurrence. Every write goes into the emitter's open
transaction, so placement, firing and state commit together.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.reasons import reason_label
from dueflow.records import codec
from dueflow.records.cron_occurrence import (
    CronState,
    Verdict,
    occurrence_headers,
    occurrence_job,
    occurrence_timer,
    occurrence_verdict,
    placement_needed,
)
from dueflow.rules.cron import CronSchedule, misfire_plan
from dueflow.rules.cron_overlap import exec_partition
from dueflow.rules.wheel import place_timer, shard_for
from dueflow.streams.emitter.firing import Emit, Sender
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.streams.emitter.quarantine_records import count_cut, quarantine_record
from dueflow.streams.emitter.schedule_table import ScheduleTable

log = logging.getLogger("dueflow.emitter.cron")


class CronKeeper:
    """Places, fires and drops cron occurrences for the active emitter."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        table: ScheduleTable,
        sender: Sender,
        *,
        partitions: Mapping[bytes, int] | None = None,
        limits: EmitterLimits | None = None,
    ) -> None:
        self._settings = settings
        self._limits = limits
        self._metrics = metrics
        self._table = table
        self._send = sender.send
        self._names = names(settings)
        self._state: dict[str, CronState] = {}
        # queue -> exec partitions (the emitter's live map: static and registered queues)
        self._partitions = (
            partitions
            if partitions is not None
            else {q.name.encode(): q.partitions for q in settings.queues}
        )
        self._quarantined_to: dict[int, int] = {}
        self._dirty_offsets = False
        # Each shard's emitter keeps the schedules whose id hashes to its shard; the
        # bad schedule records are quarantined by shard 0's alone.
        geo = settings.wheel
        self._shard, self._shards = geo.shard, geo.shards
        self._geometry = geo

    def owns(self, schedule_id: str) -> bool:
        """True when this shard keeps ``schedule_id`` (:func:`shard_for` of its id)."""
        return self._shards == 1 or self.owner(schedule_id) == self._shard

    def owner(self, schedule_id: str) -> int:
        return shard_for(zlib.crc32(schedule_id.encode()), self._shards)

    # ------------------------------------------------------------ activation
    def start(
        self, *, state: dict[str, CronState], quarantined_to: dict[int, int], now_ms: int
    ) -> None:
        """Take over: known state, schedules offsets already quarantined up to."""
        self._state = {k: v for k, v in state.items() if self.owns(k)}
        self._quarantined_to = dict(quarantined_to)
        self.quarantine_bad(now_ms)
        for schedule_id in sorted(set(self._table.ids()) | set(self._state)):
            self.reconcile(schedule_id, now_ms)

    def quarantine_bad(self, now_ms: int) -> None:
        """Quarantine remembered bad schedule records no emitter quarantined yet
        (shard 0's emitter does: once, whatever the shards)."""
        if self._shard != 0:
            return
        bad, self._table.bad = self._table.bad, []
        for b in bad:
            if b.offset < self._quarantined_to.get(b.partition, 0):
                continue
            record = quarantine_record(
                reason=b.reason,
                topic=self._table.topic,
                partition=b.partition,
                offset=b.offset,
                key=b.key,
                value=b.value,
                headers=b.headers,
                at_ms=now_ms,
                limit=None if self._limits is None else self._limits.quarantine,
            )
            self._send(self._names.quarantine, record.value, record.key, record.headers)
            count_cut(self._metrics, record)
            self._metrics.quarantined.labels("emitter", reason_label(b.reason)).inc()
            self._quarantined_to[b.partition] = b.offset + 1
            self._dirty_offsets = True

    def commit_offsets(self) -> list[TopicPartition]:
        """Schedules offsets quarantined up to (committed with the quarantine records)."""
        if not self._dirty_offsets:
            return []
        self._dirty_offsets = False
        return [TopicPartition(self._table.topic, p, o) for p, o in self._quarantined_to.items()]

    # ------------------------------------------------------------ changes
    def reconcile(self, schedule_id: str, now_ms: int) -> None:
        """Bring the wheel in line with the table for one schedule (of this shard)."""
        if not self.owns(schedule_id):
            return
        schedule = self._table.get(schedule_id)
        state = self._state.get(schedule_id)
        if schedule is None:
            if state is not None:  # deleted: its occurrence is dropped when due
                del self._state[schedule_id]
                self._send(self._names.emitter_cron, None, schedule_id.encode(), None)
            return
        new = placement_needed(schedule, state, now_ms=now_ms)
        if new is None:
            return
        if new.next_ms is not None:
            self._place(schedule, new.next_ms, now_ms)
        self._write_state(schedule_id, new)
        event(
            log,
            "schedule placed",
            schedule_id=schedule_id,
            version=schedule.version,
            next_ms=new.next_ms,
            paused=schedule.paused,
        )

    def _place(self, schedule: CronSchedule, occurrence_ms: int, now_ms: int) -> None:
        rec = occurrence_timer(
            schedule, occurrence_ms, now_ms=now_ms, geometry=self._settings.wheel
        )
        self._send(self._names.timers, rec.value, rec.key, rec.headers, rec.partition)

    def _forward(
        self, message: Message, schedule_id: str, due_ms: int, headers: list[Any], now_ms: int
    ) -> None:
        """An occurrence of a schedule another shard keeps (placed before the shards
        grew): moved, unchanged, into that shard's wheel, whose emitter fires it
        and places the next one. Its state record says it is in the wheel, so
        nobody places it twice."""
        owner = self._geometry.of_shard(self.owner(schedule_id))
        key = message.key() or b""
        placement = place_timer(
            due_ms=due_ms, now_ms=now_ms, geometry=owner, spread=zlib.crc32(key)
        )
        self._send(self._names.timers, message.value(), key, headers, placement.partition)
        self._metrics.cron_occurrences.labels("moved").inc()
        event(log, "occurrence moved to its shard", schedule_id=schedule_id, shard=owner.shard)

    def _write_state(self, schedule_id: str, state: CronState) -> None:
        self._state[schedule_id] = state
        self._send(self._names.emitter_cron, state.encode(), schedule_id.encode(), None)

    # ------------------------------------------------------------ firing
    def fire_occurrence(
        self,
        message: Message,
        due_ms: int,
        topic: str,
        headers: list[Any],
        now_ms: int,
        emit: Emit,
    ) -> None:
        """An occurrence came due: drop it, or fire its plan and place the next one."""
        schedule_id = hdr.header_text(headers, hdr.SCHEDULE)
        try:
            version = hdr.header_int(headers, hdr.SCHEDULE_VERSION)
            occurrence = hdr.header_int(headers, hdr.OCCURRENCE)
        except ValueError:
            version = occurrence = None
        source = (hdr.SOURCE, f"{self._names.timers}:{message.partition()}:{message.offset()}")
        if not schedule_id or version is None or occurrence is None:
            # A cron record without its bookkeeping: run it as the plain job it is.
            emit(topic, message.value(), message.key(), [*headers, source], due_ms)
            self._metrics.cron_occurrences.labels("unbound").inc()
            return
        if not self.owns(schedule_id):
            self._forward(message, schedule_id, due_ms, headers, now_ms)
            return
        schedule = self._table.get(schedule_id)
        verdict = occurrence_verdict(schedule, version=version)
        if verdict is not Verdict.FIRE or schedule is None:
            self._metrics.cron_occurrences.labels(verdict.value).inc()
            event(log, "occurrence dropped", schedule_id=schedule_id, why=verdict.value)
            return
        em = self._settings.emitter
        plan = misfire_plan(
            schedule,
            due_ms=min(occurrence, now_ms),
            now_ms=now_ms,
            grace_ms=em.misfire_grace_ms,
            max_catchup=em.cron_max_catchup,
        )
        exec_topic = self._names.exec(schedule.queue)  # the table holds known queues only
        # With an overlap policy every occurrence goes to its schedule's partition.
        partition = exec_partition(
            schedule.schedule_id,
            schedule.overlap,
            self._partitions.get(schedule.queue.encode(), 1),
        )
        for instant in plan.fire:
            if instant == occurrence:
                emit(topic, message.value(), message.key(), [*headers, source], due_ms, partition)
                continue
            # A missed (or already due) run besides this one: fired at once, no jitter.
            job = occurrence_job(schedule, instant, created_ms=now_ms, jitter=False)
            emit(
                exec_topic,
                codec.encode("job", job.to_record()),
                job.job_id.encode(),
                [*occurrence_headers(schedule, job, instant), source],
                instant,
                partition,
            )
        self._metrics.cron_occurrences.labels("fired").inc(len(plan.fire))
        if plan.skipped:
            self._metrics.cron_occurrences.labels("missed").inc()
        if plan.late:
            event(
                log,
                "occurrence misfired",
                schedule_id=schedule_id,
                policy=schedule.misfire.value,
                fired=len(plan.fire),
            )
        if plan.next_ms is not None:
            self._place(schedule, plan.next_ms, now_ms)
        self._write_state(schedule_id, CronState(schedule.version, plan.next_ms))
