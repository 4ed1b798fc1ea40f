"""Where each timer partition of a shard sits in the wheel, and how far ahead the
drainer reads it.

Heap feeders (near partitions and level 0) are read ahead of the drain clock
(:func:`~dueflow.rules.drain.read_ahead_ms`); slots of level 1 and up are read
when they open. Lists are indexed by partition: a shard's partitions are
``geometry.partitions`` (the entries below its first are never used).
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow.rules.drain import read_ahead_ms
from dueflow.rules.wheel import WheelGeometry


@dataclass(frozen=True, slots=True)
class ShardLayout:
    level: list[int]  # NEAR_LEVEL (-1), 0, 1, ...
    index: list[int]  # slot of its level
    feeders: list[int]  # the heap feeders (near and level 0)
    ahead: list[int]  # how far ahead of the drain clock a feeder's timers fire
    lead: list[int]  # how far ahead a feeder is read
    lead_slot: list[int]  # a feeder pauses at a record due past this

    @classmethod
    def of(cls, geometry: WheelGeometry) -> ShardLayout:
        ours = geometry.partitions
        located = [geometry.locate(p) for p in range(ours.stop)]
        level = [lv for lv, _ in located]
        slot = geometry.levels[0].width_ms
        ahead = [read_ahead_ms(geometry, lv) if lv <= 0 else 0 for lv in level]
        # A level-0 feeder is read one slot further ahead than firing needs: while a
        # backlog drains, the drain clock moves many seconds per second, and a
        # feeder resumed only just in time would stop firing until its first fetch
        # comes back.
        lead = [a + slot if lv == 0 else a for a, lv in zip(ahead, level, strict=True)]
        return cls(
            level=level,
            index=[i for _, i in located],
            feeders=[p for p in ours if level[p] <= 0],
            ahead=ahead,
            lead=lead,
            lead_slot=[a + slot for a in lead],
        )
