"""The timing wheel: geometry, validation and timer placement (pure core).

The timer topic's partitions are the slots of a hierarchical timing wheel.
Partitions ``0 .. near_partitions-1`` are the *near* partitions: timers due
within ``near_window_ms`` of now. After them come the slots of level 0, then
level 1, and so on: level ``k`` has ``slots`` partitions, each ``width_ms``
wide. Absolute slot ``n`` of level ``k`` covers due times
``[n * width, (n + 1) * width)`` and lives in partition slot ``n mod slots``.

The emitter *opens* absolute slot ``n`` at ``n * width - lookahead`` and keeps
it open until ``(n + 1) * width``. Placement never writes into a slot that is
open or about to open, and never into the previous visit of the same
partition that may still be draining: that is the safety rule the geometry
validator enforces and the property tests check.

Nothing here reads the clock: ``now_ms`` is always an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dueflow.errors import ConfigError

NEAR_LEVEL = -1
# Shards of one deployment's timer topic (each adds a wheel's partitions).
MAX_SHARDS = 64


@dataclass(frozen=True, slots=True)
class WheelLevel:
    """One level of the wheel: ``slots`` partitions of ``width_ms`` each."""

    slots: int
    width_ms: int

    @property
    def span_ms(self) -> int:
        """Time covered by one full rotation of this level."""
        return self.slots * self.width_ms


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a timer goes: a partition of the timer topic.

    ``level`` is :data:`NEAR_LEVEL` for a near partition (then ``slot`` is the
    near index); otherwise ``slot`` is the absolute slot number ``n`` at that
    level (``partition`` already holds ``n mod slots`` mapped to the topic).
    """

    partition: int
    level: int
    slot: int

    @property
    def is_near(self) -> bool:
        return self.level == NEAR_LEVEL


@dataclass(frozen=True, slots=True)
class SlotWindow:
    """One visit of a slot: it opens at ``opens_ms`` and ends at ``end_ms``."""

    level: int
    slot: int  # absolute slot number
    start_ms: int
    end_ms: int
    opens_ms: int


DEFAULT_LEVELS: tuple[WheelLevel, ...] = (
    WheelLevel(64, 1_000),
    WheelLevel(64, 60_000),
    WheelLevel(64, 3_600_000),
    WheelLevel(64, 86_400_000),
)


