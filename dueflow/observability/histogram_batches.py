"""Histogram observations in batches: one lock round per bucket rather than one per
value (workers and the emitter observe thousands of values at a time)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from prometheus_client import Histogram


def observe_many(histogram: Histogram, samples: Iterable[float]) -> None:
    """``histogram.observe(v)`` for each value, with one lock round per bucket.

    Workers record a duration per job; at tens of thousands of jobs per
    second, observing them one by one costs a microsecond each. This adds
    them up per bucket first (using the client's per-bucket counters when
    it has them, else plain ``observe``).
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in samples:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    summed = 0.0
    index = bisect.bisect_left
    for value in samples:
        summed += value
        counts[index(bounds, value)] += 1
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    total.inc(summed)


def observe_ages(histogram: Histogram, now_ms: int, starts_ms: list[int]) -> None:
    """``histogram.observe(max(0, now_ms - start) / 1000)`` for each start, in seconds.

    For a batch that ends at one instant (the emitter's lateness at commit):
    the starts are sorted once and each bucket's count is one bisection, so a
    batch of thousands costs about as much as a sort.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        observe_many(histogram, [max(0, now_ms - s) / 1000.0 for s in starts_ms])
        return
    starts = sorted(starts_ms)
    n = len(starts)
    below = 0  # counted in lower buckets (the smallest ages: the latest starts)
    for bound, bucket in zip(bounds, buckets, strict=True):
        within = (
            n if bound == float("inf") else n - bisect.bisect_left(starts, now_ms - _max_ms(bound))
        )
        if within > below:
            bucket.inc(within - below)
            below = within
    overdue = bisect.bisect_left(starts, now_ms)  # starts before now: a positive age
    total.inc((overdue * now_ms - sum(starts[:overdue])) / 1000.0)


def _max_ms(bound_s: float) -> int:
    """The largest whole number of milliseconds ``a`` with ``a / 1000 <= bound_s``."""
    a = int(bound_s * 1000)
    while (a + 1) / 1000.0 <= bound_s:
        a += 1
    while a / 1000.0 > bound_s:
        a -= 1
    return a
