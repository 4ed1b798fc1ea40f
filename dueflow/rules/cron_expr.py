"""The cron expression language: parsing and wall-clock matching (pure core).

An expression has five fields (minute hour day-of-month month day-of-week) or
six with seconds first; five-field expressions fire at second 0. Each field is
a comma-separated list of items: ``*``, a value, a range ``a-b``, and any of
those with a step (``*/15``, ``10-50/5``, ``5/15`` = ``5-59/15``). Months and
weekdays also take names (``JAN``-``DEC``, ``SUN``-``SAT``, any case); weekday
0 and 7 are both Sunday, so ``MON-SUN`` is Monday through Sunday. Macros:
``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
``@hourly``.

Day rule (Vixie cron): when both day-of-month and day-of-week are restricted,
a day matches if EITHER matches; otherwise both must. A field is restricted
when its values are not the whole range, whatever the spelling: ``*``,
``*/1``, ``1-31`` and ``0-7`` are unrestricted, ``*/2`` is restricted. (Vixie
decides by the first character being ``*``, so there ``*/2`` counts as
unrestricted; dueflow decides by value, so equal value sets behave equally.)

This module knows nothing about time zones: it finds matching *wall-clock*
times, represented as "wall seconds" (seconds since 1970-01-01T00:00 of a
naive local calendar). ``dueflow.rules.cron_time`` maps them to instants.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache

from dueflow.errors import InvalidInput

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Searches stop at the end of this year: "never again" within the supported range.
MAX_YEAR = 9998

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
    )
}
_DAY_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_SHAPE = (
    "5 or 6 fields (minute hour day-of-month month day-of-week, optionally seconds first) "
    "or a macro (" + ", ".join(MACROS) + ")"
)


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    lo: int
    hi: int
    names: dict[str, int]
    accepted: str

    @property
    def max_step(self) -> int:
        """The largest step: the number of values in the field's range (a step that
        large selects only its start; a larger one is refused, not wrapped)."""
        return self.hi - self.lo + 1

    @property
    def step_accepted(self) -> str:
        return f"step must be an integer from 1 to {self.max_step}"


_SECOND = _FieldSpec("second", 0, 59, {}, "values 0-59")
_MINUTE = _FieldSpec("minute", 0, 59, {}, "values 0-59")
_HOUR = _FieldSpec("hour", 0, 23, {}, "values 0-23")
_DOM = _FieldSpec("day-of-month", 1, 31, {}, "values 1-31")
_MONTH = _FieldSpec("month", 1, 12, _MONTH_NAMES, "values 1-12 or JAN-DEC")
_DOW = _FieldSpec("day-of-week", 0, 7, _DAY_NAMES, "values 0-7 (0 and 7 are Sunday) or SUN-SAT")


def _full(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) & ~((1 << lo) - 1)


_ALL_HOURS = _full(0, 23)
_ALL_DAYS = _full(1, 31)
_ALL_WEEKDAYS = _full(0, 6)
# Longest month length: February may have 29 days, so Feb 30/31, Apr 31... never occur.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _next_bit(mask: int, start: int) -> int | None:
    """Smallest set bit of ``mask`` at or above ``start``."""
    rest = mask >> start
    if not rest:
        return None
    return start + (rest & -rest).bit_length() - 1


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: one bit mask of allowed values per field.

    Immutable and hashable; equality is by value (``@daily == "0 0 * * *"``),
    ``source`` is kept for messages. Weekdays use bits 0-6, Sunday = 0.
    """

    seconds: int
    minutes: int
    hours: int
    days: int
    months: int
    weekdays: int
    source: str = field(default="", compare=False)
    # weekday masks laid over a month, by the weekday of its first day (derived)
    _by_first_weekday: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        tables = []
        for first in range(7):
            mask = 0
            for day in range(1, 32):
                if self.weekdays >> ((first + day - 1) % 7) & 1:
                    mask |= 1 << day
            tables.append(mask)
        object.__setattr__(self, "_by_first_weekday", tuple(tables))

    def __str__(self) -> str:
        return self.source

    @property
    def day_of_month_restricted(self) -> bool:
        return self.days != _ALL_DAYS

    @property
    def day_of_week_restricted(self) -> bool:
        return self.weekdays != _ALL_WEEKDAYS

    @property
    def every_hour(self) -> bool:
        """True when the hour field allows all 24 hours (the DST repeat rule uses it)."""
        return self.hours == _ALL_HOURS

    @property
    def can_fire(self) -> bool:
        """False for expressions no calendar date satisfies (``0 0 30 2 *``)."""
        if self.day_of_week_restricted:
            # Every month has every weekday; with a restricted weekday field some
            # day of any allowed month matches (alone, or through the OR rule).
            return True
        return any(
            self.months >> m & 1 and self.days & _full(1, _MAX_DAYS[m]) for m in range(1, 13)
        )

    def day_mask(self, year: int, month: int) -> int:
        """Bits 1..31 of the days of ``year``-``month`` that match both day fields."""
        first_weekday = (date(year, month, 1).weekday() + 1) % 7  # cron: Sunday = 0
        by_weekday = self._by_first_weekday[first_weekday]
        if self.day_of_month_restricted and self.day_of_week_restricted:
            mask = self.days | by_weekday
        else:
            mask = self.days & by_weekday
        last = 29 if month == 2 and calendar.isleap(year) else _DAYS_IN_MONTH[month]
        return mask & ((1 << (last + 1)) - 2)

    def matches(self, wall: datetime) -> bool:
        """Whether the wall-clock fields of ``wall`` (tzinfo ignored) match."""
        return (
            bool(self.seconds >> wall.second & 1)
            and bool(self.minutes >> wall.minute & 1)
            and bool(self.hours >> wall.hour & 1)
            and bool(self.months >> wall.month & 1)
            and bool(self.day_mask(wall.year, wall.month) >> wall.day & 1)
        )

    def next_wall(self, wall: int) -> int | None:
        """First matching wall time at or after ``wall`` (wall seconds), or None.

        Skips by fields (month, then day, hour, minute, second), never second by
        second: at most a few steps per month or day visited.
        """
        if not self.can_fire:
            return None
        y, mo, d, h, mi, s = wall_fields(wall)
        while y <= MAX_YEAR:
            m = _next_bit(self.months, mo)
            if m is None:
                y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                continue
            if m != mo:
                mo, d, h, mi, s = m, 1, 0, 0, 0
            day = _next_bit(self.day_mask(y, mo), d)
            if day is None:
                y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
                d, h, mi, s = 1, 0, 0, 0
                continue
            if day != d:
                d, h, mi, s = day, 0, 0, 0
            hour = _next_bit(self.hours, h)
            if hour is None:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if hour != h:
                h, mi, s = hour, 0, 0
            minute = _next_bit(self.minutes, mi)
            if minute is None:
                h, mi, s = h + 1, 0, 0
                continue
            if minute != mi:
                mi, s = minute, 0
            second = _next_bit(self.seconds, s)
            if second is None:
                mi, s = mi + 1, 0
                continue
            return to_wall(y, mo, d, h, mi, second)
        return None


