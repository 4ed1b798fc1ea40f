"""Where in the wheel a pending timer can be (pure).

A timer due at ``due`` sits in one partition of the timer topic at a time,
but which one changes as its slots come round: a client writes it to the
lowest level that covers ``due - now`` (or a near partition), and the
emitter places it again one level down when its slot opens, always into
the slot of ``due`` at that level (:func:`dueflow.rules.wheel.place_timer`). So,
given its due time and key, the partitions it can be in are few: the slot
of ``due`` at each level, and its near partition; one parked beyond the top
level's reach may be in any top slot. :func:`timer_partitions` lists them
from the top level down, the way a timer moves, so a search that reads them
in that order also finds one that moved down while it was searching.
"""

from __future__ import annotations

import zlib

from dueflow.rules.wheel import WheelGeometry, shard_for


def timer_partitions(
    *,
    due_ms: int,
    now_ms: int,
    key: bytes,
    geometry: WheelGeometry,
    hint: int | None = None,
) -> list[int]:
    """The timer-topic partitions a timer due at ``due_ms`` with ``key`` may be in at
    ``now_ms``, in the order to search them (``hint``, where a client wrote it, first).
    They are in the key's shard: the emitter places a timer again only inside the
    shard it read it from."""
    spread = zlib.crc32(key)
    geometry = geometry.of_shard(shard_for(spread, geometry.shards))
    levels = geometry.levels
    top = len(levels) - 1
    found: list[int] = [] if hint is None else [hint]
    if due_ms - now_ms > geometry.reach_ms(top):
        # parked in the furthest top slot of its writer's time: any top slot
        found += [geometry.partition_of(top, slot) for slot in range(levels[top].slots)]
    for k in range(top, -1, -1):
        found.append(geometry.partition_of(k, due_ms // levels[k].width_ms))
    found.append(geometry.base + spread % geometry.near_partitions)
    return list(dict.fromkeys(found))
