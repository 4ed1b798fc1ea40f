"""What Kafka itself says about a dueflow deployment (pure computation).

A :class:`ClusterSnapshot` holds raw observations read from the cluster
(watermarks, committed offsets, the emitter group's members, the newest DLQ
records); :func:`compute_view` turns it into the numbers operators look at:
consumer lag per group/topic/partition, DLQ depth per queue, pending timers
per wheel level and the active emitter. The reader that fills a snapshot is
``dueflow.streams.status.cluster_reader``; the CLI and the status view both
use it.

Definitions (all exact and cheap: no record is read):

- lag of a group on a partition = high watermark - committed offset; with no
  committed offset, high - low (everything retained is still to be read).
  With transactional producers a committed partition may show a lag of 1:
  the commit marker occupies an offset.
- DLQ depth = high - low watermark, summed over the DLQ topic's partitions.
- pending timers of a wheel level = high watermark - max(committed offset of
  the emitter group, low watermark), summed over the level's partitions
  (``geometry.locate``); level ``near`` holds timers due within seconds.
- active emitter = the member of the emitter group assigned partition 0 of
  the lease topic; none when no member holds it.
- paused queues = what the control topic says (``dueflow queue pause``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dueflow.config import Settings
from dueflow.topics import names
from dueflow.wheel import NEAR_LEVEL, WheelGeometry

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Watermarks:
    low: int
    high: int


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
    # queue -> the operator's pause command (``dueflow.control.QueueControl.to_json``)
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

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape of ``/api/cluster`` and ``status --json``)."""
        out = asdict(self)
        out["lag"] = [asdict(r) for r in self.lag]
        out["failures"] = [asdict(f) for f in self.failures]
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


def partition_lag(committed: int | None, marks: Watermarks) -> int:
    """Records a group still has to read on one partition (never negative)."""
    start = marks.low if committed is None or committed < 0 else max(committed, marks.low)
    return max(0, marks.high - start)


def consumer_lag(
    group: str,
    topics: Sequence[str],
    committed: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, Watermarks],
) -> list[LagRow]:
    """Lag of ``group`` on every known partition of ``topics``."""
    rows = []
    for (topic, partition), marks in sorted(watermarks.items()):
        if topic not in topics:
            continue
        offset = committed.get((topic, partition))
        rows.append(
            LagRow(group, topic, partition, offset, marks.high, partition_lag(offset, marks))
        )
    return rows


def topic_depth(topic: str, watermarks: Mapping[TopicPartition, Watermarks]) -> int:
    """Records retained in ``topic`` (high - low, summed over partitions)."""
    return sum(max(0, m.high - m.low) for (t, _), m in watermarks.items() if t == topic)


def pending_timers(
    timer_topic: str,
    geometry: WheelGeometry,
    committed: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, Watermarks],
) -> dict[str, int]:
    """Timers not yet fired, per wheel level label (every level present, maybe 0)."""
    out = dict.fromkeys(wheel_labels(geometry), 0)
    for (topic, partition), marks in watermarks.items():
        if topic != timer_topic or partition >= geometry.total_partitions:
            continue
        level, _index = geometry.locate(partition)
        out[level_label(level)] += partition_lag(committed.get((topic, partition)), marks)
    return out


def lease_holder(lease_topic: str, members: Sequence[GroupMember]) -> GroupMember | None:
    """The member assigned partition 0 of the lease topic, if any."""
    for m in members:
        if (lease_topic, 0) in m.partitions:
            return m
    return None


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
    for q in settings.queue_names:
        group = n.worker_group(q)
        rows = consumer_lag(
            group, queue_topics(settings, q), snapshot.committed.get(group, {}), snapshot.watermarks
        )
        lag.extend(rows)
        lag_by_queue[q] = sum(r.lag for r in rows)
        dlq[q] = topic_depth(n.dlq(q), snapshot.watermarks)
    timers = pending_timers(
        n.timers,
        settings.wheel,
        snapshot.committed.get(n.emitter_group, {}),
        snapshot.watermarks,
    )
    failures = tuple(sorted(snapshot.failures, key=lambda f: (f.dead_ms, f.offset), reverse=True))
    return ClusterView(
        taken_ms=snapshot.taken_ms,
        lag=tuple(lag),
        lag_by_queue=lag_by_queue,
        dlq_depth=dlq,
        timers_pending=timers,
        active_emitter=lease_holder(n.lease, snapshot.emitter_members),
        emitter_members=len(snapshot.emitter_members),
        emitter_group_state=snapshot.emitter_group_state,
        failures=failures,
        errors=snapshot.errors,
        paused={q: dict(c) for q, c in snapshot.paused.items() if q in settings.queue_names},
    )
