"""What Kafka itself says about a dueflow deployment (pure computation).

A :class:`ClusterSnapshot` holds raw observations read from the cluster
(watermarks, committed offsets, the emitter group's members, the newest DLQ
records); :func:`compute_view` turns it into the numbers operators look at:
consumer lag per group/topic/partition, DLQ depth per queue, pending timers
per wheel level and the active emitter. The reader that fills a snapshot is
``dueflow.streams.status.cluster_reader``; the CLI and the status view both
use it.

Definitions (from offsets, made exact by counting where it is cheap):

- lag of a group on a partition = records from its committed offset to the
  high watermark; with no committed offset, from the low watermark
  (everything retained is still to be read).
- DLQ depth = records from the low to the high watermark, summed over the
  DLQ topic's partitions.
- pending timers of a wheel level = records from max(committed offset of the
  emitter offsets group, low watermark) to the high watermark, summed over the
  level's partitions (``geometry.locate``); level ``near`` holds timers due
  within seconds.

Offsets alone overcount: every transaction leaves a commit marker that takes
an offset (and aborted records take theirs), so an idle worker group that
committed everything shows a lag of 1 per partition, and a DLQ written by
one-record transactions looks twice as deep. The reader therefore counts
the committed records of some ranges (:func:`ranges_to_count`: every DLQ
partition, and lag and pending ranges of at most :data:`COUNT_UP_TO`
offsets) and the snapshot carries them as :class:`RecordCount`; any other
range is the offset distance, an upper bound.
- active emitter = the member of the emitter group assigned partition 0 of
  the lease topic; none when no member holds it.
- paused queues = what the control topic says (``dueflow queue pause``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.rules.wheel import NEAR_LEVEL, WheelGeometry

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Watermarks:
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class RecordCount:
    """Committed records counted (by reading them) from offset ``start`` to ``end``."""

    start: int
    end: int
    records: int


# Lag and pending-timer ranges up to this many offsets are counted exactly;
# longer ones (busy partitions, where markers are a small share) are not read.
COUNT_UP_TO = 100


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member of a consumer group and the partitions it is assigned."""

    member_id: str
    client_id: str
    host: str
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """One DLQ record, as the cluster view shows it."""

    queue: str
    job_id: str
    task: str
    reason: str
    error_type: str
    error_message: str
    attempts: int
    dead_ms: int
    partition: int
    offset: int
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Raw observations of the cluster at ``taken_ms``."""

    taken_ms: int
    watermarks: Mapping[TopicPartition, Watermarks]
    committed: Mapping[str, Mapping[TopicPartition, int]]  # group -> committed offsets
    emitter_members: tuple[GroupMember, ...] = ()
    emitter_group_state: str = "unknown"
    failures: tuple[FailureRecord, ...] = ()
    errors: tuple[str, ...] = ()  # what could not be read, for the operator
    counted: Mapping[TopicPartition, RecordCount] = field(default_factory=dict)
    # queue -> the operator's pause command (``dueflow.records.pause_command.QueueControl.to_json``)
    paused: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LagRow:
    group: str
    topic: str
    partition: int
    committed: int | None
    high: int
    lag: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The numbers an operator looks at, computed from one snapshot."""

    taken_ms: int
    lag: tuple[LagRow, ...]
    lag_by_queue: Mapping[str, int]
    dlq_depth: Mapping[str, int]
    timers_pending: Mapping[str, int]
    active_emitter: GroupMember | None
    emitter_members: int
    emitter_group_state: str
    failures: tuple[FailureRecord, ...]
    errors: tuple[str, ...] = field(default=())
    paused: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Shard -> client id of its active emitter (None: nobody drives it).
    emitter_shards: Mapping[int, str | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape of ``/api/cluster`` and ``status --json``)."""
        out = asdict(self)
        out["lag"] = [asdict(r) for r in self.lag]
        out["failures"] = [asdict(f) for f in self.failures]
        out["emitter_shards"] = {str(k): v for k, v in self.emitter_shards.items()}
        holder = self.active_emitter
        out["active_emitter"] = None
        if holder is not None:
            out["active_emitter"] = asdict(holder)
            out["active_emitter"]["partitions"] = [f"{t}:{p}" for t, p in holder.partitions]
        return out


def level_label(level: int) -> str:
    """Label of a wheel level in metrics and views: ``near``, ``0``, ``1``, ..."""
    return "near" if level == NEAR_LEVEL else str(level)


def wheel_labels(geometry: WheelGeometry) -> list[str]:
    return ["near"] + [str(k) for k in range(len(geometry.levels))]


def lag_start(committed: int | None, marks: Watermarks) -> int:
    """Where a group's unread records of a partition begin."""
    return marks.low if committed is None or committed < 0 else max(committed, marks.low)


