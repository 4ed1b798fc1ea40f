"""The cron schedule as a domain value, its Avro record, and its next occurrence.

``CronSchedule`` is the value of the compacted schedules topic
(``schemas/dueflow/schemas/schedule.avsc``). It validates itself on construction, so a bad
schedule is rejected with ``InvalidInput`` at every door: SDK, CLI, or a
record read from the wire (which the reader quarantines).

Window: occurrences fire within ``[start_ms, end_ms]``, both ends inclusive
(as in APScheduler and Quartz); either end may be absent. ``paused`` is not a
matter of time: ``next_occurrence`` ignores it and the materializer decides
what a paused schedule places (nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from dueflow.errors import FieldOutOfRange, InvalidInput
from dueflow.model import Backoff
from dueflow.rules.cron_expr import CronExpr, parse_cron
from dueflow.rules.cron_overlap import OverlapPolicy
from dueflow.rules.cron_time import MAX_MS, next_fire, zone
from dueflow.rules.jitter import occurrence_jitter_ms
from dueflow.rules.wire_bounds import MAX_INT32 as _MAX_INT32
from dueflow.rules.wire_bounds import MAX_NAME_CHARS as _MAX_ID_CHARS
from dueflow.rules.wire_bounds import check_backoff
from dueflow.timeutil import format_utc


class MisfirePolicy(StrEnum):
    """What to do with occurrences missed by more than the grace period."""

    FIRE_ALL = "fire_all"  # fire every missed occurrence (up to max_catchup)
    FIRE_ONCE = "fire_once"  # fire one run for all of them (coalesce)
    SKIP = "skip"  # fire none of them


def _text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(name, value, "a non-empty string")


def _int(name: str, value: object, *, low: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_MS:
        raise InvalidInput(
            name, value, f"an integer in [{low}, {MAX_MS}]" + (" or null" * optional)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CronSchedule:
    """A job fired at every occurrence of ``cron`` in ``timezone``.

    ``version`` increases with every change of the schedule; occurrences
    computed from an older version are dropped by the emitter.
    """

    schedule_id: str
    cron: str
    timezone: str
    queue: str
    task: str
    payload: bytes
    content_type: str = "application/json"
    jitter_ms: int = 0
    misfire: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    start_ms: int | None = None
    end_ms: int | None = None
    version: int
    paused: bool = False
    max_attempts: int = 4
    backoff: Backoff | None = None
    timeout_ms: int | None = None
    created_ms: int
    updated_ms: int
    labels: Mapping[str, str] = field(default_factory=dict)
    overlap: OverlapPolicy = OverlapPolicy.ALLOW

    def __post_init__(self) -> None:
        for name in ("schedule_id", "queue", "task", "content_type"):
            _text(name, getattr(self, name))
        parse_cron(self.cron, strict=False)  # the doors check strictly (schedule_fields)
        zone(self.timezone)
        if not isinstance(self.payload, bytes):
            raise InvalidInput("payload", self.payload, "bytes")
        try:
            object.__setattr__(self, "misfire", MisfirePolicy(self.misfire))
        except ValueError:
            raise InvalidInput(
                "misfire", self.misfire, ", ".join(p.value for p in MisfirePolicy)
            ) from None
        try:
            object.__setattr__(self, "overlap", OverlapPolicy(self.overlap))
        except ValueError:
            raise InvalidInput(
                "overlap", self.overlap, ", ".join(p.value for p in OverlapPolicy)
            ) from None
        _int("jitter_ms", self.jitter_ms, low=0)
        _int("start_ms", self.start_ms, low=0, optional=True)
        _int("end_ms", self.end_ms, low=0, optional=True)
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise InvalidInput("end_ms", self.end_ms, f">= start_ms ({self.start_ms})")
        _int("version", self.version, low=0)
        _int("max_attempts", self.max_attempts, low=1)
        if self.max_attempts > _MAX_INT32:  # an Avro int: the occurrence's job holds it
            raise InvalidInput(
                "max_attempts", self.max_attempts, f"an integer in [1, {_MAX_INT32}]"
            )
        if len(self.schedule_id) > _MAX_ID_CHARS:
            raise InvalidInput(
                "schedule_id", self.schedule_id, f"a string of 1 to {_MAX_ID_CHARS} characters"
            )
        _int("timeout_ms", self.timeout_ms, low=1, optional=True)
        _int("created_ms", self.created_ms, low=0)
        _int("updated_ms", self.updated_ms, low=0)
        if not isinstance(self.paused, bool):
            raise InvalidInput("paused", self.paused, "a boolean")
        if self.backoff is not None and not isinstance(self.backoff, Backoff):
            raise InvalidInput("backoff", self.backoff, "a Backoff or null")
        if self.backoff is not None:
            try:
                check_backoff(self.backoff)
            except FieldOutOfRange as exc:  # the workers would refuse its occurrences
                raise InvalidInput(exc.field, exc.value, exc.accepted) from None
        if not isinstance(self.labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise InvalidInput("labels", self.labels, "a mapping of strings to strings")

    @property
    def expr(self) -> CronExpr:
        """The parsed expression (parsing is cached)."""
        return parse_cron(self.cron, strict=False)

    @property
    def tz(self) -> ZoneInfo:
        """The schedule's time zone."""
        return zone(self.timezone)

    def to_record(self) -> dict[str, Any]:
        return {
            "schedule_id": self.schedule_id,
            "cron": self.cron,
            "timezone": self.timezone,
            "queue": self.queue,
            "task": self.task,
            "payload": self.payload,
            "content_type": self.content_type,
            "jitter_ms": self.jitter_ms,
            "misfire": self.misfire.value,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "version": self.version,
            "paused": self.paused,
            "max_attempts": self.max_attempts,
            "backoff": None if self.backoff is None else self.backoff.to_record(),
            "timeout_ms": self.timeout_ms,
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
            "labels": dict(self.labels),
            "overlap": self.overlap.value,
        }

    @property
    def schema_version(self) -> int:
        """The oldest version of ``schedule.avsc`` that holds this schedule: 1
        unless it has an overlap policy (readers of the previous release read it)."""
        return 1 if self.overlap == OverlapPolicy.ALLOW else 2

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> CronSchedule:
        """From a decoded record (or a hand-made dict: defaulted fields may be absent)."""
        return cls(
            schedule_id=rec["schedule_id"],
            cron=rec["cron"],
            timezone=rec["timezone"],
            queue=rec["queue"],
            task=rec["task"],
            payload=rec["payload"],
            content_type=rec.get("content_type", "application/json"),
            jitter_ms=rec.get("jitter_ms", 0),
            misfire=rec.get("misfire", MisfirePolicy.FIRE_ONCE),
            start_ms=rec.get("start_ms"),
            end_ms=rec.get("end_ms"),
            version=rec["version"],
            paused=rec.get("paused", False),
            max_attempts=rec.get("max_attempts", 4),
            backoff=Backoff.from_record(rec.get("backoff")),
            timeout_ms=rec.get("timeout_ms"),
            created_ms=rec["created_ms"],
            updated_ms=rec["updated_ms"],
            labels=dict(rec.get("labels") or {}),
            overlap=rec.get("overlap", OverlapPolicy.ALLOW),
        )


