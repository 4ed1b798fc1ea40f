"""Which offset of a partition may be committed: the lowest unfinished (pure).

Records of one partition finish out of order (a timer fires before an earlier
one, a slow job runs beside fast ones). The committed offset is where a new
owner starts reading, so it must never pass a record that has not finished.
The emitter keeps one :class:`OpenOffsets` per feeder partition, the worker
one per partition it reads (``dueflow.consumers.offsets.OffsetTracker``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

D = TypeVar("D")


class OpenOffsets:
    """Offsets of one partition not finished yet, finished out of order.

    ``lowest(default)`` is the offset to commit: the first unfinished one.
    Offsets are added in increasing order (the order they are read).

    ``add``, ``extend`` and ``finish`` run once per record on the hot path, so
    they are bound methods of builtins (no Python frame); finished offsets are
    dropped from the front of the order when ``lowest`` asks (once per commit).
    """

    __slots__ = ("_done", "_order", "add", "extend", "finish")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        # add(offset) / extend(offsets) / finish(offset): bound methods of the
        # deque and the set.
        self.add: Callable[[int], None] = self._order.append
        self.extend: Callable[[Iterable[int]], None] = self._order.extend
        self.finish: Callable[[int], None] = self._done.add

    def lowest(self, default: D) -> int | D:
        """The first unfinished offset; ``default`` when every offset added has finished."""
        order = self._order
        done = self._done
        if len(done) >= len(order):  # every offset added has finished
            order.clear()
            done.clear()
            return default
        while order[0] in done:
            done.remove(order.popleft())
        return order[0]

    def __len__(self) -> int:
        return len(self._order) - len(self._done)
