"""How far this process's clock is from the broker's (pure).

dueflow's times (due times, a retry's "not before") are wall-clock
milliseconds, and "never early" is judged on one clock: the brokers'. A
process whose clock runs ahead would start jobs early; one that runs behind
would stamp a retry's "not before" too early. So the emitter and the workers
measure their offset to the broker and correct for it.

A sample is one record produced to a ``LogAppendTime`` topic: sent at local
time ``s``, appended by the broker at broker time ``a`` (returned in the
acknowledgement), acknowledged at local time ``r``. The broker appended it
between send and acknowledgement, so the offset ``theta = local - broker``
lies in ``[s - a, r - a]``. Over many samples the bounds tighten to about
the shortest round trip:

- ``upper`` (min of ``r - a``): ``local - upper`` is never later than the
  broker's time: a job may start when ``local - upper >= due``;
- ``lower`` (max of ``s - a``): ``local - lower`` is never earlier than the
  broker's time: stamps that must not be early (a retry's "not before")
  use it.

Samples are kept in buckets of ``bucket_ms`` for ``buckets`` buckets, so a
clock that is stepped (NTP) is followed within that window. Before the first
sample the offset is taken as 0 (as if the clocks agreed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    start_ms: int
    upper: int
    lower: int


class ClockOffset:
    """Bounds of ``local - broker`` (ms) from recent samples."""

    def __init__(self, *, bucket_ms: int = 10_000, buckets: int = 3) -> None:
        self._bucket_ms = bucket_ms
        self._buckets: deque[_Bucket] = deque(maxlen=buckets)
        self.upper = 0
        self.lower = 0
        self.samples = 0

    def add(self, *, sent_ms: int, appended_ms: int, acked_ms: int) -> None:
        """One acknowledged record: sent and acknowledged locally, appended by the broker."""
        if acked_ms < sent_ms:
            return  # the local clock went back meanwhile: says nothing
        upper = acked_ms - appended_ms
        lower = sent_ms - appended_ms
        start = acked_ms - acked_ms % self._bucket_ms
        buckets = self._buckets
        if buckets and buckets[-1].start_ms == start:
            b = buckets[-1]
            b.upper = min(b.upper, upper)
            b.lower = max(b.lower, lower)
        else:
            buckets.append(_Bucket(start, upper, lower))
        self.upper = min(b.upper for b in buckets)
        self.lower = max(b.lower for b in buckets)
        if self.lower > self.upper:
            # Contradicting samples (a step of the clock inside the window): the
            # newest bucket is the truth.
            self.upper, self.lower = buckets[-1].upper, buckets[-1].lower
        self.samples += 1

    def earliest_broker_ms(self, local_ms: int) -> int:
        """The earliest the broker's clock can read now: for "is it due yet?"."""
        return local_ms - self.upper

    def latest_broker_ms(self, local_ms: int) -> int:
        """The latest the broker's clock can read now: for "not before" stamps."""
        return local_ms - self.lower
