"""Where an operator command starts and stops (pure): times and offsets from the shell.

A bound is an offset (digits only, e.g. ``1200``), an instant (ISO-8601 with
an offset, ``2030-01-01T09:00:00Z``) or a duration meaning "that long ago"
(``30m``, ``2h``, ``1d``). Nothing reads the clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow.errors import InvalidInput
from dueflow.timeutil import parse_duration, to_utc_ms

ACCEPTED = "an offset (digits), an ISO-8601 time with an offset, or a duration ago (30m, 2h)"


@dataclass(frozen=True, slots=True)
class Bound:
    """An offset or a time (UTC epoch ms); exactly one is set."""

    offset: int | None = None
    time_ms: int | None = None


def parse_time(text: str, *, field: str, now_ms: int) -> int:
    """An instant or a duration ago, as UTC epoch ms."""
    value = text.strip()
    if not value:
        raise InvalidInput(field, text, "an ISO-8601 time with an offset or a duration ago")
    if value[0].isdigit() and ("-" in value[1:] or "T" in value):
        return to_utc_ms(value, field=field)
    if value.isdigit():
        raise InvalidInput(field, text, "a time: an ISO-8601 time or a duration ago with a unit")
    try:
        return now_ms - parse_duration(value, field=field)
    except InvalidInput:
        return to_utc_ms(value, field=field)


def parse_bound(text: str, *, field: str, now_ms: int) -> Bound:
    """A :class:`Bound` from the shell."""
    value = text.strip()
    if value.isdigit():
        return Bound(offset=int(value))
    try:
        return Bound(time_ms=parse_time(value, field=field, now_ms=now_ms))
    except InvalidInput:
        raise InvalidInput(field, text, ACCEPTED) from None
