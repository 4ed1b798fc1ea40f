"""A token bucket (pure: the time is an argument, in the caller's unit).

The emitter limits its catch-up fire rate with one (time in milliseconds);
the worker its queue and task rate limits (time in seconds, see
``dueflow.consumers.ratelimit``). ``rate`` is tokens per unit of ``now``.
"""

from __future__ import annotations

# try_take: a wait computed as (1 - tokens) / rate refills to 0.99999...: count
# that as one.
_ONE = 1.0 - 1e-9


class TokenBucket:
    """``rate`` tokens per unit of time, at most ``capacity`` banked; starts full."""

    __slots__ = ("_at", "_capacity", "_rate", "_tokens")

    def __init__(self, rate: float, *, capacity: float, now: float) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0 tokens per unit of time, not {rate}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, not {capacity}")
        self._rate = rate
        self._capacity = float(capacity)
        self._tokens = self._capacity
        self._at = now

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate: float, *, capacity: float, now: float) -> None:
        """Change the rate and capacity (tokens already earned are kept, up to it)."""
        self._refill(now)
        self._rate = rate
        self._capacity = float(capacity)
        self._tokens = min(self._tokens, self._capacity)

    def available(self, now: float) -> int:
        """Whole tokens available at ``now``."""
        self._refill(now)
        return int(self._tokens)

    def take(self, count: int) -> None:
        """Spend ``count`` tokens (after :meth:`available` said they are there)."""
        self._tokens -= count

    def wait(self, now: float) -> int:
        """Whole units of time until one token is available (0: one is)."""
        if self.available(now) >= 1:
            return 0
        return int((1.0 - self._tokens) / self._rate) + 1

    def try_take(self, now: float) -> float:
        """Take one token: 0.0 when taken, else the time until one is available.

        A bucket with rate 0 never gives a token; it answers with a wait of 1
        so the caller checks again later.
        """
        self._refill(now)
        if self._tokens >= _ONE:
            self._tokens = max(0.0, self._tokens - 1.0)
            return 0.0
        if self._rate <= 0:
            return 1.0
        return (1.0 - self._tokens) / self._rate

    def refund(self) -> None:
        """Give back a token taken for something that could not start after all."""
        self._tokens = min(self._capacity, self._tokens + 1.0)

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
            self._at = now