@dataclass(frozen=True, slots=True)
class WheelGeometry:
    """The shape of the wheel. Validate with :meth:`validate` before use."""

    # The levels, lowest first: slots x slot width (ms), one partition per slot.
    levels: tuple[WheelLevel, ...] = DEFAULT_LEVELS
    near_partitions: int = 4  # partitions of the timers due within near_window_ms
    near_window_ms: int = 2_000  # a timer due this soon goes to a near partition
    lookahead_ms: int = 500  # a slot partition is read this long before its slot
    # The timer topic holds ``shards`` wheels of this shape side by side: shard s
    # is partitions [s * shard_partitions, (s + 1) * shard_partitions). Each has
    # its own lease partition and active emitter (docs/emitter.md#shards).
    shards: int = 1
    # Which shard this geometry places into and reads (0 in settings; the
    # emitter of shard s works with ``of_shard(s)``).
    shard: int = 0

    @property
    def shard_partitions(self) -> int:
        """Partitions of one shard: the near partitions and every level's slots."""
        return self.near_partitions + sum(level.slots for level in self.levels)

    @property
    def total_partitions(self) -> int:
        """Partitions of the whole timer topic: every shard's."""
        return self.shards * self.shard_partitions

    @property
    def base(self) -> int:
        """First partition of this geometry's shard."""
        return self.shard * self.shard_partitions

    @property
    def partitions(self) -> range:
        """This shard's partitions of the timer topic."""
        base = self.base
        return range(base, base + self.shard_partitions)

    def of_shard(self, shard: int) -> WheelGeometry:
        """The same wheel, placing into and reading shard ``shard``."""
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is outside 0..{self.shards - 1}")
        return replace(self, shard=shard)

    def shard_of(self, partition: int) -> int:
        """The shard a timer-topic partition belongs to."""
        return partition // self.shard_partitions

    def level_base(self, level: int) -> int:
        """First partition of ``level`` (of this shard) in the timer topic."""
        return self.base + self.near_partitions + sum(lv.slots for lv in self.levels[:level])

    def partition_of(self, level: int, slot: int) -> int:
        """Partition holding absolute slot ``slot`` of ``level``."""
        return self.level_base(level) + slot % self.levels[level].slots

    def locate(self, partition: int) -> tuple[int, int]:
        """``(level, index)`` of a partition of any shard; level is NEAR_LEVEL for
        near ones."""
        if not 0 <= partition < self.total_partitions:
            raise ValueError(f"partition {partition} is outside the wheel")
        partition %= self.shard_partitions
        if partition < self.near_partitions:
            return NEAR_LEVEL, partition
        rest = partition - self.near_partitions
        for k, level in enumerate(self.levels):
            if rest < level.slots:
                return k, rest
            rest -= level.slots
        raise AssertionError("unreachable")  # pragma: no cover

    def reach_ms(self, level: int) -> int:
        """Largest ``due - now`` that may be placed at ``level``.

        One slot short of a full rotation, less the lookahead, so a timer never
        lands in the visit of its partition that is open now.
        """
        lv = self.levels[level]
        return (lv.slots - 1) * lv.width_ms - self.lookahead_ms

    def window(self, level: int, slot: int) -> SlotWindow:
        """The visit of absolute slot ``slot`` at ``level``."""
        width = self.levels[level].width_ms
        start = slot * width
        return SlotWindow(level, slot, start, start + width, start - self.lookahead_ms)

    def validate(self) -> WheelGeometry:
        """Raise :class:`ConfigError` naming the level that breaks the safety rule."""
        if self.near_partitions < 1:
            raise ConfigError("wheel.near_partitions", self.near_partitions, "an integer >= 1")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError("wheel.shards", self.shards, f"an integer from 1 to {MAX_SHARDS}")
        if not 0 <= self.shard < self.shards:
            raise ConfigError("wheel.shard", self.shard, f"0..{self.shards - 1}")
        if self.lookahead_ms < 0:
            raise ConfigError("wheel.lookahead_ms", self.lookahead_ms, "an integer >= 0")
        if not self.levels:
            raise ConfigError("wheel.levels", self.levels, "at least one level")
        for k, lv in enumerate(self.levels):
            if lv.slots < 3:
                raise ConfigError(f"wheel.levels[{k}].slots", lv.slots, "an integer >= 3")
            if lv.width_ms < 1:
                raise ConfigError(f"wheel.levels[{k}].width_ms", lv.width_ms, "an integer >= 1")
        w0 = self.levels[0].width_ms
        if self.near_window_ms < w0 + self.lookahead_ms:
            raise ConfigError(
                "wheel.near_window_ms",
                self.near_window_ms,
                f">= level 0 width + lookahead = {w0 + self.lookahead_ms} ms: a timer just "
                "beyond the near window must land in a level-0 slot that has not opened yet",
            )
        if self.reach_ms(0) <= self.near_window_ms:
            raise ConfigError(
                "wheel.levels[0]",
                self.levels[0],
                f"a reach ((slots-1)*width - lookahead = {self.reach_ms(0)} ms) beyond the "
                f"near window ({self.near_window_ms} ms)",
            )
        for k in range(1, len(self.levels)):
            lv, below = self.levels[k], self.levels[k - 1]
            needed = lv.width_ms + self.lookahead_ms
            if self.reach_ms(k - 1) < needed:
                raise ConfigError(
                    f"wheel.levels[{k}]",
                    lv,
                    f"level {k - 1} must reach at least level {k}'s width + lookahead = "
                    f"{needed} ms, but reaches {self.reach_ms(k - 1)} ms "
                    f"(({below.slots}-1)*{below.width_ms} - {self.lookahead_ms}); "
                    f"a timer cascaded from level {k} would land in an open slot",
                )
            if self.reach_ms(k) <= self.reach_ms(k - 1):
                raise ConfigError(
                    f"wheel.levels[{k}]",
                    lv,
                    f"a reach beyond level {k - 1}'s ({self.reach_ms(k - 1)} ms); "
                    f"level {k} reaches only {self.reach_ms(k)} ms",
                )
            if lv.width_ms % below.width_ms:
                raise ConfigError(
                    f"wheel.levels[{k}].width_ms",
                    lv.width_ms,
                    f"a multiple of level {k - 1}'s width ({below.width_ms} ms), so slot "
                    "boundaries line up across levels",
                )
        return self


def shard_for(spread: int, shards: int) -> int:
    """The shard of a timer (or cron schedule) whose ``spread`` (CRC-32 of its key)
    is given: its upper half, so the choice does not follow the near partition,
    which the lower bits pick."""
    return (spread >> 16) % shards if shards > 1 else 0


def place_timer(*, due_ms: int, now_ms: int, geometry: WheelGeometry, spread: int) -> Placement:
    """Choose the timer-topic partition for a timer due at ``due_ms``, in the shard
    of ``geometry`` (:meth:`WheelGeometry.of_shard`; a client first picks the
    shard with :func:`shard_for`).

    ``spread`` is any stable integer of the timer (e.g. a hash of its key); it
    picks one of the near partitions so near load is shared. Overdue timers go
    to the near partitions and fire at once.
    """
    delta = due_ms - now_ms
    if delta <= geometry.near_window_ms:
        near = spread % geometry.near_partitions
        return Placement(geometry.base + near, NEAR_LEVEL, near)
    levels = geometry.levels
    for k in range(len(levels)):
        if delta <= geometry.reach_ms(k):
            slot = due_ms // levels[k].width_ms
            return Placement(geometry.partition_of(k, slot), k, slot)
    # Beyond the top level's reach: park it in the furthest safe top slot; it is
    # placed again when that slot is visited.
    top = len(levels) - 1
    slot = (now_ms + geometry.reach_ms(top)) // levels[top].width_ms
    return Placement(geometry.partition_of(top, slot), top, slot)


def open_window(*, now_ms: int, geometry: WheelGeometry, level: int) -> SlotWindow:
    """The visit of ``level`` that is open (or about to open) at ``now_ms``."""
    width = geometry.levels[level].width_ms
    slot = (now_ms + geometry.lookahead_ms) // width
    return geometry.window(level, slot)
