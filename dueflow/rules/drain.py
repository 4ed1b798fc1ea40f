"""How the emitter drains the timing wheel: the rules, as pure functions.

The emitter reads two kinds of timer partitions (see ``dueflow.rules.wheel``):

*Heap feeders* -- the near partitions and the level-0 slots. Their records go
into an in-memory heap ordered by :data:`TimerKey` ``(due, partition,
offset)`` and fire in that order when due. A record whose due time is further
from its broker append time than :func:`heap_horizon_ms` cannot have been
placed there by a producer with a sane clock; it is placed again instead
(:func:`feeds_heap`). Both decisions depend on the record alone, so an
emitter that takes over recomputes them.

*Cascade sources* -- the slots of levels 1 and up. They are read strictly in
offset order; a record is handled once it is *ready*
(:func:`cascade_ready_ms`): overdue records fire at once, the others are
placed again with :func:`dueflow.rules.wheel.place_timer`, which puts them one
level down (or further). A record that is not ready stops its partition until
it is, so memory never holds more than one record per slot.

The *drain clock* (:func:`next_drain_ms`) is the time up to which partitions
are read: the wall clock in steady state, held back while a backlog drains so
that only the timers due soon after the last fired one are in memory.

Commits carry a :class:`Checkpoint` in the offset metadata of each heap
feeder: the offset read up to and the key of the last fired timer. Together
with the committed offset (the lowest record still in the heap) it tells a
new emitter exactly which re-read records already fired
(:func:`already_handled`), so a takeover fires every timer once.

Nothing here reads a clock: ``now_ms`` and the drain clock are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.errors import FieldOutOfRange
from dueflow.rules.wheel import NEAR_LEVEL, WheelGeometry
from dueflow.rules.wire_bounds import MAX_DUE_MS, MAX_LONG, decimal, header_ms

# (due_ms, partition, offset): a total order every emitter computes alike.
TimerKey = tuple[int, int, int]

CHECKPOINT_PREFIX = "df1"

_DUE = hdr.DUE
_QUEUE = hdr.QUEUE
_KIND = hdr.KIND
_CRON = hdr.KIND_CRON.encode()
_JOB = hdr.KIND_JOB.encode()
_PARTITION = hdr.PARTITION


# ------------------------------------------------------------------ geometry


def heap_horizon_ms(geometry: WheelGeometry) -> int:
    """Largest ``due - append time`` of a record a heap feeder keeps in the heap.

    A producer places a timer in level 0 only when it is due within level 0's
    reach, and in a near partition only within the near window; the near window
    again is the margin for producer clocks ahead of the broker.
    """
    return geometry.reach_ms(0) + geometry.near_window_ms


def read_ahead_ms(geometry: WheelGeometry, level: int) -> int:
    """How far past the drain clock a heap feeder is read before it pauses.

    Level 0: one slot plus the lookahead, so every record of a slot is in the
    heap when the slot opens. Near: the near window plus one level-0 slot, so a
    record placed "due within the window" never stops the records behind it.
    """
    w0 = geometry.levels[0].width_ms
    if level == NEAR_LEVEL:
        return geometry.near_window_ms + w0
    if level == 0:
        return w0 + geometry.lookahead_ms
    raise ValueError(f"level {level} does not feed the heap")


def skew_tolerance_ms(geometry: WheelGeometry, level: int) -> int:
    """How far the broker clock may run ahead of a producer's before a timer waits a rotation."""
    return geometry.levels[level].width_ms // 2