def records_from(start: int, marks: Watermarks, counted: RecordCount | None = None) -> int:
    """Records from ``start`` to the high watermark: ``counted`` when it counted exactly
    that range, else the offset distance (an upper bound); never negative."""
    if counted is not None and counted.start == start and counted.end == marks.high:
        return counted.records
    return max(0, marks.high - start)


def partition_lag(
    committed: int | None, marks: Watermarks, counted: RecordCount | None = None
) -> int:
    """Records a group still has to read on one partition (never negative)."""
    return records_from(lag_start(committed, marks), marks, counted)


_NOTHING_COUNTED: Mapping[TopicPartition, RecordCount] = {}


def consumer_lag(
    group: str,
    topics: Sequence[str],
    committed: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, Watermarks],
    counted: Mapping[TopicPartition, RecordCount] = _NOTHING_COUNTED,
) -> list[LagRow]:
    """Lag of ``group`` on every known partition of ``topics``."""
    rows = []
    for tp, marks in sorted(watermarks.items()):
        topic, partition = tp
        if topic not in topics:
            continue
        offset = committed.get(tp)
        lag = partition_lag(offset, marks, counted.get(tp))
        rows.append(LagRow(group, topic, partition, offset, marks.high, lag))
    return rows


def topic_depth(
    topic: str,
    watermarks: Mapping[TopicPartition, Watermarks],
    counted: Mapping[TopicPartition, RecordCount] = _NOTHING_COUNTED,
) -> int:
    """Records retained in ``topic`` (low to high watermark, summed over partitions)."""
    return sum(
        records_from(m.low, m, counted.get(tp)) for tp, m in watermarks.items() if tp[0] == topic
    )


def pending_timers(
    timer_topic: str,
    geometry: WheelGeometry,
    committed: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, Watermarks],
    counted: Mapping[TopicPartition, RecordCount] = _NOTHING_COUNTED,
) -> dict[str, int]:
    """Timers not yet fired, per wheel level label (every level present, maybe 0)."""
    out = dict.fromkeys(wheel_labels(geometry), 0)
    for tp, marks in watermarks.items():
        topic, partition = tp
        if topic != timer_topic or partition >= geometry.total_partitions:
            continue
        level, _index = geometry.locate(partition)
        out[level_label(level)] += partition_lag(committed.get(tp), marks, counted.get(tp))
    return out


def ranges_to_count(
    settings: Settings,
    watermarks: Mapping[TopicPartition, Watermarks],
    committed: Mapping[str, Mapping[TopicPartition, int]],
    *,
    up_to: int = COUNT_UP_TO,
) -> dict[TopicPartition, int]:
    """Partition -> offset to count records from (to the high watermark): every
    non-empty DLQ partition, and the lag and pending-timer ranges of 1 to
    ``up_to`` offsets (see the module doc)."""
    n = names(settings)
    out: dict[TopicPartition, int] = {}

    def small(tp: TopicPartition, group: str | Mapping[TopicPartition, int]) -> None:
        marks = watermarks.get(tp)
        if marks is not None:
            offsets = committed.get(group, {}) if isinstance(group, str) else group
            start = lag_start(offsets.get(tp), marks)
            if 0 < marks.high - start <= up_to:
                out[tp] = start

    for q in settings.queue_names:
        for tp, marks in watermarks.items():
            if tp[0] == n.dlq(q) and marks.high > marks.low:
                out[tp] = marks.low
        group = n.worker_group(q)
        for topic in queue_topics(settings, q):
            for p in range(settings.queue(q).partitions):
                small((topic, p), group)
    timers = timer_commits(settings, committed)
    for p in range(settings.wheel.total_partitions):
        small((n.timers, p), timers)
    return out


