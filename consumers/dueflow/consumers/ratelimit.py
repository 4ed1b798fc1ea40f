"""Token buckets for rate limits (pure: the time is an argument).

A limit of R jobs/s is shared across a consumer group by partition share: a
member owning k of P partitions runs its bucket at ``R * k / P``, recomputed
on every assignment change (:func:`share_of`). When the bucket is empty the
caller learns how long to wait and pauses its partitions for that long: it
never spins.
"""

from __future__ import annotations

from dueflow.rules.token_bucket import TokenBucket

# Seconds of tokens a bucket may hold: a short burst after an idle period,
# small enough that the rate measured over a few seconds stays close to R.
BURST_S = 0.1


def share_of(rate: float, *, owned: int, total: int) -> float:
    """This member's part of a group-wide ``rate`` when it owns ``owned`` of ``total``."""
    if total <= 0 or owned <= 0:
        return 0.0
    return rate * min(owned, total) / total


def _capacity(rate: float) -> float:
    return max(1.0, rate * BURST_S)


def rate_bucket(rate: float, *, now: float) -> TokenBucket:
    """A full bucket of ``rate`` tokens per second (time in seconds), holding
    :data:`BURST_S` seconds of them (at least one)."""
    return TokenBucket(rate, capacity=_capacity(rate), now=now)


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
            rate_bucket(0.0, now=now) if queue_rate is not None else None
        )
        self._tasks = {name: (rate, rate_bucket(0.0, now=now)) for name, rate in task_rates.items()}

    @property
    def limited(self) -> bool:
        """Is any limit configured (else the worker skips token checks entirely)."""
        return self.queue is not None or bool(self._tasks)

    def set_owned(self, owned: int, *, now: float) -> None:
        """This member owns ``owned`` partitions now: rescale every bucket."""
        self._owned = owned
        if self.queue is not None and self._queue_rate is not None:
            share = self._share(self._queue_rate)
            self.queue.set_rate(share, capacity=_capacity(share), now=now)
        for rate, task_bucket in self._tasks.values():
            share = self._share(rate)
            task_bucket.set_rate(share, capacity=_capacity(share), now=now)

    def task(self, name: str) -> TokenBucket | None:
        """The bucket of task ``name``, if it has a limit."""
        entry = self._tasks.get(name)
        return None if entry is None else entry[1]

    def _share(self, rate: float) -> float:
        return share_of(rate, owned=self._owned, total=self._partitions)