def next_occurrence(schedule: CronSchedule, *, after_ms: int) -> int | None:
    """First occurrence of ``schedule`` strictly after ``after_ms`` within its
    window ``[start_ms, end_ms]`` (both inclusive); None when there is none."""
    after = after_ms
    if schedule.start_ms is not None and after < schedule.start_ms - 1:
        after = schedule.start_ms - 1
    found = next_fire(schedule.expr, after_ms=after, tz=schedule.tz)
    if found is None or (schedule.end_ms is not None and found > schedule.end_ms):
        return None
    return found


def fire_time_ms(schedule: CronSchedule, occurrence_ms: int) -> int:
    """When occurrence ``occurrence_ms`` of ``schedule`` is meant to fire: the
    occurrence plus its deterministic jitter
    (:func:`~dueflow.rules.jitter.occurrence_jitter_ms`)."""
    if not schedule.jitter_ms:
        return occurrence_ms
    return occurrence_ms + occurrence_jitter_ms(
        schedule.schedule_id, occurrence_ms, schedule.jitter_ms
    )


def first_occurrence(schedule: CronSchedule, *, now_ms: int) -> int:
    """The first occurrence of ``schedule`` after ``now_ms`` (and at or after its
    start); :class:`InvalidInput` when it would never fire.

    A schedule is refused when it can never fire: an expression no calendar
    date matches (field ``cron``: ``0 0 30 2 *``, February 30), or a window
    that ends before the first occurrence after its start or after now (field
    ``end``). The message names the expression and the zone. Paused or not
    does not matter here.
    """
    if not schedule.expr.can_fire:
        raise InvalidInput(
            "cron",
            schedule.cron,
            "an expression some calendar date matches; no month has the day of month it "
            "names, so it would never fire (February has 29 days at most; April, June, "
            "September and November 30)",
        )
    found = next_occurrence(schedule, after_ms=now_ms)
    if found is not None:
        return found
    since = now_ms if schedule.start_ms is None else max(now_ms, schedule.start_ms)
    ahead = next_fire(schedule.expr, after_ms=since, tz=schedule.tz)
    end = schedule.end_ms
    shown = format_utc(end) if end is not None else None
    first = f"first at {format_utc(ahead)}" if ahead is not None else "none before year 9999"
    raise InvalidInput(
        "end",
        shown,
        f"a time at or after the first occurrence of cron {schedule.cron!r} in "
        f"{schedule.timezone} after {format_utc(since)} ({first}): with this end the "
        "schedule would never fire",
    )


__all__ = ["CronSchedule", "MisfirePolicy", "fire_time_ms", "first_occurrence", "next_occurrence"]
