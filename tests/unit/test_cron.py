"""The cron core: expression language, time zones, DST rules, and properties
checked against a brute-force oracle that walks wall clocks minute by minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dueflow.errors import InvalidInput
from dueflow.rules.cron import CronExpr, next_fire, occurrences, parse_cron, zone
from dueflow.rules.cron_time import zone_suggestions


def utc(text: str) -> int:
    """Epoch ms of a UTC ISO time without zone suffix."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def values(mask: int) -> list[int]:
    return [v for v in range(64) if mask >> v & 1]


# ---------------------------------------------------------------- language


@pytest.mark.parametrize(
    ("expr", "field", "expected"),
    [
        ("* * * * *", "seconds", [0]),
        ("*/15 * * * *", "minutes", [0, 15, 30, 45]),
        ("10-50/5 * * * *", "minutes", list(range(10, 51, 5))),
        ("5/20 * * * *", "minutes", [5, 25, 45]),
        ("1,2,30-32 * * * *", "minutes", [1, 2, 30, 31, 32]),
        ("0 9-17/4 * * *", "hours", [9, 13, 17]),
        ("0 0 1,15 * *", "days", [1, 15]),
        ("0 0 * jan,Mar-MAY,dec *", "months", [1, 3, 4, 5, 12]),
        ("0 0 * * mon-FRI", "weekdays", [1, 2, 3, 4, 5]),
        ("0 0 * * 7", "weekdays", [0]),
        ("0 0 * * 0,7", "weekdays", [0]),
        ("0 0 * * 5-7", "weekdays", [0, 5, 6]),
        ("0 0 * * MON-SUN", "weekdays", [0, 1, 2, 3, 4, 5, 6]),
        ("0 0 * * SAT-SUN", "weekdays", [0, 6]),
        ("30 */20 * * * *", "seconds", [30]),
        ("30 */20 * * * *", "minutes", [0, 20, 40]),
        ("  1   2  3  4  5 ", "minutes", [1]),
    ],
)
def test_parse_fields(expr: str, field: str, expected: list[int]) -> None:
    assert values(getattr(parse_cron(expr), field)) == expected


