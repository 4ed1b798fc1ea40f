"""Cron occurrences as instants: wall-clock matches read in an IANA time zone.

An expression matches *wall-clock* times of its zone; an occurrence is the
UTC instant (epoch milliseconds) of a matching wall time. Most wall times
exist exactly once. Around DST (and other offset) transitions:

Gap (spring forward; the wall time does not exist)
    It fires at the instant the wall time would have had with the offset in
    force *before* the transition (PEP 495 ``fold=0``), i.e. shifted forward by
    the size of the gap. London, 2024-03-31, clocks go 01:00 GMT -> 02:00 BST:
    ``30 1 * * *`` fires at 02:30 BST (01:30 UTC). Lord Howe's 30-minute gap
    (02:00 -> 02:30): ``15 2 * * *`` fires at 02:45 (+11:00).

Repeat (fall back; the wall time happens twice)
    It fires once, at the first occurrence (``fold=0``), unless the hour field
    allows every hour (``*``, ``*/1``, ``0-23``): then each real instant fires,
    so hourly and every-N-minutes schedules keep their period through the
    change. London, 2024-10-27, 02:00 BST -> 01:00 GMT: ``30 1 * * *`` fires
    at 01:30 BST only (00:30 UTC); ``*/15 * * * *`` fires at 01:00, 01:15, ...
    BST and again at 01:00, 01:15, ... GMT, every 15 real minutes.

Equal instants coalesce: a schedule never fires twice at the same instant
(a gap-shifted 01:30 and a real 02:30 are one occurrence), so occurrences
strictly increase.

How ``next_fire`` stays fast: it finds the first matching wall time at or
after the wall time of the start instant by skipping over fields
(``CronExpr.next_wall``), then resolves it with ``zoneinfo``; only near a
transition does it look further (a gap just before the start, a repeat just
after it, or an earlier real wall time after a gap), locating the transition
by bisection. That is exact when zone transitions are more than two days
apart and move the clock by at most a day: true of every zone in tzdata since
1970 (closest transitions 6.9 days apart, largest change 24 hours).
"""

from __future__ import annotations

import difflib
import re
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from dueflow.errors import InvalidInput
from dueflow.rules.cron_expr import CronExpr, wall_fields

# Instants handled: from a day before 1970 to 9000-01-01 (ms).
MIN_MS = -86_400_000
MAX_MS = 221_845_392_000_000
_PROBE_S = 2 * 86_400  # > largest offset change (24 h), < half the closest transitions
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*")
_ZONE_ACCEPTED = "an IANA zone name such as Europe/London"
# Names in the zone database that are not zones or depend on the machine.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones()) - _NOT_ZONES


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    if len(name) > 64 or not _ZONE_NAME.fullmatch(name) or name not in _known_zones():
        raise InvalidInput("timezone", name, _ZONE_ACCEPTED + zone_hint(name))
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput("timezone", name, _ZONE_ACCEPTED) from None


_FIXED_OFFSET = re.compile(r"(?:UTC|GMT)([+-])(\d{1,2})", re.IGNORECASE)


def zone_suggestions(name: str, *, limit: int = 1) -> list[str]:
    """Zone names close to ``name`` (a typo, another case, spaces for underscores, a
    city alone), best first: ``Europe/Berln`` -> ``["Europe/Berlin"]``. ``UTC+2`` ->
    ``["Etc/GMT-2"]`` (tzdata's Etc zones have POSIX signs: inverted)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        return []
    if name in _known_zones():
        return []
    known = sorted(_known_zones())
    wanted = name.strip().replace(" ", "_")
    by_lower = {z.lower(): z for z in known}
    exact = by_lower.get(wanted.lower())
    if exact is not None and exact != name:
        return [exact]
    offset = _FIXED_OFFSET.fullmatch(wanted)
    if offset is not None:
        etc = f"Etc/GMT{'-' if offset.group(1) == '+' else '+'}{int(offset.group(2))}"
        return [etc] if etc in _known_zones() else []
    close = difflib.get_close_matches(wanted.lower(), list(by_lower), n=limit, cutoff=0.75)
    if not close and "/" not in wanted:  # "Paris" -> the zones of that city
        close = [z for z in by_lower if z.rsplit("/", 1)[-1] == wanted.lower()][:limit]
    return [by_lower[z] for z in close]


def zone_hint(name: str) -> str:
    """``"; did you mean 'Europe/Berlin'?"`` for a near miss, else ``""``."""
    found = zone_suggestions(name)
    if not found:
        return ""
    note = ""
    if found[0].startswith("Etc/GMT"):
        note = f" ({name.strip()}: the signs of tzdata's Etc zones are inverted)"
    return "; did you mean " + " or ".join(repr(z) for z in found) + note + "?"


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; raises ``InvalidInput("timezone", ...)`` otherwise
    (``""``, ``"UTC+2"``, ``"../etc"``, ``"localtime"``...)."""
    if not isinstance(name, str):
        raise InvalidInput("timezone", name, _ZONE_ACCEPTED)
    return _zone(name)


def _as_zone(tz: str | ZoneInfo) -> ZoneInfo:
    return tz if isinstance(tz, ZoneInfo) else zone(tz)


