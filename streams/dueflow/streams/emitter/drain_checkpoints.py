"""The timer offsets the wheel drainer commits, with their checkpoints.

A heap feeder's committed offset is the lowest one not fired yet, and its
checkpoint says how far it was read and the last timer fired: a new active
emitter starts reading there, re-reads up to where the previous one had read
(nothing fires until it has), and skips what was fired already. A slot
partition's committed offset is where it was read to.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TopicPartition

from dueflow.rules.drain import Checkpoint, TimerKey, latest_fired
from dueflow.rules.open_offsets import OpenOffsets
from dueflow.rules.wheel import WheelGeometry


@dataclass(frozen=True, slots=True)
class SealedCommit:
    """A transaction handed over to commit: its timer offsets (with checkpoints)
    and the due times it fired, per exec topic."""

    offsets: list[TopicPartition]
    fired: dict[str, list[int]]


@dataclass(frozen=True, slots=True)
class DrainStart:
    """Where an active period starts reading the timer partitions of its shard,
    from the committed offsets (with their checkpoints)."""

    read_to: list[int]  # indexed by partition: the next offset to read
    committed_offsets: dict[int, int]  # this shard's partitions: the committed offset
    # Heap feeders re-read after a takeover, up to the previous emitter's read
    # offset: nothing fires until they are (it is a short stretch).
    replay: dict[int, Checkpoint]
    fired: TimerKey | None  # the last timer fired, by the checkpoints

    @classmethod
    def of(
        cls,
        geometry: WheelGeometry,
        feeders: list[int],
        committed: dict[int, tuple[int, Checkpoint | None]],
    ) -> DrainStart:
        ours = geometry.partitions
        replay: dict[int, Checkpoint] = {}
        checkpoints = []
        for p in feeders:
            offset, ck = committed.get(p, (-1, None))
            checkpoints.append(ck)
            if ck is not None and ck.read_to > max(offset, 0):
                replay[p] = ck
        return cls(
            read_to=[max(committed.get(p, (-1, None))[0], 0) for p in range(ours.stop)],
            committed_offsets={p: committed.get(p, (-1, None))[0] for p in ours},
            replay=replay,
            fired=latest_fired(checkpoints),
        )


def commit_offsets(
    *,
    topic: str,
    touched: set[int],
    opens: list[OpenOffsets | None],
    read_to: list[int],
    fired: TimerKey | None,
) -> list[TopicPartition]:
    """Offsets and checkpoints of the ``touched`` partitions: a heap feeder's
    lowest open offset (``opens``) with how far it was read and the last timer
    ``fired``, a slot partition's read offset."""
    out = []
    for p in touched:
        open_offsets = opens[p]
        if open_offsets is not None:
            offset = open_offsets.lowest(read_to[p])
            meta = Checkpoint(read_to[p], fired).encode()
        else:
            offset = read_to[p]
            meta = Checkpoint(offset).encode()
        out.append(TopicPartition(topic, p, offset, meta))
    return out
