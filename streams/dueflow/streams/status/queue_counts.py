"""The status view's per-queue counts by state, derived from the job views.

The counts are not stored anywhere of their own: after every recovery the view
counts the rows of its active partitions in the job file (one pass over a
covering index, :meth:`JobFile.count_states`) and the views staged but not
written yet, then keeps the counts in memory as the fold changes views
(:meth:`QueueCounts.apply`). So they always say what the job views say, after
any crash: there is no second table whose changelog could be ahead of or
behind the jobs'.
"""

from __future__ import annotations

from collections.abc import Iterable


class QueueCounts:
    """``partition -> queue -> state -> n`` of the jobs this view answers for."""

    def __init__(self) -> None:
        self._by_partition: dict[int, dict[str, dict[str, int]]] = {}

    def reset(self, rows: Iterable[tuple[int, str, str, int]]) -> None:
        """Start again from ``(partition, queue, state, n)`` rows (a recount; rows of
        the same key add up, ``n`` may be negative)."""
        by_partition: dict[int, dict[str, dict[str, int]]] = {}
        for p, queue, st, n in rows:
            states = by_partition.setdefault(p, {}).setdefault(queue, {})
            states[st] = states.get(st, 0) + n
        for queues in by_partition.values():
            for states in queues.values():
                for st in [st for st, n in states.items() if n <= 0]:
                    del states[st]
        self._by_partition = by_partition

    def apply(self, partition: int, deltas: Iterable[tuple[str, str, int]]) -> None:
        """A job of ``partition`` changed by ``(queue, state, +1/-1)`` deltas."""
        queues = self._by_partition.setdefault(partition, {})
        for queue, st, delta in deltas:
            states = queues.setdefault(queue, {})
            n = max(0, states.get(st, 0) + delta)
            if n:
                states[st] = n
            else:
                states.pop(st, None)

    def of_partition(self, partition: int) -> dict[str, dict[str, int]]:
        """``{queue: {state: n}}`` of one partition (a copy)."""
        queues = self._by_partition.get(partition, {})
        return {q: dict(s) for q, s in queues.items() if s}

    def totals(self) -> dict[str, dict[str, int]]:
        """``{queue: {state: n}}`` summed over partitions."""
        out: dict[str, dict[str, int]] = {}
        for queues in self._by_partition.values():
            for queue, states in queues.items():
                if not states:
                    continue
                q = out.setdefault(queue, {})
                for st, n in states.items():
                    q[st] = q.get(st, 0) + n
        return out