def to_wall(y: int, mo: int, d: int, h: int, mi: int, s: int) -> int:
    """Wall seconds of a naive local date and time."""
    return (date(y, mo, d).toordinal() - _EPOCH_ORDINAL) * 86_400 + h * 3_600 + mi * 60 + s


def wall_fields(wall: int) -> tuple[int, int, int, int, int, int]:
    """(year, month, day, hour, minute, second) of wall seconds."""
    days, rest = divmod(wall, 86_400)
    d = date.fromordinal(days + _EPOCH_ORDINAL)
    h, rest = divmod(rest, 3_600)
    mi, s = divmod(rest, 60)
    return d.year, d.month, d.day, h, mi, s


def _bad(expr: str, detail: str) -> InvalidInput:
    return InvalidInput("cron", expr, detail)


def _value(expr: str, spec: _FieldSpec, text: str, token: str, *, strict: bool) -> int:
    if token.isdigit() and token.isascii():
        digits = token if strict else token.lstrip("0") or "0"
        if len(digits) > len(str(spec.hi)):  # also keeps int() away from huge texts
            why = "has more digits than any value" if strict else "is out of range"
            raise _bad(
                expr, f"{spec.name} field {_short(text)}: {_short(token)} {why}; {spec.accepted}"
            )
        value = int(digits)
    elif token.upper() in spec.names:
        value = spec.names[token.upper()]
    else:
        raise _bad(
            expr,
            f"{spec.name} field {_short(text)}: {_short(token)} is not a number; {spec.accepted}",
        )
    if not spec.lo <= value <= spec.hi:
        raise _bad(expr, f"{spec.name} field {_short(text)}: {spec.accepted}")
    return value


