"""Which offset of a partition the worker may commit (pure).

Jobs of one partition finish out of order (a slow job next to fast ones).
The committed offset is the next record a new owner reads, so it must never
pass a record that has not finished: it is the lowest unfinished offset
(:class:`dueflow.rules.open_offsets.OpenOffsets`), or one past the last record seen
when everything seen has finished.
"""

from __future__ import annotations

from collections.abc import Callable

from dueflow.rules.open_offsets import OpenOffsets


class OffsetTracker:
    """Offsets seen and finished in one partition, in delivery order.

    ``start`` is the offset the partition is read from (its committed offset);
    offsets are added in increasing order, as Kafka delivers them (checked).
    """

    __slots__ = ("_next", "_open", "finish")

    def __init__(self, start: int | None = None) -> None:
        self._open = OpenOffsets()
        self._next = start
        # finish(offset): the record at ``offset`` finished (its outcome is in a
        # commit batch). Once per job: the bound method of a builtin.
        self.finish: Callable[[int], None] = self._open.finish

    def add(self, offset: int) -> None:
        """A record at ``offset`` was delivered and is now unfinished."""
        if self._next is not None and offset < self._next:
            raise ValueError(f"offset {offset} delivered after {self._next - 1}")
        self._open.add(offset)
        self._next = offset + 1

    def extend(self, offsets: list[int]) -> None:
        """Records at ``offsets`` (increasing, after the last one seen) were delivered."""
        if not offsets:
            return
        if self._next is not None and offsets[0] < self._next:
            raise ValueError(f"offset {offsets[0]} delivered after {self._next - 1}")
        self._open.extend(offsets)
        self._next = offsets[-1] + 1

    @property
    def read_to(self) -> int | None:
        """One past the last offset delivered (the start before any); None if unknown."""
        return self._next

    def committable(self) -> int | None:
        """The offset to commit: the lowest unfinished, else one past the last seen.

        ``None`` when nothing was seen and no start is known.
        """
        return self._open.lowest(self._next)

    @property
    def unfinished(self) -> int:
        """How many records are delivered and not finished."""
        return len(self._open)
