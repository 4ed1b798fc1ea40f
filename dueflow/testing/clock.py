"""A clock that moves only when a test moves it."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from dueflow.errors import InvalidInput
from dueflow.timeutil import format_utc, from_utc_ms, to_utc_ms

# 2030-01-01T00:00:00Z: a fixed start, so ids, due times and cron occurrences
# are the same on every run.
DEFAULT_START_MS = 1_893_456_000_000


class FakeClock:
    """UTC epoch milliseconds that stay put until :meth:`advance` or :meth:`set`.

    Callable (``clock()`` is the time in ms), so it is what the scheduling
    client takes as ``clock=``. Moving it runs nothing by itself: the
    :class:`~dueflow.testing.InMemoryPipeline` runs what came due when asked
    (``run_due``), or walks through every due time (``advance``).
    """

    def __init__(self, start: datetime | str | int | None = None) -> None:
        self._ms = _instant_ms(start, "start") if start is not None else DEFAULT_START_MS
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._ms

    def now_ms(self) -> int:
        return self._ms

    @property
    def now(self) -> datetime:
        """The time as a tz-aware UTC datetime."""
        return from_utc_ms(self._ms)

    def advance(
        self,
        seconds: float = 0,
        *,
        minutes: float = 0,
        hours: float = 0,
        days: float = 0,
        ms: int = 0,
    ) -> int:
        """Move forward (never back); return the new time in ms."""
        step = timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        delta = int(step / timedelta(milliseconds=1)) + ms
        if delta < 0:
            raise InvalidInput("advance", delta, "a step >= 0 (the clock never goes back)")
        with self._lock:
            self._ms += delta
            return self._ms

    def set(self, instant: datetime | str | int) -> int:
        """Move to ``instant`` (a tz-aware datetime, ISO-8601 text or epoch ms, not
        before now); return it in ms."""
        target = _instant_ms(instant, "instant")
        with self._lock:
            if target < self._ms:
                raise InvalidInput(
                    "instant", instant, f"a time at or after now ({format_utc(self._ms)})"
                )
            self._ms = target
            return target

    def __repr__(self) -> str:
        return f"FakeClock({format_utc(self._ms)})"


def _instant_ms(value: datetime | str | int, field: str) -> int:
    if isinstance(value, bool):
        raise InvalidInput(field, value, "a tz-aware datetime, ISO-8601 text or epoch ms")
    if isinstance(value, int):
        return value
    return to_utc_ms(value, field=field)