def timer_commits(
    settings: Settings, committed: Mapping[str, Mapping[TopicPartition, int]]
) -> dict[TopicPartition, int]:
    """The timer offsets the emitters committed: per partition the higher of the
    lease group's (firing without transactions) and the offsets group's (in
    transactions)."""
    n = names(settings)
    out: dict[TopicPartition, int] = {}
    for group in (n.emitter_offsets_group, n.emitter_group):
        for tp, offset in committed.get(group, {}).items():
            if tp[0] == n.timers and offset > out.get(tp, -1):
                out[tp] = offset
    return out


def lease_holder(
    lease_topic: str, members: Sequence[GroupMember], shard: int = 0
) -> GroupMember | None:
    """The member assigned partition ``shard`` of the lease topic (the active
    emitter of that shard), if any."""
    for m in members:
        if (lease_topic, shard) in m.partitions:
            return m
    return None


def shard_holders(
    lease_topic: str, members: Sequence[GroupMember], shards: int
) -> dict[int, str | None]:
    """Shard -> client id of its active emitter (None: no emitter holds it)."""
    out: dict[int, str | None] = {}
    for shard in range(shards):
        holder = lease_holder(lease_topic, members, shard)
        out[shard] = holder.client_id if holder is not None else None
    return out


def queue_topics(settings: Settings, queue: str) -> list[str]:
    """Topics a queue's worker group reads: the exec topic and every retry tier."""
    n = names(settings)
    spec = settings.queue(queue)
    return [n.exec(queue)] + [n.retry(queue, t) for t in spec.retry_tiers_ms]


def compute_view(snapshot: ClusterSnapshot, settings: Settings) -> ClusterView:
    """Lag, DLQ depth, pending timers and the active emitter from ``snapshot``."""
    n = names(settings)
    lag: list[LagRow] = []
    lag_by_queue: dict[str, int] = {}
    dlq: dict[str, int] = {}
    counted = snapshot.counted
    for q in settings.queue_names:
        group = n.worker_group(q)
        rows = consumer_lag(
            group,
            queue_topics(settings, q),
            snapshot.committed.get(group, {}),
            snapshot.watermarks,
            counted,
        )
        lag.extend(rows)
        lag_by_queue[q] = sum(r.lag for r in rows)
        dlq[q] = topic_depth(n.dlq(q), snapshot.watermarks, counted)
    timers = pending_timers(
        n.timers,
        settings.wheel,
        timer_commits(settings, snapshot.committed),
        snapshot.watermarks,
        counted,
    )
    failures = tuple(sorted(snapshot.failures, key=lambda f: (f.dead_ms, f.offset), reverse=True))
    return ClusterView(
        taken_ms=snapshot.taken_ms,
        lag=tuple(lag),
        lag_by_queue=lag_by_queue,
        dlq_depth=dlq,
        timers_pending=timers,
        active_emitter=lease_holder(n.lease, snapshot.emitter_members),
        emitter_shards=shard_holders(n.lease, snapshot.emitter_members, settings.wheel.shards),
        emitter_members=len(snapshot.emitter_members),
        emitter_group_state=snapshot.emitter_group_state,
        failures=failures,
        errors=snapshot.errors,
        paused={q: dict(c) for q, c in snapshot.paused.items() if q in settings.queue_names},
    )