def cascade_ready_ms(
    *, geometry: WheelGeometry, level: int, index: int, due_ms: int, append_ms: int
) -> int:
    """Drain-clock time at which a record of a level >= 1 slot partition is handled.

    The record belongs to the first visit of its partition that opens after it
    was written (``append_ms``, broker time, less :func:`skew_tolerance_ms`):
    a producer never writes into an open slot. If its due time's own slot opens
    earlier (a producer clock far behind, or a record in the wrong partition),
    that earlier time wins, so a misplaced record is placed again early rather
    than late. Parked timers beyond the top level's reach are handled at the
    visit they were parked for.
    """
    after = append_ms - skew_tolerance_ms(geometry, level)
    visit_opens = next_visit_opens_ms(geometry=geometry, level=level, index=index, after_ms=after)
    width = geometry.levels[level].width_ms
    due_opens = (due_ms // width) * width - geometry.lookahead_ms
    return min(visit_opens, due_opens)


def next_visit_opens_ms(*, geometry: WheelGeometry, level: int, index: int, after_ms: int) -> int:
    """When the first visit of slot partition ``index`` of ``level`` that opens
    after ``after_ms`` opens (its window start less the lookahead)."""
    lv = geometry.levels[level]
    width, slots, lookahead = lv.width_ms, lv.slots, geometry.lookahead_ms
    first = (after_ms + lookahead) // width + 1  # first slot opening after `after_ms`
    visit = first + (index - first) % slots
    return visit * width - lookahead


def idle_until_ms(*, geometry: WheelGeometry, level: int, index: int, drain_ms: int) -> int:
    """Drain-clock time up to which a slot partition read to its end at
    ``drain_ms`` gets no record it must read before then.

    A record is written for a visit of its partition that has not opened yet:
    a level-0 timer is due in its slot and placed more than the near window
    ahead, so it belongs to a visit starting after the drain clock; a record of
    level 1 or up belongs to the first visit opening after its append time less
    the skew tolerance (:func:`cascade_ready_ms`). Level 0: the start of the
    next visit (a heap feeder must be read some time before it); level 1 up:
    when the next visit opens. Records written against these rules (a producer
    clock far behind) must be noticed some other way: by watching the
    partition's end offset.
    """
    if level == 0:
        opens = next_visit_opens_ms(geometry=geometry, level=0, index=index, after_ms=drain_ms)
        return opens + geometry.lookahead_ms
    after = drain_ms - skew_tolerance_ms(geometry, level)
    return next_visit_opens_ms(geometry=geometry, level=level, index=index, after_ms=after)


def feeds_heap(*, due_ms: int, append_ms: int, horizon_ms: int) -> bool:
    """True: a heap feeder keeps the record in the heap; False: it is placed again."""
    return due_ms - append_ms <= horizon_ms


def landed_late(*, geometry: WheelGeometry, level: int, due_ms: int, append_ms: int) -> bool:
    """True when a slot record was written after its slot had opened (a producer clock
    behind the broker's): it fires late, and is counted."""
    if level == NEAR_LEVEL:
        return False
    width = geometry.levels[level].width_ms
    opens = (due_ms // width) * width - geometry.lookahead_ms
    return append_ms - skew_tolerance_ms(geometry, level) >= opens


def next_drain_ms(
    *,
    drain_ms: int,
    now_ms: int,
    earliest_due_ms: int | None,
    lag_ms: int,
    reading_limit_ms: int | None,
) -> int:
    """Advance the drain clock; it never goes back and never passes ``now_ms``.

    ``earliest_due_ms`` is the earliest unfired timer read (the heap's top).
    While a backlog drains the clock stays within ``lag_ms`` of it, so slots
    open in due order and the heap holds the timers due soon after it. With
    nothing read to anchor it, the clock does not pass ``reading_limit_ms``
    (the least of "due time read up to + read-ahead" over feeders still
    reading), so a feeder that has not been read far cannot make it jump.
    """
    target = now_ms
    if earliest_due_ms is not None:
        target = min(target, earliest_due_ms + lag_ms)
    elif reading_limit_ms is not None:
        target = min(target, reading_limit_ms)
    return max(drain_ms, target)


def commit_due(
    *,
    records: int,
    age_ms: int,
    busy: bool,
    max_records: int,
    max_ms: int,
    behind_ms: int = 0,
    min_ms: int = 0,
) -> bool:
    """Commit the open transaction (``records`` written, the first ``age_ms`` ago) now?

    Fired jobs become visible to workers only at commit, so the emitter commits
    as soon as every timer that is due has fired (``busy`` False: also while it
    reads ahead). While timers are due and not fired yet (a backlog, a burst)
    it commits every ``max_records`` records or ``max_ms`` milliseconds; when
    the earliest timer not yet fired is ``behind_ms`` overdue, a transaction may
    stay open for up to 1/:data:`BACKLOG_AGE_SHARE` of that (at most
    :data:`BACKLOG_AGE_MAX_MS`): jobs seconds late lose little by waiting a few
    per cent longer, and a backlog drains in fewer, larger transactions, whose
    fixed cost (a commit round trip that holds up firing) stays small. Caught
    up, a transaction stays open ``min_ms`` after its first record (fewer
    transactions at a steady rate: each costs the broker its commit markers).
    """
    if records <= 0:
        return False
    if records >= max_records:
        return True
    if not busy:
        return age_ms >= min_ms
    return age_ms >= commit_age_ms(max_ms=max_ms, behind_ms=behind_ms)


def commit_age_ms(*, max_ms: int, behind_ms: int) -> int:
    """How long a transaction stays open while timers ``behind_ms`` overdue wait
    (see :func:`commit_due`)."""
    return max(max_ms, min(behind_ms // BACKLOG_AGE_SHARE, BACKLOG_AGE_MAX_MS))


BACKLOG_AGE_SHARE = 10
BACKLOG_AGE_MAX_MS = 250


# ------------------------------------------------------------------- records


def classify_timer(
    headers: Any,
    key: bytes | None,
    exec_topics: Mapping[bytes, str],
    exec_partitions: Mapping[bytes, int] | None = None,
) -> tuple[int, str, bool, int] | str:
    """``(due_ms, exec topic, is_cron, exec partition)`` of a timer record, or why it
    is malformed.

    ``headers`` is a record's header list of ``(name, value)`` pairs (or None;
    a repeated name: the last one counts). Reads headers only (the value is
    never decoded). ``exec_topics`` maps the ``df-queue`` value of every
    configured queue to its exec topic, ``exec_partitions`` to its partition
    count. The exec partition is ``df-partition`` (a job timer only: a retry a
    worker sent through the wheel keeps its partition), else -1: by the key.
    """
    # One pass over the pairs, no dict: this runs for every timer the emitter reads.
    due_raw = queue_raw = kind_raw = part_raw = None
    if headers:
        for name, value in headers:
            if name == _DUE:
                due_raw = value
            elif name == _QUEUE:
                queue_raw = value
            elif name == _KIND:
                kind_raw = value
            elif name == _PARTITION:
                part_raw = value
    if due_raw is None:
        return reasons.MISSING_DUE
    if len(due_raw) == 13 and due_raw.isdigit():  # 2001 to 2286: the common case
        due = int(due_raw)
    else:
        found = _due_of(due_raw)
        if isinstance(found, str):
            return found
        due = found
    if queue_raw is None:
        return reasons.MISSING_QUEUE
    topic = exec_topics.get(queue_raw)
    if topic is None:
        return reasons.with_detail(
            reasons.UNKNOWN_QUEUE, repr(queue_raw[:100].decode("utf-8", "replace"))
        )
    if not key:
        return reasons.MISSING_TIMER_KEY
    if kind_raw is None or kind_raw == _JOB:
        if part_raw is None:
            return due, topic, False, -1
        partitions = exec_partitions.get(queue_raw) if exec_partitions is not None else None
        try:
            partition = int(part_raw) if part_raw.isdigit() else -1
        except ValueError:
            partition = -1
        if partition < 0 or (partitions is not None and partition >= partitions):
            return reasons.with_detail(
                reasons.BAD_PARTITION, f"not a partition of {topic}: {part_raw[:40]!r}"
            )
        return due, topic, False, partition
    if kind_raw == _CRON:
        bad = _bad_cron_headers(headers)
        if bad is not None:
            return bad
        return due, topic, True, -1
    return reasons.with_detail(reasons.UNKNOWN_KIND, repr(kind_raw[:40]))


def _due_of(raw: bytes) -> int | str:
    """``df-due`` as an integer in range, or the quarantine reason."""
    digits = raw[1:] if raw[:1] == b"-" else raw
    if not digits.isdigit():
        return reasons.with_detail(reasons.BAD_DUE, repr(raw[:40]))
    try:
        return header_ms(raw, hdr.DUE)
    except FieldOutOfRange as exc:
        return reasons.with_detail(reasons.DUE_OUT_OF_RANGE, exc)


def _bad_cron_headers(headers: Any) -> str | None:
    """Why the bookkeeping headers of a cron occurrence cannot be used (``df-sv``,
    ``df-occurrence``; an occurrence without them runs as a plain job), else None."""
    try:
        version = hdr.header(headers, hdr.SCHEDULE_VERSION)
        if version is not None:
            decimal(
                version,
                hdr.SCHEDULE_VERSION,
                low=0,
                high=MAX_LONG,
                accepted=f"an integer from 0 to {MAX_LONG}",
            )
        occurrence = hdr.header(headers, hdr.OCCURRENCE)
        if occurrence is not None:  # from 1970: the cron rules start there
            decimal(
                occurrence,
                hdr.OCCURRENCE,
                low=0,
                high=MAX_DUE_MS,
                accepted=f"an integer from 0 to {MAX_DUE_MS} (UTC epoch ms)",
            )
    except FieldOutOfRange as exc:
        return reasons.with_detail(reasons.BAD_CRON_HEADER, exc)
    return None


# ---------------------------------------------------------------- checkpoints


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a committed offset of a timer partition means beyond the offset itself.

    Every record of the partition below ``read_to`` (and at or above the
    committed offset) was read: those with a key up to ``fired`` have fired,
    malformed and placed-again ones were handled, the rest are unfired.
    """

    read_to: int
    fired: TimerKey | None = None

    def encode(self) -> str:
        if self.fired is None:
            return f"{CHECKPOINT_PREFIX}:{self.read_to}"
        due, partition, offset = self.fired
        return f"{CHECKPOINT_PREFIX}:{self.read_to}:{due}:{partition}:{offset}"

    @classmethod
    def decode(cls, text: str | None) -> Checkpoint | None:
        """The checkpoint in ``text``; ``None`` for no or foreign metadata."""
        if not text:
            return None
        parts = text.split(":")
        if parts[0] != CHECKPOINT_PREFIX or len(parts) not in (2, 5):
            return None
        try:
            numbers = [int(p) for p in parts[1:]]
        except ValueError:
            return None
        if len(numbers) == 1:
            return cls(numbers[0])
        return cls(numbers[0], (numbers[1], numbers[2], numbers[3]))


def already_handled(
    *, offset: int, key: TimerKey, checkpoint: Checkpoint | None, handled_otherwise: bool
) -> bool:
    """True when a record re-read after a takeover was handled by the previous emitter.

    ``handled_otherwise``: the record is malformed or is placed again rather than
    kept (decisions that depend on the record alone); those were handled iff
    the previous emitter read them. Kept records were handled iff they fired,
    which is iff their key is at most the last fired key.
    """
    if checkpoint is None or offset >= checkpoint.read_to:
        return False
    if handled_otherwise:
        return True
    return checkpoint.fired is not None and key <= checkpoint.fired


def latest_fired(checkpoints: Sequence[Checkpoint | None]) -> TimerKey | None:
    """The global last fired key: the greatest over the partitions' checkpoints."""
    keys = [c.fired for c in checkpoints if c is not None and c.fired is not None]
    return max(keys) if keys else None


Committed = tuple[int, Checkpoint | None]  # (offset or -1: none, its checkpoint)


def newer_commit(a: Committed, b: Committed) -> Committed:
    """Of two commits of one timer partition (from the two groups the emitter may
    have committed into: its lease group, without transactions; its offsets group,
    with them), the one to go on from.

    Each is true on its own: the records below its offset were handled, those
    below its ``read_to`` with a key up to its ``fired`` fired, whichever emitter
    made it. So the later one in the partition, the higher offset (then the higher
    ``read_to``), leaves the least to read again; any choice loses nothing.
    """

    def rank(c: Committed) -> tuple[int, int]:
        offset, ck = c
        return offset, ck.read_to if ck is not None else offset

    return b if rank(b) > rank(a) else a
