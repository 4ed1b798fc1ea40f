"""Times and durations at dueflow's doors (pure).

Everything dueflow stores is UTC epoch milliseconds. A point in time comes in
as a tz-aware :class:`~datetime.datetime` or an ISO-8601 string with an
offset (``2030-01-01T09:00:00+01:00``, ``...Z``); a naive one is rejected,
because guessing a zone is how scheduled jobs run an hour early. A duration
comes in as a :class:`~datetime.timedelta`, seconds (int or float), or text
such as ``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``, ``"2d"``.

Nothing here reads the clock: callers pass ``now_ms``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from dueflow.errors import InvalidInput

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_INSTANT_ACCEPTED = (
    "a timezone-aware datetime or an ISO-8601 string with an offset "
    "(e.g. 2030-01-01T09:00:00+01:00 or 2030-01-01T08:00:00Z)"
)
_DURATION_ACCEPTED = (
    "a timedelta, a number of seconds, or text such as '30s', '5m', '1h30m', '250ms', '2d'"
)


def to_utc_ms(value: datetime | str, *, field: str) -> int:
    """UTC epoch milliseconds of a tz-aware datetime or an ISO-8601 string with an offset.

    Raises :class:`InvalidInput` naming ``field`` for naive datetimes, strings
    without an offset and anything else.
    """
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(field, value, _INSTANT_ACCEPTED) from None
        if parsed.utcoffset() is None:
            raise InvalidInput(field, value, _INSTANT_ACCEPTED + "; this one has no offset")
        value = parsed
    elif not isinstance(value, datetime):
        raise InvalidInput(field, value, _INSTANT_ACCEPTED)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(field, value, _INSTANT_ACCEPTED + "; naive datetimes are rejected")
    delta = value - _EPOCH
    return delta.days * 86_400_000 + delta.seconds * 1_000 + delta.microseconds // 1_000


def from_utc_ms(ms: int) -> datetime:
    """The tz-aware UTC datetime of epoch milliseconds ``ms``."""
    return _EPOCH + timedelta(milliseconds=ms)


def format_utc(ms: int) -> str:
    """ISO-8601 text of epoch milliseconds in UTC, e.g. ``2030-01-01T08:00:00.000Z``."""
    return from_utc_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def show_utc(ms: object) -> str:
    """:func:`format_utc` for output: a number from another writer that is no date
    (too large, not an integer) shows as ``<n> ms (not a date)``, never raises."""
    try:
        return format_utc(ms)  # type: ignore[arg-type]
    except (OverflowError, ValueError, OSError, TypeError, InvalidInput):
        return f"{ms!r} ms (not a date)"


def parse_duration(value: timedelta | float | int | str, *, field: str) -> int:
    """A duration in whole milliseconds (>= 0); :class:`InvalidInput` names ``field``.

    Accepts a :class:`~datetime.timedelta`, seconds as int/float, or text made
    of ``<number><unit>`` parts (units ms, s, m, h, d, w), e.g. ``"1h30m"``;
    bare digits in text are seconds. Negative durations are rejected.
    """
    if isinstance(value, bool):
        raise InvalidInput(field, value, _DURATION_ACCEPTED)
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int):
        ms = value * 1_000
    elif isinstance(value, float):
        ms = _whole_ms(value * 1_000, value, field)
    elif isinstance(value, str):
        ms = _parse_duration_text(value, field)
    else:
        raise InvalidInput(field, value, _DURATION_ACCEPTED)
    if ms < 0:
        raise InvalidInput(field, value, _DURATION_ACCEPTED + "; it must not be negative")
    return ms


def _parse_duration_text(value: str, field: str) -> int:
    text = value.strip().lower().replace(" ", "")
    negative = text.startswith("-")
    if negative:
        text = text[1:]
    if not text:
        raise InvalidInput(field, value, _DURATION_ACCEPTED)
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        ms = _whole_ms(seconds * 1_000, value, field)
        return -ms if negative else ms
    pos = 0
    total = 0.0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise InvalidInput(field, value, _DURATION_ACCEPTED)
    ms = _whole_ms(total, value, field)
    return -ms if negative else ms


def _whole_ms(ms: float, value: object, field: str) -> int:
    """``ms`` rounded; NaN and values too large for a float (infinity) are refused."""
    if not math.isfinite(ms):
        raise InvalidInput(field, value, _DURATION_ACCEPTED + "; it must be finite")
    return round(ms)