def _check_ms(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_MS <= value <= MAX_MS:
        raise InvalidInput(name, value, f"an integer epoch millisecond in [{MIN_MS}, {MAX_MS}]")


def _seconds(off: timedelta | None) -> int:
    if off is None:  # pragma: no cover - a ZoneInfo always has an offset
        raise TypeError("zone returned no UTC offset")
    return off.days * 86_400 + off.seconds


def _offset(tz: ZoneInfo, instant: int) -> int:
    """UTC offset (s) in force at ``instant`` (epoch s)."""
    return _seconds(datetime.fromtimestamp(instant, tz).utcoffset())


def _wall_offsets(tz: ZoneInfo, wall: int) -> tuple[int, int]:
    """Offsets (s) of a wall time with fold=0 and fold=1: equal for a normal
    time, fold0 < fold1 in a gap, fold0 > fold1 in a repeat (PEP 495)."""
    local = datetime(*wall_fields(wall), tzinfo=tz)
    return _seconds(local.utcoffset()), _seconds(local.replace(fold=1).utcoffset())


def _transition(tz: ZoneInfo, lo: int, hi: int) -> int:
    """The instant in ``(lo, hi]`` where the offset changes (exactly one change)."""
    before = _offset(tz, lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(tz, mid) == before:
            lo = mid
        else:
            hi = mid
    return hi


def _instants(expr: CronExpr, wall: int, off0: int, off1: int) -> tuple[int, ...]:
    """The instants (s) at which the matching wall time ``wall`` fires, given
    its fold=0 and fold=1 offsets."""
    if off0 <= off1 or not expr.every_hour:  # normal, gap (fold=0), or repeat fired once
        return (wall - off0,)
    return (wall - off0, wall - off1)  # repeat, every hour: both real instants


def _first_from(expr: CronExpr, tz: ZoneInfo, t0: int) -> int | None:
    """The first occurrence at or after instant ``t0`` (epoch s)."""
    off = _offset(tz, t0)
    w0 = t0 + off  # wall time at t0
    best: int | None = None

    # A spring-forward gap shortly before t0: its wall times lie before w0 but
    # fire (shifted) at or after t0.
    off_before = _offset(tz, t0 - _PROBE_S)
    if off_before < off:
        wall = expr.next_wall(t0 + off_before)
        if wall is not None and wall < w0:
            off0, off1 = _wall_offsets(tz, wall)
            if off0 < off1 and wall - off0 >= t0:
                best = wall - off0

    # A fall-back shortly after t0, every-hour expressions: the second pass of
    # the repeated wall times starts before w0.
    if expr.every_hour:
        off_after = _offset(tz, t0 + _PROBE_S)
        if off_after < off:
            change = _transition(tz, t0, t0 + _PROBE_S)
            wall = expr.next_wall(change + off_after)
            if wall is not None and wall < w0:
                best = _earliest(best, wall - off_after)

    # From w0 on, wall order is instant order except right after a gap.
    wall = expr.next_wall(w0)
    while wall is not None:
        off0, off1 = _wall_offsets(tz, wall)
        found = [i for i in _instants(expr, wall, off0, off1) if i >= t0]
        if found:
            best = _earliest(best, min(found))
            if off0 < off1:
                # A gap wall fires shifted; the first real wall after the gap may come first.
                change = _transition(tz, wall - off1, wall - off0)
                after_gap = expr.next_wall(change + off1)
                if after_gap is not None:
                    offs = _wall_offsets(tz, after_gap)
                    later = [i for i in _instants(expr, after_gap, *offs) if i >= t0]
                    if later:
                        best = _earliest(best, min(later))
            return best
        if off0 > off1:
            # Second pass of a repeat, fired once only: skip to the end of the repeat.
            change = _transition(tz, wall - off0, wall - off1)
            wall = expr.next_wall(change + off0)
        else:  # pragma: no cover - unreachable with well-spaced transitions
            wall = expr.next_wall(wall + 1)
    return best


def _earliest(a: int | None, b: int) -> int:
    return b if a is None or b < a else a


def next_fire(expr: CronExpr, *, after_ms: int, tz: str | ZoneInfo) -> int | None:
    """First occurrence strictly after ``after_ms`` (UTC epoch ms), with the
    expression read in the wall clock of ``tz``; None if it never fires again.

    Occurrences are whole seconds. DST gaps and repeats follow the rules of
    this module's docstring.
    """
    _check_ms("after_ms", after_ms)
    found = _first_from(expr, _as_zone(tz), after_ms // 1000 + 1)
    return None if found is None else found * 1000


def occurrences(
    expr: CronExpr, *, after_ms: int, until_ms: int, tz: str | ZoneInfo, limit: int
) -> list[int]:
    """Occurrences in ``(after_ms, until_ms]``, ascending, at most ``limit``."""
    _check_ms("until_ms", until_ms)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidInput("limit", limit, "an integer >= 0")
    zone_info = _as_zone(tz)
    out: list[int] = []
    at = after_ms
    while len(out) < limit:
        nxt = next_fire(expr, after_ms=at, tz=zone_info)
        if nxt is None or nxt > until_ms:
            break
        out.append(nxt)
        at = nxt
    return out


__all__ = ["MAX_MS", "MIN_MS", "next_fire", "occurrences", "zone"]