@pytest.mark.parametrize(
    ("macro", "same_as"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros(macro: str, same_as: str) -> None:
    assert parse_cron(macro) == parse_cron(same_as)
    assert str(parse_cron(macro)) == macro


def test_expressions_are_values() -> None:
    a, b = parse_cron("0 0 * * *"), parse_cron("0 0 0 1-31 */1 0-7")
    assert a == b
    assert hash(a) == hash(b)
    assert {a, b} == {a}
    assert parse_cron("*/2 * * * *") != parse_cron("*/3 * * * *")
    with pytest.raises(AttributeError):
        a.minutes = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("expr", "dom_restricted", "dow_restricted"),
    [
        ("0 0 * * *", False, False),
        ("0 0 1-31 * 0-6", False, False),
        ("0 0 */1 * */1", False, False),
        ("0 0 */2 * *", True, False),
        ("0 0 * * MON", False, True),
        ("0 0 13 * FRI", True, True),
    ],
)
def test_restricted_is_decided_by_value(
    expr: str, dom_restricted: bool, dow_restricted: bool
) -> None:
    parsed = parse_cron(expr)
    assert parsed.day_of_month_restricted is dom_restricted
    assert parsed.day_of_week_restricted is dow_restricted


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "minute field '61': values 0-59"),
        ("* * * *", "5 or 6 fields"),
        ("* * * *", "got 4 fields"),
        ("", "got 0 fields"),
        ("* * * * * * *", "got 7 fields"),
        ("60 * * * * *", "second field '60': values 0-59"),
        ("* 24 * * *", "hour field '24': values 0-23"),
        ("* * 0 * *", "day-of-month field '0': values 1-31"),
        ("* * 32 * *", "day-of-month field '32': values 1-31"),
        ("* * * 13 *", "month field '13': values 1-12 or JAN-DEC"),
        ("* * * 0 *", "month field '0': values 1-12 or JAN-DEC"),
        ("* * * JANUARY *", "month field 'JANUARY': 'JANUARY' is not a number"),
        ("* * * * 8", "day-of-week field '8': values 0-7 (0 and 7 are Sunday) or SUN-SAT"),
        ("* * * * MON-FOO", "day-of-week field 'MON-FOO': 'FOO' is not a number"),
        ("* * * * JAN", "day-of-week field 'JAN': 'JAN' is not a number"),
        ("* * * MON *", "month field 'MON'"),
        ("*/0 * * * *", "minute field '*/0': step must be an integer from 1 to 60"),
        ("*/x * * * *", "minute field '*/x': step must be an integer from 1 to 60"),
        ("*/ * * * *", "step must be an integer from 1 to 60"),
        ("5-2 * * * *", "minute field '5-2': range start 5 is after end 2"),
        ("* * * * FRI-MON", "range start 5 is after end 1"),
        ("1,,2 * * * *", "minute field '1,,2': empty list item"),
        ("1, * * * *", "empty list item"),
        ("-5 * * * *", "minute field '-5': '' is not a number"),
        ("* * L * *", "day-of-month field 'L': 'L' is not a number"),
        ("* * * * 5#2", "day-of-week field '5#2'"),
        ("* * 15W * *", "day-of-month field '15W'"),
        ("* * ? * *", "day-of-month field '?'"),
        ("@reboot", "unknown macro '@reboot'"),
        ("@every 5m", "unknown macro"),
        ("1-2-3 * * * *", "'2-3' is not a number"),
    ],
)
def test_parse_errors_name_the_field_and_what_is_wrong(expr: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_cron(expr)
    assert info.value.field == "cron"
    assert info.value.value == expr
    assert message in str(info.value)


TWENTY_NINES = "9" * 20


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        # steps: 1 to the number of values in the field, in as many digits
        (
            f"*/{TWENTY_NINES} * * * *",
            "minute field '*/99999999999999999999': step must be an integer from 1 to 60",
        ),
        (f"* * * * * */{TWENTY_NINES}", "day-of-week field"),
        (f"0/{TWENTY_NINES} * * * * *", "second field"),
        ("*/61 * * * * *", "second field '*/61': step must be an integer from 1 to 60"),
        ("*/61 * * * *", "minute field '*/61': step must be an integer from 1 to 60"),
        ("* */25 * * *", "hour field '*/25': step must be an integer from 1 to 24"),
        ("* * */32 * *", "day-of-month field '*/32': step must be an integer from 1 to 31"),
        ("* * * */13 *", "month field '*/13': step must be an integer from 1 to 12"),
        ("* * * * */9", "day-of-week field '*/9': step must be an integer from 1 to 8"),
        ("10-50/100 * * * *", "minute field '10-50/100'"),
        ("5/0005 * * * *", "minute field '5/0005': step must be an integer from 1 to 60"),
        ("*/" + "9" * 5000 + " * * * *", "minute field '*/9999999999999999999999999999999999999"),
        # values and range ends: more digits than the field's largest value
        ("0005 * * * *", "minute field '0005': '0005' has more digits than any value; values 0-59"),
        (f"{TWENTY_NINES} * * * *", "has more digits than any value; values 0-59"),
        ("0 0 001 * *", "day-of-month field '001': '001' has more digits than any value"),
        ("0 0 * 012 *", "month field '012'"),
        ("0 0 * * 00", "day-of-week field '00'"),
        ("0 0-0023 * * *", "hour field '0-0023': '0023' has more digits than any value"),
        (f"1-{TWENTY_NINES} * * * *", "minute field '1-99999999999999999999'"),
        ("9" * 5000 + " * * * *", "has more digits than any value"),
        # out of range, including in ranges
        ("0 0 1-32 * *", "day-of-month field '1-32': values 1-31"),
        ("0 25-26 * * *", "hour field '25-26': values 0-23"),
        # a year field is not supported
        ("0 0 1 1 * 2030", "day-of-week field '2030': '2030' has more digits"),
        ("0 0 0 1 1 * 2030", "got 7 fields; a year field is not supported"),
    ],
)
def test_absurd_numbers_are_refused_with_the_field_named(expr: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_cron(expr)
    assert info.value.field == "cron"
    assert message in str(info.value)
    assert len(str(info.value)) < 800  # a huge field is cut in the message


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("*/60 * * * *", "0 * * * *"),
        ("*/05 * * * *", "*/5 * * * *"),
        ("05 * * * *", "5 * * * *"),
        ("* */24 * * *", "* 0 * * *"),
        ("* * * * */8", "* * * * 0"),
    ],
)
def test_largest_steps_and_leading_zeros_within_the_digits_are_accepted(
    expr: str, same_as: str
) -> None:
    assert parse_cron(expr) == parse_cron(same_as)


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        (f"*/{TWENTY_NINES} * * * *", "0 * * * *"),
        ("*/100 * * * *", "0 * * * *"),
        ("0005 * * * *", "5 * * * *"),
        ("10-50/100 * * * *", "10 * * * *"),
        ("*/" + "9" * 5000 + " * * * *", "0 * * * *"),
    ],
)
def test_stored_schedules_are_read_for_the_values_they_select(expr: str, same_as: str) -> None:
    """A schedule read back from the topic (written by a client without the strict
    checks) keeps firing as before: not strict reads its numbers for their values."""
    assert parse_cron(expr, strict=False) == parse_cron(same_as)