def _step(expr: str, spec: _FieldSpec, text: str, step_text: str, *, strict: bool) -> int:
    """The step after ``/``: 1 to :attr:`_FieldSpec.max_step` in at most as many digits
    as that takes (``*/05`` is fine; ``*/0005``, ``*/61`` and ``*/99999999999999999999``
    in the minute field are not). Not ``strict`` (a stored schedule), any step >= 1 is
    read, a larger one as the largest: the same values."""
    if step_text.isdigit() and step_text.isascii():
        if not strict:
            digits = step_text.lstrip("0")
            if digits:
                return spec.max_step if len(digits) > 3 else min(int(digits), spec.max_step)
        elif len(step_text) <= len(str(spec.max_step)) and 1 <= int(step_text) <= spec.max_step:
            return int(step_text)
    raise _bad(expr, f"{spec.name} field {_short(text)}: {spec.step_accepted}")


def _short(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _parse_field(expr: str, spec: _FieldSpec, text: str, *, strict: bool) -> int:
    mask = 0
    for item in text.split(","):
        if not item:
            raise _bad(expr, f"{spec.name} field {_short(text)}: empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            step = _step(expr, spec, text, step_text, strict=strict)
        if base == "*":
            lo, hi = spec.lo, spec.hi
        elif "-" in base:
            start, _, end = base.partition("-")
            lo = _value(expr, spec, text, start, strict=strict)
            hi = _value(expr, spec, text, end, strict=strict)
            if spec is _DOW and hi == 0 and lo > 0:
                hi = 7  # MON-SUN: Sunday closes the week
            if lo > hi:
                raise _bad(
                    expr, f"{spec.name} field {_short(text)}: range start {lo} is after end {hi}"
                )
        else:
            lo = _value(expr, spec, text, base, strict=strict)
            hi = spec.hi if slash else lo
        for v in range(lo, hi + 1, step):
            mask |= 1 << v
    if spec is _DOW and mask >> 7 & 1:
        mask = (mask | 1) & ~(1 << 7)  # 7 is Sunday too
    return mask


def parse_cron(expr: str, *, strict: bool = True) -> CronExpr:
    """Parse a cron expression; raises ``InvalidInput("cron", expr, ...)`` naming
    the field and what is wrong (``minute field '61': values 0-59``).

    ``strict`` (every door: the SDK, the CLI, the test mode) refuses absurd
    numbers: a value or step with more digits than the field's largest (``0005``
    in the minute field), a step larger than the field's range (``*/61``). Not
    ``strict`` is for schedules read back from the schedules topic, which writers
    without those checks may hold: such a number is read for the values it
    selects (``0005`` is 5, a step past the range selects only its start), so a
    stored schedule keeps firing as it did.
    """
    if not isinstance(expr, str):
        raise _bad(expr, "a string: " + _SHAPE)
    return _parse(expr, strict)


@lru_cache(maxsize=4096)
def _parse(expr: str, strict: bool) -> CronExpr:
    text = expr.strip()
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise _bad(expr, f"{_SHAPE}; unknown macro {_short(text)}")
        text = macro
    parts = text.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        year = "; a year field is not supported" if len(parts) == 7 else ""
        raise _bad(expr, f"{_SHAPE}; got {len(parts)} fields{year}")
    second, minute, hour, day, month, weekday = (
        _parse_field(expr, spec, part, strict=strict)
        for spec, part in zip((_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW), parts, strict=True)
    )
    return CronExpr(second, minute, hour, day, month, weekday, source=expr.strip())


__all__ = ["MACROS", "MAX_YEAR", "CronExpr", "parse_cron", "to_wall", "wall_fields"]
