"""Which timer partitions the drainer has paused, parked or read to their end.

A paused partition is not fetched until resumed. A heap feeder is *held*: the
records the consumer delivered past the one that paused it are kept (up to a
cap shared by every partition) so that its resume needs no fetch; beyond the
cap, or for a slot partition, the consumer goes back to the offset given and
fetches them again. A *parked* partition is a slot partition read to its end
and paused until its next visit comes near.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import Message


class PartitionControl(Protocol):
    def pause(self, partition: int, next_offset: int) -> None:
        """Stop fetching; continue at ``next_offset`` on resume."""

    def hold(self, partition: int) -> None:
        """Stop fetching; continue after the last record delivered on resume."""

    def resume(self, partition: int) -> None: ...

    def end_offset(self, partition: int) -> int:
        """The partition's end offset as of the last fetch (no request); -1: unknown."""


class PartitionPauses:
    """Paused, parked and ended partitions of one shard, and the records kept for
    held ones."""

    def __init__(self, source: PartitionControl, *, stash_cap: int) -> None:
        self.source = source
        self.paused: dict[int, int] = {}  # partition -> resume key
        self.eof: set[int] = set()  # read to their end
        self.eof_at: dict[int, int] = {}  # partition -> offset of its last end event
        # Parked partitions and the offset each goes on at.
        self.parked: dict[int, int] = {}
        # Records a held feeder delivered past the one that paused it, and the offset
        # the next one must have (-1: too many kept, fetched again on resume).
        self._stash: dict[int, list[Message]] = {}
        self._stash_next: dict[int, int] = {}
        self._stashed = 0
        self._stash_cap = stash_cap

    def pause(self, p: int, next_offset: int, key: int) -> None:
        """Stop ``p`` until resumed (by ``key``: when its time comes); it goes on at
        ``next_offset``."""
        self.source.pause(p, next_offset)
        self.paused[p] = key
        self.eof.discard(p)

    def hold(self, p: int, next_offset: int, key: int) -> None:
        """Pause a feeder but keep what it already delivered (see :meth:`keep`)."""
        self.source.hold(p)
        self.paused[p] = key
        self.eof.discard(p)
        self._stash[p] = []
        self._stash_next[p] = next_offset

    def park(self, p: int, at: int, key: int) -> None:
        """Pause ``p``, read to its end, until ``key``; it goes on at ``at``."""
        self.source.pause(p, at)
        self.paused[p] = key
        self.parked[p] = at

    def keep(self, p: int, m: Message) -> None:
        """``m`` was delivered after ``p`` paused: kept for its resume, or fetched again."""
        stash = self._stash.get(p)
        if stash is None or m.error() is not None:
            return  # a slot's records are read again on resume; ends are reported again
        off: int = m.offset()  # type: ignore[assignment]
        nxt = self._stash_next[p]
        if off < nxt:
            return
        if nxt >= 0 and self._stashed < self._stash_cap:
            stash.append(m)
            self._stashed += 1
            self._stash_next[p] = off + 1
        elif nxt >= 0:  # too much kept already: fetch the rest again on resume
            self.source.pause(p, nxt)
            self._stash_next[p] = -1

    def release(self, p: int) -> list[Message] | None:
        """``p`` is no longer paused: the records kept for it, to be read before the
        source resumes it (:meth:`resume`)."""
        del self.paused[p]
        self.parked.pop(p, None)
        self._stash_next.pop(p, None)
        stash = self._stash.pop(p, None)
        if stash:
            self._stashed -= len(stash)
        return stash

    def resume(self, p: int) -> None:
        """Fetch ``p`` again, unless reading what was kept for it paused it again."""
        if p not in self.paused:
            self.source.resume(p)
