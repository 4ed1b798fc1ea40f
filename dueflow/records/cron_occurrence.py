"""Cron occurrences in the wheel: the records and the decisions (pure core).

The emitter keeps exactly one next occurrence of each active schedule in the
timer topic. Which version of a schedule has its occurrence there is recorded
in the compacted ``<prefix>.emitter.cron`` topic (:class:`CronState`), in the
same transaction as the placement, so a new emitter never places a second
one. An occurrence is an ordinary timer record of kind ``cron``: value = the
Avro ``Job`` built from the schedule, key = job id = idempotency key =
``"<schedule_id>@<occurrence_ms>"``, due = occurrence + its deterministic
jitter, plus headers ``df-schedule``, ``df-sv`` (version), ``df-occurrence``
and, for a schedule with an overlap policy, ``df-overlap`` (its occurrences
are fired to its schedule's exec partition: :mod:`dueflow.rules.cron_overlap`).

Decisions: :func:`placement_needed` (a schedule was read) and
:func:`occurrence_verdict` (an occurrence came due). Nothing here reads the
clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow.model import Job
from dueflow.records import codec
from dueflow.rules.cron import CronSchedule, OverlapPolicy, fire_time_ms, next_occurrence
from dueflow.rules.wheel import WheelGeometry, place_timer


def occurrence_id(schedule_id: str, occurrence_ms: int) -> str:
    """Job id (and idempotency key) of one occurrence: stable across emitters."""
    return f"{schedule_id}@{occurrence_ms}"


def occurrence_job(
    schedule: CronSchedule, occurrence_ms: int, *, created_ms: int, jitter: bool = True
) -> Job:
    """The job one occurrence runs (due at the occurrence plus its jitter)."""
    job_id = occurrence_id(schedule.schedule_id, occurrence_ms)
    return Job(
        job_id=job_id,
        queue=schedule.queue,
        task=schedule.task,
        payload=schedule.payload,
        content_type=schedule.content_type,
        due_ms=fire_time_ms(schedule, occurrence_ms) if jitter else occurrence_ms,
        idempotency_key=job_id,
        created_ms=created_ms,
        max_attempts=schedule.max_attempts,
        backoff=schedule.backoff,
        timeout_ms=schedule.timeout_ms,
        jitter_ms=schedule.jitter_ms if jitter else 0,
        schedule_id=schedule.schedule_id,
        schedule_version=schedule.version,
        labels=dict(schedule.labels),
    )


def occurrence_headers(schedule: CronSchedule, job: Job, occurrence_ms: int) -> list[Any]:
    return hdr.encode(
        [
            (hdr.DUE, job.due_ms),
            (hdr.QUEUE, job.queue),
            (hdr.KIND, hdr.KIND_CRON),
            (hdr.JOB_ID, job.job_id),
            (hdr.TASK, job.task),
            (hdr.SCHEDULE, schedule.schedule_id),
            (hdr.SCHEDULE_VERSION, schedule.version),
            (hdr.OCCURRENCE, occurrence_ms),
            (hdr.SCHEMA, codec.schema_header("job")),
            # the worker applies the schedule's overlap policy (dueflow.rules.cron_overlap)
            (hdr.OVERLAP, None if schedule.overlap == OverlapPolicy.ALLOW else schedule.overlap),
        ]
    )


@dataclass(frozen=True, slots=True)
class OccurrenceRecord:
    """A timer record for one occurrence: where it goes and what it holds."""

    partition: int
    key: bytes
    value: bytes
    headers: list[Any]
    due_ms: int


def occurrence_timer(
    schedule: CronSchedule, occurrence_ms: int, *, now_ms: int, geometry: WheelGeometry
) -> OccurrenceRecord:
    """The timer record that holds ``occurrence_ms`` of ``schedule`` in the wheel."""
    job = occurrence_job(schedule, occurrence_ms, created_ms=now_ms)
    key = job.job_id.encode()
    placement = place_timer(
        due_ms=job.due_ms, now_ms=now_ms, geometry=geometry, spread=zlib.crc32(key)
    )
    return OccurrenceRecord(
        partition=placement.partition,
        key=key,
        value=codec.encode("job", job.to_record()),
        headers=occurrence_headers(schedule, job, occurrence_ms),
        due_ms=job.due_ms,
    )


@dataclass(frozen=True, slots=True)
class CronState:
    """What the wheel holds for one schedule: the version placed, its next occurrence."""

    version: int
    next_ms: int | None

    def encode(self) -> bytes:
        return orjson.dumps({"version": self.version, "next_ms": self.next_ms})

    @classmethod
    def decode(cls, raw: bytes | None) -> CronState | None:
        """The state in ``raw``; ``None`` for a tombstone or foreign bytes."""
        if not raw:
            return None
        try:
            doc = orjson.loads(raw)
            version, next_ms = doc["version"], doc["next_ms"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        if not isinstance(version, int) or not (next_ms is None or isinstance(next_ms, int)):
            return None
        return cls(version, next_ms)


def placement_needed(
    schedule: CronSchedule, state: CronState | None, *, now_ms: int
) -> CronState | None:
    """The state to write when ``schedule`` is read, or None when nothing changes.

    A version the wheel does not hold yet gets its first occurrence after
    ``now_ms`` (``next_ms`` None: paused, or the schedule has ended: nothing
    is placed). Occurrences of any other version are dropped when due, so a
    schedule deleted and created again with a lower version fires again.
    """
    if state is not None and state.version == schedule.version:
        return None
    if schedule.paused:
        return CronState(schedule.version, None)
    return CronState(schedule.version, next_occurrence(schedule, after_ms=now_ms))


class Verdict(StrEnum):
    """What happens to an occurrence that came due."""

    FIRE = "fired"
    STALE = "stale"  # its schedule changed since it was placed
    DELETED = "deleted"
    PAUSED = "paused"


def occurrence_verdict(schedule: CronSchedule | None, *, version: int) -> Verdict:
    if schedule is None:
        return Verdict.DELETED
    if schedule.version != version:
        return Verdict.STALE
    if schedule.paused:
        return Verdict.PAUSED
    return Verdict.FIRE