def test_lenient_reading_still_refuses_values_out_of_range() -> None:
    for expr in ("61 * * * *", f"{TWENTY_NINES} * * * *", "*/0 * * * *", "9" * 5000 + " * * * *"):
        with pytest.raises(InvalidInput):
            parse_cron(expr, strict=False)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(InvalidInput, match="a string"):
        parse_cron(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="a string"):
        parse_cron(["* * * * *"])  # type: ignore[arg-type]


# ---------------------------------------------------------------- zones


@pytest.mark.parametrize(
    "name", ["Europe/London", "America/New_York", "Australia/Lord_Howe", "UTC", "Etc/GMT+2"]
)
def test_zone_accepts_iana_names(name: str) -> None:
    assert zone(name) == ZoneInfo(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "UTC+2",
        "GMT+02:00",
        "../etc",
        "../../etc/passwd",
        "/etc/passwd",
        "Europe/../Europe/London",
        "Europe/Nowhere",
        "europe/london",
        " Europe/London",
        "Europe/London\x00",
        "localtime",
        "posixrules",
        "zone.tab",
        "tzdata.zi",
        "right/UTC",
        "A" * 300,
    ],
)
def test_zone_rejects_what_is_not_a_zone(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        zone(name)
    assert info.value.field == "timezone"
    assert "an IANA zone name such as Europe/London" in str(info.value)


def test_zone_rejects_non_strings_and_next_fire_validates_tz() -> None:
    with pytest.raises(InvalidInput, match="timezone"):
        zone(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="timezone"):
        next_fire(parse_cron("* * * * *"), after_ms=0, tz="Mars/Olympus_Mons")


# ---------------------------------------------------------------- DST tables
#
# (zone, expression, after (UTC), expected occurrences (UTC)). Comments give
# local wall times. `occurrences` is asked for exactly the expected window.

LONDON, NEW_YORK, LORD_HOWE = "Europe/London", "America/New_York", "Australia/Lord_Howe"

DST_TABLE = [
    # London spring forward 2024-03-31 01:00 UTC: 01:00 GMT -> 02:00 BST.
    pytest.param(
        LONDON,
        "30 1 * * *",
        "2024-03-30T12:00",
        ["2024-03-31T01:30", "2024-04-01T00:30"],
        id="london-spring-daily-in-gap",  # 01:30 does not exist: 02:30 BST
    ),
    pytest.param(
        LONDON, "0 1 * * *", "2024-03-30T12:00", ["2024-03-31T01:00"], id="london-spring-gap-start"
    ),
    pytest.param(
        LONDON,
        "0 9 * * *",
        "2024-03-30T00:00",
        ["2024-03-30T09:00", "2024-03-31T08:00"],
        id="london-spring-daily-outside-gap",
    ),
    pytest.param(
        LONDON,
        "0 * * * *",
        "2024-03-30T23:30",
        ["2024-03-31T00:00", "2024-03-31T01:00", "2024-03-31T02:00"],
        id="london-spring-hourly",  # 00:00 GMT, 01:00->02:00 BST (=02:00 BST), 03:00 BST
    ),
    pytest.param(
        LONDON,
        "*/15 * * * *",
        "2024-03-31T00:40",
        [f"2024-03-31T{t}" for t in ("00:45", "01:00", "01:15", "01:30", "01:45", "02:00")],
        id="london-spring-every-15-min",
    ),
    pytest.param(
        LONDON,
        "*/20 * * * * *",
        "2024-03-31T00:59:30",
        ["2024-03-31T00:59:40", "2024-03-31T01:00:00", "2024-03-31T01:00:20"],
        id="london-spring-seconds",
    ),
    pytest.param(
        LONDON,
        "30 30 1 * * *",
        "2024-03-30T12:00",
        ["2024-03-31T01:30:30", "2024-04-01T00:30:30"],
        id="london-spring-seconds-in-gap",
    ),
    pytest.param(
        LONDON,
        "30 1 * * *",
        "2024-03-31T01:10",  # 02:10 BST: the gap's 01:30 (02:30 BST) is still ahead
        ["2024-03-31T01:30", "2024-04-01T00:30"],
        id="london-spring-after-inside-gap-shadow",
    ),
    # London fall back 2024-10-27 01:00 UTC: 02:00 BST -> 01:00 GMT.
    pytest.param(
        LONDON,
        "30 1 * * *",
        "2024-10-26T12:00",
        ["2024-10-27T00:30", "2024-10-28T01:30"],
        id="london-fall-daily-once-first",  # 01:30 BST, not 01:30 GMT
    ),
    pytest.param(
        LONDON,
        "0 * * * *",
        "2024-10-26T22:30",
        ["2024-10-26T23:00", "2024-10-27T00:00", "2024-10-27T01:00", "2024-10-27T02:00"],
        id="london-fall-hourly-keeps-period",  # 00:00 BST, 01:00 BST, 01:00 GMT, 02:00 GMT
    ),
    pytest.param(
        LONDON,
        "*/15 * * * *",
        "2024-10-27T00:40",
        ["2024-10-27T00:45", "2024-10-27T01:00", "2024-10-27T01:15"],
        id="london-fall-every-15-min-both-passes",  # 01:45 BST, 01:00 GMT, 01:15 GMT
    ),
    pytest.param(
        LONDON,
        "*/15 * * * *",
        "2024-10-27T00:50",  # 01:50 BST: the second pass starts 10 minutes later
        ["2024-10-27T01:00"],
        id="london-fall-every-15-min-before-change",
    ),
    pytest.param(
        LONDON,
        "*/15 1 * * *",
        "2024-10-26T23:50",
        [f"2024-10-27T00:{m}" for m in ("00", "15", "30", "45")] + ["2024-10-28T01:00"],
        id="london-fall-hour-restricted-first-pass-only",
    ),
    pytest.param(
        LONDON,
        "*/15 1 * * *",
        "2024-10-27T01:05",  # 01:05 GMT, inside the second pass
        ["2024-10-28T01:00"],
        id="london-fall-after-inside-second-pass",
    ),
    pytest.param(
        LONDON,
        "30 15 1 * * *",
        "2024-10-26T12:00",
        ["2024-10-27T00:15:30", "2024-10-28T01:15:30"],
        id="london-fall-seconds-once",
    ),
    pytest.param(
        LONDON,
        "0 */30 * * * *",
        "2024-10-27T00:20",
        ["2024-10-27T00:30", "2024-10-27T01:00", "2024-10-27T01:30"],
        id="london-fall-seconds-every-hour",
    ),
    # New York spring forward 2024-03-10 07:00 UTC: 02:00 EST -> 03:00 EDT.
    pytest.param(
        NEW_YORK,
        "30 2 * * *",
        "2024-03-09T12:00",
        ["2024-03-10T07:30", "2024-03-11T06:30"],
        id="new-york-spring-daily-in-gap",  # 02:30 -> 03:30 EDT
    ),
    pytest.param(
        NEW_YORK,
        "0 * * * *",
        "2024-03-10T05:30",
        ["2024-03-10T06:00", "2024-03-10T07:00", "2024-03-10T08:00"],
        id="new-york-spring-hourly",
    ),
    pytest.param(
        NEW_YORK,
        "*/15 * * * *",
        "2024-03-10T06:40",
        ["2024-03-10T06:45", "2024-03-10T07:00", "2024-03-10T07:15"],
        id="new-york-spring-every-15-min",
    ),
    pytest.param(
        NEW_YORK,
        "15 30 2 * * *",
        "2024-03-09T12:00",
        ["2024-03-10T07:30:15", "2024-03-11T06:30:15"],
        id="new-york-spring-seconds-in-gap",
    ),
    pytest.param(
        NEW_YORK,
        "30 2 * * *",
        "2024-03-10T07:10",  # 03:10 EDT; 02:30 fires at 03:30 EDT
        ["2024-03-10T07:30"],
        id="new-york-spring-after-inside-gap-shadow",
    ),
    # New York fall back 2024-11-03 06:00 UTC: 02:00 EDT -> 01:00 EST.
    pytest.param(
        NEW_YORK,
        "30 1 * * *",
        "2024-11-02T12:00",
        ["2024-11-03T05:30", "2024-11-04T06:30"],
        id="new-york-fall-daily-once-first",
    ),
    pytest.param(
        NEW_YORK,
        "0 * * * *",
        "2024-11-03T03:30",
        ["2024-11-03T04:00", "2024-11-03T05:00", "2024-11-03T06:00", "2024-11-03T07:00"],
        id="new-york-fall-hourly-keeps-period",
    ),
    pytest.param(
        NEW_YORK,
        "*/30 * * * *",
        "2024-11-03T05:10",
        ["2024-11-03T05:30", "2024-11-03T06:00", "2024-11-03T06:30"],
        id="new-york-fall-every-30-min",
    ),
    pytest.param(
        NEW_YORK,
        "*/20 * * * * *",
        "2024-11-03T05:59:30",
        ["2024-11-03T05:59:40", "2024-11-03T06:00:00", "2024-11-03T06:00:20"],
        id="new-york-fall-seconds",
    ),
    # Lord Howe spring forward 2024-10-05 15:30 UTC: 02:00 +10:30 -> 02:30 +11:00.
    pytest.param(
        LORD_HOWE,
        "15 2 * * *",
        "2024-10-05T12:00",
        ["2024-10-05T15:45", "2024-10-06T15:15"],
        id="lord-howe-spring-daily-in-half-hour-gap",  # 02:15 -> 02:45 +11
    ),
    pytest.param(
        LORD_HOWE,
        "0 * * * *",
        "2024-10-05T13:00",
        ["2024-10-05T13:30", "2024-10-05T14:30", "2024-10-05T15:30", "2024-10-05T16:00"],
        id="lord-howe-spring-hourly",  # 00:00, 01:00, 02:00->02:30, 03:00
    ),
    pytest.param(
        LORD_HOWE,
        "*/15 * * * *",
        "2024-10-05T15:00",
        ["2024-10-05T15:15", "2024-10-05T15:30", "2024-10-05T15:45", "2024-10-05T16:00"],
        id="lord-howe-spring-every-15-min",
    ),
    pytest.param(
        LORD_HOWE,
        "20,35 2 * * *",
        "2024-10-05T12:00",
        ["2024-10-05T15:35", "2024-10-05T15:50"],
        id="lord-howe-spring-shifted-wall-after-real-one",  # 02:35 real, then 02:20->02:50
    ),
    pytest.param(
        LORD_HOWE,
        "45 10 2 * * *",
        "2024-10-05T12:00",
        ["2024-10-05T15:40:45"],
        id="lord-howe-spring-seconds-in-gap",
    ),
    # Lord Howe fall back 2024-04-06 15:00 UTC: 02:00 +11:00 -> 01:30 +10:30.
    pytest.param(
        LORD_HOWE,
        "45 1 * * *",
        "2024-04-06T12:00",
        ["2024-04-06T14:45", "2024-04-07T15:15"],
        id="lord-howe-fall-daily-once-first",
    ),
    pytest.param(
        LORD_HOWE,
        "0 * * * *",
        "2024-04-06T12:30",
        ["2024-04-06T13:00", "2024-04-06T14:00", "2024-04-06T15:30", "2024-04-06T16:30"],
        id="lord-howe-fall-hourly",  # 01:00 is not repeated (01:30-01:59 are)
    ),
    pytest.param(
        LORD_HOWE,
        "30 * * * *",
        "2024-04-06T13:00",
        ["2024-04-06T13:30", "2024-04-06T14:30", "2024-04-06T15:00", "2024-04-06T16:00"],
        id="lord-howe-fall-hourly-at-30-both-passes",
    ),
    pytest.param(
        LORD_HOWE,
        "*/15 * * * *",
        "2024-04-06T14:20",
        [f"2024-04-06T{t}" for t in ("14:30", "14:45", "15:00", "15:15", "15:30")],
        id="lord-howe-fall-every-15-min",
    ),
    pytest.param(
        LORD_HOWE,
        "*/30 59 1 * * *",
        "2024-04-06T12:00",
        ["2024-04-06T14:59:00", "2024-04-06T14:59:30", "2024-04-07T15:29:00"],
        id="lord-howe-fall-seconds-once",
    ),
]


@pytest.mark.parametrize(("tz", "expr", "after", "expected"), DST_TABLE)
def test_dst_transitions(tz: str, expr: str, after: str, expected: list[str]) -> None:
    got = occurrences(
        parse_cron(expr),
        after_ms=utc(after),
        until_ms=utc(expected[-1]),
        tz=tz,
        limit=100,
    )
    assert [iso(ms) for ms in got] == [iso(utc(e)) for e in expected]


CALENDAR_TABLE = [
    pytest.param("UTC", "0 0 1 1 *", "2024-12-31T23:59:59", ["2025-01-01T00:00"], id="new-year"),
    pytest.param(
        NEW_YORK,
        "0 0 1 1 *",
        "2024-12-31T12:00",
        ["2025-01-01T05:00", "2026-01-01T05:00"],
        id="new-year-new-york",
    ),
    pytest.param(
        "UTC",
        "59 59 23 31 12 *",
        "2024-06-01T00:00",
        ["2024-12-31T23:59:59", "2025-12-31T23:59:59"],
        id="last-second-of-year",
    ),
    pytest.param(
        "UTC",
        "0 0 29 2 *",
        "2024-03-01T00:00",
        ["2028-02-29T00:00", "2032-02-29T00:00"],
        id="leap-day",
    ),
    pytest.param(
        "UTC", "0 0 29 2 *", "2096-03-01T00:00", ["2104-02-29T00:00"], id="leap-day-skips-2100"
    ),
    pytest.param(
        "UTC",
        "0 0 29 2 *",
        "2024-02-28T23:59:59",
        ["2024-02-29T00:00"],
        id="leap-day-this-year",
    ),
    pytest.param(
        "UTC",
        "0 12 31 * *",
        "2024-01-31T12:00",
        ["2024-03-31T12:00", "2024-05-31T12:00", "2024-07-31T12:00"],
        id="31st-skips-short-months",
    ),
    pytest.param(
        "UTC",
        "0 0 13 * FRI",
        "2024-09-01T00:00",
        [
            f"2024-{d}T00:00"
            for d in ("09-06", "09-13", "09-20", "09-27", "10-04", "10-11", "10-13", "10-18")
        ],
        id="dom-or-dow",  # the 13th OR a Friday
    ),
    pytest.param(
        "UTC",
        "0 0 * * FRI",
        "2024-09-01T00:00",
        ["2024-09-06T00:00", "2024-09-13T00:00", "2024-09-20T00:00"],
        id="dow-only",
    ),
    pytest.param(
        "UTC",
        "0 0 1-31 * FRI",
        "2024-09-01T00:00",
        ["2024-09-06T00:00", "2024-09-13T00:00"],
        id="full-dom-range-is-unrestricted",
    ),
    pytest.param(
        "UTC",
        "0 0 */2 * MON",
        "2024-09-01T00:00",
        [
            f"2024-09-{d:02d}T00:00"
            for d in (2, 3, 5, 7, 9, 11, 13, 15, 16)  # odd days or Mondays (2, 9, 16)
        ],
        id="stepped-dom-is-restricted",
    ),
    pytest.param(
        "UTC",
        "0 0 * * 7",
        "2024-09-01T00:00",
        ["2024-09-08T00:00", "2024-09-15T00:00"],
        id="seven-is-sunday",
    ),
    pytest.param(
        "UTC",
        "0 0 30 2 MON",
        "2024-01-01T00:00",
        ["2024-02-05T00:00", "2024-02-12T00:00"],
        id="feb-30-or-monday",
    ),
    pytest.param("UTC", "@weekly", "2024-09-02T00:00", ["2024-09-08T00:00"], id="weekly"),
    pytest.param(
        "Asia/Kolkata",
        "30 9 * * MON-FRI",
        "2024-09-06T00:00",
        ["2024-09-06T04:00", "2024-09-09T04:00"],
        id="weekdays-kolkata",
    ),
    pytest.param(
        "UTC",
        "0 0 * * *",
        "2024-01-01T00:00",  # strictly after: the occurrence at `after` is not returned
        ["2024-01-02T00:00"],
        id="strictly-after",
    ),
]


@pytest.mark.parametrize(("tz", "expr", "after", "expected"), CALENDAR_TABLE)
def test_calendar(tz: str, expr: str, after: str, expected: list[str]) -> None:
    got = occurrences(
        parse_cron(expr), after_ms=utc(after), until_ms=utc(expected[-1]), tz=tz, limit=100
    )
    assert [iso(ms) for ms in got] == [iso(utc(e)) for e in expected]


@pytest.mark.parametrize(
    "expr", ["0 0 30 2 *", "0 0 30,31 2 *", "0 0 31 4,6,9,11 *", "0 0 0 31 FEB,APR *"]
)
def test_impossible_dates_never_fire(expr: str) -> None:
    parsed = parse_cron(expr)
    assert not parsed.can_fire
    assert next_fire(parsed, after_ms=0, tz="UTC") is None
    assert next_fire(parsed, after_ms=utc("2024-02-01T00:00"), tz=LONDON) is None
    assert (
        occurrences(parsed, after_ms=0, until_ms=utc("2100-01-01T00:00"), tz="UTC", limit=5) == []
    )


def test_far_future_within_the_supported_range() -> None:
    assert next_fire(parse_cron("0 0 1 1 *"), after_ms=utc("8999-06-01T00:00"), tz="UTC") == utc(
        "9000-01-01T00:00"
    )
    assert (
        occurrences(
            parse_cron("0 0 29 2 *"),
            after_ms=utc("8999-06-01T00:00"),
            until_ms=utc("8999-12-31T00:00"),
            tz="UTC",
            limit=3,
        )
        == []
    )


def test_strictly_after_with_milliseconds() -> None:
    every_second = parse_cron("* * * * * *")
    t = utc("2024-05-05T10:00:00")
    assert next_fire(every_second, after_ms=t - 1, tz="UTC") == t
    assert next_fire(every_second, after_ms=t, tz="UTC") == t + 1000
    assert next_fire(every_second, after_ms=t + 999, tz="UTC") == t + 1000


def test_zoneinfo_objects_are_accepted() -> None:
    expr = parse_cron("0 9 * * *")
    after = utc("2024-07-01T00:00")
    assert next_fire(expr, after_ms=after, tz=ZoneInfo(LONDON)) == next_fire(
        expr, after_ms=after, tz=LONDON
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"after_ms": -(10**15)}, "after_ms"),
        ({"after_ms": 10**16}, "after_ms"),
        ({"after_ms": True}, "after_ms"),
        ({"after_ms": 1.5}, "after_ms"),
    ],
)
def test_next_fire_validates_instants(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        next_fire(parse_cron("* * * * *"), tz="UTC", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_occurrences_validates_limit_and_until() -> None:
    expr = parse_cron("* * * * *")
    with pytest.raises(InvalidInput, match="limit"):
        occurrences(expr, after_ms=0, until_ms=10**6, tz="UTC", limit=-1)
    with pytest.raises(InvalidInput, match="until_ms"):
        occurrences(expr, after_ms=0, until_ms=10**17, tz="UTC", limit=1)
    assert occurrences(expr, after_ms=0, until_ms=10**9, tz="UTC", limit=0) == []
    assert len(occurrences(expr, after_ms=0, until_ms=10**9, tz="UTC", limit=3)) == 3


# ---------------------------------------------------------------- oracle and properties

ORACLE_ZONES = [
    LONDON,
    NEW_YORK,
    LORD_HOWE,
    "Australia/Sydney",
    "America/Santiago",  # transitions at midnight
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/St_Johns",  # -03:30 / -02:30
    "America/Nuuk",  # transitions at 22:00/23:00 local
    "Asia/Kolkata",  # no DST
    "Pacific/Apia",  # skipped 2011-12-30 entirely (24 h gap)
    "UTC",
]


def _offset_s(tz: ZoneInfo, at_s: int) -> int:
    off = datetime.fromtimestamp(at_s, tz).utcoffset()
    assert off is not None
    return int(off.total_seconds())


@cache
def transitions(tz_name: str) -> tuple[int, ...]:
    """Offset changes (epoch s) of a zone in 2010-2031, by daily probes and bisection."""
    tz = ZoneInfo(tz_name)
    found = []
    start = int(datetime(2010, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(2031, 1, 1, tzinfo=UTC).timestamp())
    prev = _offset_s(tz, start)
    for t in range(start + 86_400, end, 86_400):
        cur = _offset_s(tz, t)
        if cur != prev:
            lo, hi = t - 86_400, t
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset_s(tz, mid) == prev:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        prev = cur
    return tuple(found)


def oracle(expr: CronExpr, tz_name: str, after_ms: int, until_ms: int) -> list[int]:
    """Occurrences in (after, until] by walking every wall time (minute by minute,
    or second by second for expressions with seconds) and applying the rules:
    gap -> fold=0; repeat -> fold=0 only, both folds when the hour field is full."""
    tz = ZoneInfo(tz_name)
    step = 60 if expr.seconds == 1 else 1
    margin = timedelta(days=1, hours=2) if step == 60 else timedelta(hours=2)
    wall = datetime.fromtimestamp(after_ms // 1000, tz).replace(tzinfo=None) - margin
    wall -= timedelta(seconds=wall.second)
    last = datetime.fromtimestamp(until_ms // 1000, tz).replace(tzinfo=None) + margin
    found: set[int] = set()
    every_hour = all(expr.hours >> h & 1 for h in range(24))
    while wall <= last:
        if expr.matches(wall):
            first = wall.replace(tzinfo=tz, fold=0)
            second = wall.replace(tzinfo=tz, fold=1)
            instants = [first.timestamp()]
            repeated = first.utcoffset() != second.utcoffset() and (
                first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall
            )
            if repeated and every_hour:
                instants.append(second.timestamp())
            for inst in instants:
                ms = int(inst) * 1000
                if after_ms < ms <= until_ms:
                    found.add(ms)
        wall += timedelta(seconds=step)
    return sorted(found)


def _field(lo: int, hi: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi).map(str)
    if names:
        value = value | st.sampled_from(names)
    single = value
    span = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(
        lambda ab: f"{min(ab)}-{max(ab)}"
    )
    stepped = st.tuples(st.sampled_from(["*", f"{lo}-{hi}"]), st.integers(1, hi - lo + 1)).map(
        lambda bs: f"{bs[0]}/{bs[1]}"
    )
    item = single | span | stepped
    listed = st.lists(item, min_size=1, max_size=4).map(",".join)
    return st.sampled_from(["*"]) | stepped | listed


@st.composite
def expressions(draw: st.DrawFn, *, seconds: bool = False) -> str:
    dense = draw(st.booleans())  # half the time, keep day fields open so windows have hits
    sec = draw(_field(0, 59)) if seconds else None
    minute = draw(_field(0, 59))
    hour = draw(_field(0, 23))
    if dense:
        dom, month, dow = "*", "*", draw(st.sampled_from(["*", "*", "MON-FRI", "0,6"]))
    else:
        dom = draw(_field(1, 31))
        month = draw(_field(1, 12, ("JAN", "MAR", "OCT", "NOV", "DEC")))
        dow = draw(_field(0, 7, ("SUN", "MON", "FRI", "SAT")))
    fields = [minute, hour, dom, month, dow]
    return " ".join([sec, *fields] if sec is not None else fields)


@st.composite
def instants_near_transitions(draw: st.DrawFn, tz_name: str) -> int:
    """Epoch ms, usually within a day of one of the zone's transitions."""
    changes = transitions(tz_name)
    near = draw(st.integers(0, 4)) > 0  # four times in five
    if changes and near:
        base = draw(st.sampled_from(list(changes)))
        return (base + draw(st.integers(-86_400, 86_400))) * 1000 + draw(st.integers(0, 999))
    return draw(st.integers(utc("1971-01-01T00:00"), utc("2099-12-31T00:00")))


SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(data=st.data(), tz_name=st.sampled_from(ORACLE_ZONES))
def test_occurrences_match_brute_force_oracle_minutes(data: st.DataObject, tz_name: str) -> None:
    expr = parse_cron(data.draw(expressions()))
    after = data.draw(instants_near_transitions(tz_name))
    until = after + 2 * 86_400_000
    assert occurrences(expr, after_ms=after, until_ms=until, tz=tz_name, limit=10_000) == oracle(
        expr, tz_name, after, until
    )


@SLOW
@given(data=st.data(), tz_name=st.sampled_from([LONDON, NEW_YORK, LORD_HOWE, "Pacific/Chatham"]))
def test_occurrences_match_brute_force_oracle_seconds(data: st.DataObject, tz_name: str) -> None:
    expr = parse_cron(data.draw(expressions(seconds=True)))
    changes = transitions(tz_name)
    after = (
        data.draw(st.sampled_from(list(changes))) + data.draw(st.integers(-7_200, 7_200))
    ) * 1000
    until = after + 3_600_000
    assert occurrences(expr, after_ms=after, until_ms=until, tz=tz_name, limit=10_000) == oracle(
        expr, tz_name, after, until
    )


def _gap_shifted_match(expr: CronExpr, tz: ZoneInfo, ms: int) -> bool:
    """``ms`` is the fold=0 image of a matching wall time inside a DST gap."""
    before = _offset_s(tz, ms // 1000 - 2 * 86_400)
    wall = datetime.fromtimestamp(ms // 1000 + before, UTC).replace(tzinfo=None)
    off0 = wall.replace(tzinfo=tz, fold=0).utcoffset()
    off1 = wall.replace(tzinfo=tz, fold=1).utcoffset()
    assert off0 is not None
    assert off1 is not None
    return expr.matches(wall) and off0 < off1


@settings(max_examples=300, deadline=None)
@given(data=st.data(), tz_name=st.sampled_from(ORACLE_ZONES), seconds=st.booleans())
def test_occurrence_properties(data: st.DataObject, tz_name: str, seconds: bool) -> None:
    expr = parse_cron(data.draw(expressions(seconds=seconds)))
    after = data.draw(instants_near_transitions(tz_name))
    tz = ZoneInfo(tz_name)
    got = occurrences(expr, after_ms=after, until_ms=after + 40 * 86_400_000, tz=tz_name, limit=50)
    assume(got)
    assert got[0] > after
    assert all(a < b for a, b in pairwise(got))  # strictly increasing
    prev = after
    for ms in got:
        assert ms % 1000 == 0
        assert next_fire(expr, after_ms=prev, tz=tz_name) == ms
        local = datetime.fromtimestamp(ms / 1000, tz).replace(tzinfo=None)
        assert expr.matches(local) or _gap_shifted_match(expr, tz, ms)
        prev = ms


@settings(max_examples=300, deadline=None)
@given(
    expr=expressions(seconds=True) | expressions(),
    tz_name=st.sampled_from(ORACLE_ZONES),
    after=st.integers(0, utc("2200-01-01T00:00")),
)
def test_next_fire_is_strictly_after(expr: str, tz_name: str, after: int) -> None:
    nxt = next_fire(parse_cron(expr), after_ms=after, tz=tz_name)
    assert nxt is None or nxt > after


# ------------------------------------------------------------ zone suggestions


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("Europe/Berln", ["Europe/Berlin"]),
        ("europe/paris", ["Europe/Paris"]),
        ("America/New York", ["America/New_York"]),
        ("Asia/Tokio", ["Asia/Tokyo"]),
        ("Paris", ["Europe/Paris"]),
        ("UTC+2", ["Etc/GMT-2"]),  # tzdata's Etc signs are inverted
        ("gmt-5", ["Etc/GMT+5"]),
        ("UTC+99", []),
        ("Mars/Olympus_Mons", []),
        ("", []),
        ("Europe/London", []),  # a zone needs no suggestion
    ],
)
def test_zone_suggestions(typed: str, suggested: list[str]) -> None:
    assert zone_suggestions(typed) == suggested


def test_a_typo_in_a_zone_gets_a_suggestion_in_the_error() -> None:
    with pytest.raises(InvalidInput, match=r"did you mean 'Europe/Berlin'\?") as info:
        zone("Europe/Berln")
    assert info.value.field == "timezone"
