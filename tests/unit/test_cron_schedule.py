"""CronSchedule: validation at construction, Avro round trip, the inclusive window."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from dueflow.errors import InvalidInput
from dueflow.model import Backoff, BackoffKind
from dueflow.records import codec
from dueflow.rules.cron import CronSchedule, MisfirePolicy, first_occurrence, next_occurrence


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def schedule(**overrides: Any) -> CronSchedule:
    fields: dict[str, Any] = {
        "schedule_id": "nightly-report",
        "cron": "0 9 * * MON-FRI",
        "timezone": "Europe/London",
        "queue": "reports",
        "task": "build_report",
        "payload": b'{"kind": "daily"}',
        "version": 3,
        "created_ms": utc("2024-01-01T00:00"),
        "updated_ms": utc("2024-02-01T00:00"),
    }
    fields.update(overrides)
    return CronSchedule(**fields)


def test_round_trip_through_the_avro_codec() -> None:
    original = schedule(
        jitter_ms=30_000,
        misfire=MisfirePolicy.FIRE_ALL,
        start_ms=utc("2024-03-01T00:00"),
        end_ms=utc("2024-12-31T00:00"),
        paused=True,
        max_attempts=7,
        backoff=Backoff(BackoffKind.FIXED, base_ms=500, max_ms=5_000, multiplier=1.0, jitter=False),
        timeout_ms=60_000,
        labels={"team": "finance"},
    )
    record = original.to_record()
    assert record["misfire"] == "fire_all"
    decoded = codec.decode("schedule", codec.encode("schedule", record))
    assert CronSchedule.from_record(decoded) == original


def test_defaults_match_the_schema() -> None:
    minimal = schedule()
    decoded = codec.decode("schedule", codec.encode("schedule", minimal.to_record()))
    assert decoded["misfire"] == "fire_once"
    back = CronSchedule.from_record(
        {
            k: decoded[k]
            for k in (
                "schedule_id",
                "cron",
                "timezone",
                "queue",
                "task",
                "payload",
                "version",
                "created_ms",
                "updated_ms",
            )
        }
    )
    assert back == minimal
    assert back.misfire is MisfirePolicy.FIRE_ONCE
    assert back.content_type == "application/json"
    assert back.labels == {}


def test_misfire_given_as_text_becomes_the_enum() -> None:
    assert schedule(misfire="skip").misfire is MisfirePolicy.SKIP


def test_parsed_expression_and_zone() -> None:
    s = schedule()
    assert s.expr.every_hour is False
    assert str(s.tz) == "Europe/London"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"timezone": "UTC+2"}, "timezone"),
        ({"schedule_id": ""}, "schedule_id"),
        ({"queue": "  "}, "queue"),
        ({"task": None}, "task"),
        ({"payload": "text"}, "payload"),
        ({"misfire": "sometimes"}, "misfire"),
        ({"jitter_ms": -1}, "jitter_ms"),
        ({"start_ms": -5}, "start_ms"),
        ({"start_ms": 2_000, "end_ms": 1_000}, "end_ms"),
        ({"version": -1}, "version"),
        ({"version": True}, "version"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout_ms": 0}, "timeout_ms"),
        ({"paused": "no"}, "paused"),
        ({"backoff": {"kind": "fixed"}}, "backoff"),
        ({"labels": {"a": 1}}, "labels"),
    ],
)
def test_bad_schedules_are_rejected_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        schedule(**overrides)
    assert info.value.field == field


def test_bad_record_from_the_wire_is_rejected() -> None:
    record = schedule().to_record()
    record["timezone"] = "../etc"
    with pytest.raises(InvalidInput, match="timezone"):
        CronSchedule.from_record(record)


DAILY = {"cron": "0 12 * * *", "timezone": "UTC"}


def test_next_occurrence_without_window() -> None:
    s = schedule(**DAILY)
    assert next_occurrence(s, after_ms=utc("2024-05-01T12:00")) == utc("2024-05-02T12:00")


def test_window_start_is_inclusive() -> None:
    s = schedule(**DAILY, start_ms=utc("2024-05-03T12:00"))
    assert next_occurrence(s, after_ms=utc("2024-05-01T00:00")) == utc("2024-05-03T12:00")
    later = replace(s, start_ms=utc("2024-05-03T12:00") + 1)
    assert next_occurrence(later, after_ms=utc("2024-05-01T00:00")) == utc("2024-05-04T12:00")


def test_window_end_is_inclusive() -> None:
    s = schedule(**DAILY, end_ms=utc("2024-05-03T12:00"))
    assert next_occurrence(s, after_ms=utc("2024-05-02T12:00")) == utc("2024-05-03T12:00")
    assert next_occurrence(s, after_ms=utc("2024-05-03T12:00")) is None
    earlier = replace(s, end_ms=utc("2024-05-03T12:00") - 1)
    assert next_occurrence(earlier, after_ms=utc("2024-05-02T12:00")) is None


def test_next_occurrence_ignores_paused() -> None:
    s = schedule(**DAILY, paused=True)
    assert next_occurrence(s, after_ms=utc("2024-05-01T12:00")) == utc("2024-05-02T12:00")


def test_never_firing_schedule() -> None:
    s = schedule(cron="0 0 30 2 *")
    assert next_occurrence(s, after_ms=0) is None


# ------------------------------------------------------------ schedules that never fire

NOW = utc("2030-01-01T00:00")


@pytest.mark.parametrize(
    ("overrides", "field", "named"),
    [
        ({"cron": "0 0 30 2 *"}, "cron", "0 0 30 2 *"),  # February 30
        ({"cron": "0 0 31 4,6,9,11 *"}, "cron", "0 0 31 4,6,9,11 *"),
        ({"cron": "0 12 * * *", "end_ms": utc("2029-12-31T00:00")}, "end", "0 12 * * *"),
        # a window without a leap day: Feb 29 never comes within it
        (
            {
                "cron": "0 0 29 2 *",
                "start_ms": utc("2030-03-01T00:00"),
                "end_ms": utc("2031-12-31T00:00"),
            },
            "end",
            "0 0 29 2 *",
        ),
        # an end before the first occurrence after the start
        (
            {
                "cron": "0 9 * * *",
                "start_ms": utc("2030-05-01T10:00"),
                "end_ms": utc("2030-05-02T08:59"),
            },
            "end",
            "first at 2030-05-02T09:00",
        ),
    ],
)
def test_a_schedule_that_can_never_fire_is_refused_naming_the_expression(
    overrides: dict[str, Any], field: str, named: str
) -> None:
    s = schedule(timezone="UTC", **overrides)
    with pytest.raises(InvalidInput) as info:
        first_occurrence(s, now_ms=NOW)
    assert info.value.field == field
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "first"),
    [
        ({"cron": "0 0 29 2 *"}, utc("2032-02-29T00:00")),  # the next leap day
        ({"cron": "0 0 30 2 MON"}, utc("2030-02-04T00:00")),  # OR rule: Mondays of February
        ({"cron": "0 12 * * *", "end_ms": utc("2030-01-01T12:00")}, utc("2030-01-01T12:00")),
        ({"cron": "0 12 * * *", "start_ms": utc("2030-06-01T00:00")}, utc("2030-06-01T12:00")),
        ({"cron": "0 12 * * *", "paused": True}, utc("2030-01-01T12:00")),
    ],
)
def test_a_schedule_that_fires_gives_its_first_occurrence(
    overrides: dict[str, Any], first: int
) -> None:
    assert first_occurrence(schedule(timezone="UTC", **overrides), now_ms=NOW) == first


def test_a_stored_schedule_with_numbers_the_doors_refuse_still_fires() -> None:
    """A schedule written before the doors refused absurd numbers (``*/100``,
    ``0009``) is read back from the topic and fires on the values it selects."""
    stored = schedule(cron="*/100 0009 * * *", timezone="UTC")
    decoded = codec.decode("schedule", codec.encode("schedule", stored.to_record()))
    back = CronSchedule.from_record(decoded)
    assert next_occurrence(back, after_ms=utc("2024-03-01T10:00")) == utc("2024-03-02T09:00")
