"""Token buckets for rate limits (pure: the time is an argument).

A limit of R jobs/s is shared across a consumer group by partition share: a
member owning k of P partitions runs its bucket at ``R * k / P``, recomputed
on every assignment change (:func:`share_of`). When the bucket is empty the
caller learns how long to wait and pauses its partitions for that long: it
never spins.
"""

from __future__ import annotations

# Seconds of tokens a bucket may hold: a short burst after an idle period,
# small enough that the rate measured over a few seconds stays close to R.
BURST_S = 0.1
# A wait computed as (1 - tokens) / rate refills to 0.99999...: count that as one.
_ONE = 1.0 - 1e-9


def share_of(rate: float, *, owned: int, total: int) -> float:
    """This member's part of a group-wide ``rate`` when it owns ``owned`` of ``total``."""
    if total <= 0 or owned <= 0:
        return 0.0
    return rate * min(owned, total) / total


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` banked; starts full."""

    __slots__ = ("_capacity", "_last", "_rate", "_tokens")

    def __init__(self, rate: float, *, now: float, capacity: float | None = None) -> None:
        self._rate = rate
        self._capacity = capacity if capacity is not None else _capacity(rate)
        self._tokens = self._capacity
        self._last = now

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate: float, *, now: float) -> None:
        """Change the rate (tokens already earned are kept, up to the new capacity)."""
        self._refill(now)
        self._rate = rate
        self._capacity = _capacity(rate)
        self._tokens = min(self._tokens, self._capacity)

    def try_take(self, now: float) -> float:
        """Take one token: 0.0 when taken, else the seconds until one is available.

        A bucket with rate 0 (no partitions owned) never gives a token; it
        answers with a long wait (1 s) so the caller checks again later.
        """
        self._refill(now)
        if self._tokens >= _ONE:
            self._tokens = max(0.0, self._tokens - 1.0)
            return 0.0
        if self._rate <= 0:
            return 1.0
        return (1.0 - self._tokens) / self._rate

    def refund(self) -> None:
        """Give back a token taken for a job that could not start after all."""
        self._tokens = min(self._capacity, self._tokens + 1.0)

    def _refill(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)
            self._last = now


def _capacity(rate: float) -> float:
    return max(1.0, rate * BURST_S)


class QueueRates:
    """The buckets of one queue: the queue's limit and each task's, by partition share."""

    def __init__(
        self,
        queue_rate: float | None,
        *,
        task_rates: dict[str, float],
        partitions: int,
        now: float,
    ) -> None:
        self._queue_rate = queue_rate
        self._partitions = partitions
        self._owned = 0
        self.queue: TokenBucket | None = (
            TokenBucket(0.0, now=now) if queue_rate is not None else None
        )
        self._tasks = {name: (rate, TokenBucket(0.0, now=now)) for name, rate in task_rates.items()}

    @property
    def limited(self) -> bool:
        """Is any limit configured (else the worker skips token checks entirely)."""
        return self.queue is not None or bool(self._tasks)

    def set_owned(self, owned: int, *, now: float) -> None:
        """This member owns ``owned`` partitions now: rescale every bucket."""
        self._owned = owned
        if self.queue is not None and self._queue_rate is not None:
            self.queue.set_rate(self._share(self._queue_rate), now=now)
        for rate, bucket in self._tasks.values():
            bucket.set_rate(self._share(rate), now=now)

    def task(self, name: str) -> TokenBucket | None:
        """The bucket of task ``name``, if it has a limit."""
        entry = self._tasks.get(name)
        return None if entry is None else entry[1]

    def _share(self, rate: float) -> float:
        return share_of(rate, owned=self._owned, total=self._partitions)
