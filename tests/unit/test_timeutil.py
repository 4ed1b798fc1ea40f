from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from dueflow.errors import InvalidInput
from dueflow.timeutil import format_utc, from_utc_ms, parse_duration, to_utc_ms

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(2030, 1, 1, 8, 0, tzinfo=UTC), 1_893_484_800_000),
        (datetime(2030, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=1))), 1_893_484_800_000),
        (datetime(2030, 1, 1, 9, 0, tzinfo=PARIS), 1_893_484_800_000),  # CET, +01:00
        (datetime(2030, 7, 1, 10, 0, tzinfo=PARIS), 1_909_123_200_000),  # CEST, +02:00
        # the hour that repeats when New York leaves DST: fold picks the occurrence
        (datetime(2030, 11, 3, 1, 30, tzinfo=NEW_YORK, fold=0), 1_919_914_200_000),
        (datetime(2030, 11, 3, 1, 30, tzinfo=NEW_YORK, fold=1), 1_919_917_800_000),
        (datetime(2030, 1, 1, 8, 0, 0, 999_999, tzinfo=UTC), 1_893_484_800_999),
        (datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC), -1),
        ("2030-01-01T08:00:00Z", 1_893_484_800_000),
        ("2030-01-01T08:00:00z", 1_893_484_800_000),
        ("2030-01-01T09:00:00+01:00", 1_893_484_800_000),
        ("2030-01-01T03:00:00-05:00", 1_893_484_800_000),
        ("2030-01-01T08:00:00.250+00:00", 1_893_484_800_250),
        (" 2030-01-01 08:00:00+00:00 ", 1_893_484_800_000),
    ],
)
def test_to_utc_ms(value: datetime | str, expected_ms: int) -> None:
    assert to_utc_ms(value, field="run_at") == expected_ms


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (datetime(2030, 1, 1, 8, 0), "naive datetimes are rejected"),
        ("2030-01-01T08:00:00", "has no offset"),
        ("2030-01-01", "has no offset"),
        ("tomorrow at 9", "ISO-8601"),
        ("", "ISO-8601"),
        (1_893_484_800, "timezone-aware datetime"),
        (None, "timezone-aware datetime"),
    ],
)
def test_to_utc_ms_rejects_with_field_value_and_accepted(value: object, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        to_utc_ms(value, field="run_at")  # type: ignore[arg-type]
    err = info.value
    assert err.field == "run_at"
    assert err.value == value
    assert fragment in str(err)
    assert "2030-01-01T09:00:00+01:00" in err.accepted  # says what is accepted


def test_round_trip_and_format() -> None:
    ms = 1_893_484_800_250
    assert to_utc_ms(from_utc_ms(ms), field="x") == ms
    assert format_utc(ms) == "2030-01-01T08:00:00.250Z"
    assert to_utc_ms(format_utc(ms), field="x") == ms


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (timedelta(seconds=30), 30_000),
        (timedelta(milliseconds=1), 1),
        (timedelta(0), 0),
        (30, 30_000),
        (0.25, 250),
        (1.0005, 1_000),  # whole milliseconds, rounded half to even
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("1w", 604_800_000),
        ("250ms", 250),
        ("1m30s250ms", 90_250),
        ("1.5s", 1_500),
        ("90", 90_000),
        ("0", 0),
        (" 10 s ", 10_000),
        ("1H", 3_600_000),
    ],
)
def test_parse_duration(value: timedelta | float | str, expected_ms: int) -> None:
    assert parse_duration(value, field="delay") == expected_ms


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("-5s", "must not be negative"),
        (-1, "must not be negative"),
        (timedelta(seconds=-1), "must not be negative"),
        ("5 parsecs", "'30s'"),
        ("s", "'30s'"),
        ("", "'30s'"),
        ("1h-5m", "'30s'"),
        ("inf", "'30s'"),
        (float("nan"), "'30s'"),
        (True, "'30s'"),
        (None, "'30s'"),
        ([30], "'30s'"),
    ],
)
def test_parse_duration_rejects(value: object, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(value, field="delay")  # type: ignore[arg-type]
    assert info.value.field == "delay"
    assert info.value.value == value or value != value  # nan != nan
    assert fragment in str(info.value)
