"""Timers waiting to fire, in key order ``(due, partition, offset)``.

The emitter's heap of timers, bucketed by due millisecond: a binary heap of
the distinct due times and, per due time, the list of its timers. Many
timers share a millisecond in a backlog or a burst, and a heap of small
integers is much cheaper to keep than one of tuples: a timer costs a list
append to push, and a bucket is sorted once, when it fires.
"""

from __future__ import annotations

import heapq
from typing import Any

# (partition, offset, *payload): ordered by partition and offset within a bucket.
# A (partition, offset) pair is in the queue at most once.
Entry = tuple[Any, ...]


class DueQueue:
    """Entries ``(partition, offset, ...)`` keyed by due time; earliest due first."""

    __slots__ = ("_buckets", "_dues", "_size")

    def __init__(self) -> None:
        self._dues: list[int] = []  # heap of the distinct due times
        self._buckets: dict[int, list[Entry]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, due: int, entry: Entry) -> int:
        """Add ``entry`` due at ``due``; return the number of entries now held."""
        bucket = self._buckets.get(due)
        if bucket is None:
            self._buckets[due] = [entry]
            heapq.heappush(self._dues, due)
        else:
            bucket.append(entry)
        self._size += 1
        return self._size

    def first_due(self) -> int | None:
        """The earliest due time, or None when empty."""
        dues = self._dues
        return dues[0] if dues else None

    def pop_bucket(self, limit: int) -> tuple[int, list[Entry]] | None:
        """Remove and return the earliest due time and its entries, in partition and
        offset order, if it is at most ``limit``."""
        dues = self._dues
        if not dues or dues[0] > limit:
            return None
        due = heapq.heappop(dues)
        bucket = self._buckets.pop(due)
        self._size -= len(bucket)
        if len(bucket) > 1:
            bucket.sort()  # by (partition, offset): unique, so the payload is never compared
        return due, bucket

    def put_back(self, due: int, entries: list[Entry]) -> None:
        """Return entries taken with :meth:`pop_bucket` that were not used."""
        if not entries:
            return
        bucket = self._buckets.get(due)
        if bucket is None:
            self._buckets[due] = list(entries)
            heapq.heappush(self._dues, due)
        else:
            bucket.extend(entries)
        self._size += len(entries)
