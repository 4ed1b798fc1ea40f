"""The topic layout of dueflow, computed from settings (pure).

Every topic of shared/DESIGN.md, with its partition count and the configs
that matter. ``critical`` configs are the ones whose difference breaks a
guarantee (a timer topic with time retention loses timers; an idempotency
topic that is not compacted loses dedup; a steering topic with time
retention loses the state of pending steered jobs), so ``topics ensure``
refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dueflow.config import QueueSpec, Settings

HOUR_MS = 3_600_000
WEEK_MS = 7 * 24 * HOUR_MS
# How much larger max.message.bytes the DLQ and quarantine topics get than the
# largest of the others: a dead letter wraps a job's record (its value, its
# headers twice, the error texts: at most 2,000 characters of message and
# 16,000 of traceback), a quarantine record wraps any record with its key twice
# and the reason. With this headroom neither has to be trimmed for a record that
# fit its own topic, unless its headers are very large
# (dueflow.records.size_budget, docs/operations.md).
SET_ASIDE_HEADROOM = 128 * 1024
SET_ASIDE_ROLES = frozenset({"dlq", "quarantine"})


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as dueflow needs it."""

    name: str
    role: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)
    critical: frozenset[str] = frozenset({"cleanup.policy"})
    queue: str | None = None
    # Partitions may be added in steps of this many (0: the count never changes):
    # `topics ensure` grows a topic with fewer; fewer than it has is never possible.
    grows_by: int = 0

    def growth_from(self, have: int) -> int | None:
        """How many partitions to add to a topic of ``have`` partitions; None when
        it cannot be grown to :attr:`partitions` (pure)."""
        if not self.grows_by or have >= self.partitions or have % self.grows_by:
            return None
        return self.partitions - have


def tier_label(delay_ms: int) -> str:
    """Topic-name label of a retry tier: 1000 -> '1s', 60000 -> '1m', 1500 -> '1500ms'."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if delay_ms % size == 0:
            return f"{delay_ms // size}{unit}"
    return f"{delay_ms}ms"


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Names of dueflow's topics under one prefix."""

    prefix: str = "dueflow"

    @property
    def timers(self) -> str:
        return f"{self.prefix}.timers"

    @property
    def lease(self) -> str:
        return f"{self.prefix}.emitter.lease"

    @property
    def schedules(self) -> str:
        return f"{self.prefix}.schedules"

    @property
    def outcomes(self) -> str:
        return f"{self.prefix}.outcomes"

    @property
    def quarantine(self) -> str:
        return f"{self.prefix}.quarantine"

    @property
    def queues(self) -> str:
        """Compacted queue registry: a queue's spec keyed by its name (docs/queues.md)."""
        return f"{self.prefix}.queues"

    @property
    def clock(self) -> str:
        """Where processes measure their clock against the broker's (dueflow.rules.clock_offset)."""
        return f"{self.prefix}.clock"

    @property
    def control(self) -> str:
        """Compacted operator commands (queue pause/resume), keyed by target."""
        return f"{self.prefix}.control"

    def exec(self, queue: str) -> str:
        return f"{self.prefix}.exec.{queue}"

    def retry(self, queue: str, delay_ms: int) -> str:
        return f"{self.prefix}.retry.{queue}.{tier_label(delay_ms)}"

    def dlq(self, queue: str) -> str:
        return f"{self.prefix}.dlq.{queue}"

    def idempotency(self, queue: str) -> str:
        return f"{self.prefix}.idempotency.{queue}"

    def steering(self, queue: str) -> str:
        """Compacted state of steered jobs, written only by the owner of each exec
        partition (dueflow.records.steering_state)."""
        return f"{self.prefix}.steering.{queue}"

    # consumer groups and transactional ids
    @property
    def emitter_group(self) -> str:
        return f"{self.prefix}.emitter"

    @property
    def emitter_transactional_id(self) -> str:
        return f"{self.prefix}.emitter"

    def emitter_transactional_ids(self, count: int, shard: int = 0) -> list[str]:
        """The producers' ids of the active emitter of ``shard``: shard 0's first is
        :attr:`emitter_transactional_id` (the ids of a deployment without shards),
        shard s's is ``<prefix>.emitter.s<s>``."""
        first = self.emitter_transactional_id + (f".s{shard}" if shard else "")
        return [first] + [f"{first}.{i}" for i in range(1, count)]

    @property
    def emitter_cron(self) -> str:
        """Compacted: per schedule id, the version whose next occurrence is in the wheel."""
        return f"{self.prefix}.emitter.cron"

    @property
    def emitter_offsets_group(self) -> str:
        """Group that holds the emitter's timer offsets and checkpoints.

        Nobody subscribes with it: the active emitter commits into it through its
        transactions, so it is kept apart from the lease group, whose members are
        live processes.
        """
        return f"{self.prefix}.emitter.offsets"

    def worker_group(self, queue: str) -> str:
        return f"{self.prefix}.worker.{queue}"


def names(settings: Settings) -> TopicNames:
    return TopicNames(settings.topic_prefix)


def topic_layout(settings: Settings) -> list[TopicSpec]:
    """Every topic dueflow needs for ``settings``, in a stable order."""
    n = names(settings)
    isr = {"min.insync.replicas": str(settings.min_insync_replicas)}
    forever = {"retention.ms": "-1", "retention.bytes": "-1"}
    specs = [
        TopicSpec(
            n.timers,
            "timers",
            settings.wheel.total_partitions,
            {
                "cleanup.policy": "delete",
                **forever,
                # Broker time on every timer: a clock that all emitters share.
                "message.timestamp.type": "LogAppendTime",
                **isr,
            },
            critical=frozenset(
                {"cleanup.policy", "retention.ms", "retention.bytes", "message.timestamp.type"}
            ),
            # More shards: whole wheels appended (the existing partitions keep
            # their place, so their timers stay where the emitters look).
            grows_by=settings.wheel.shard_partitions,
        ),
        # One partition per shard: its holder is the shard's active emitter.
        TopicSpec(
            n.lease, "lease", settings.wheel.shards, {"cleanup.policy": "delete", **isr}, grows_by=1
        ),
        TopicSpec(
            n.emitter_cron,
            "cron-state",
            1,
            {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", **isr},
        ),
        TopicSpec(
            n.schedules,
            "schedules",
            settings.schedules_partitions,
            {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", **isr},
        ),
        TopicSpec(
            n.outcomes,
            "outcomes",
            settings.outcomes_partitions,
            {"cleanup.policy": "delete", "retention.ms": str(WEEK_MS), **isr},
        ),
        TopicSpec(n.quarantine, "quarantine", 1, {"cleanup.policy": "delete", **forever, **isr}),
        TopicSpec(n.control, "control", 1, {"cleanup.policy": "compact", **isr}),
        registry_topic(n, isr),
        TopicSpec(
            n.clock,
            "clock",
            1,
            {
                "cleanup.policy": "delete",
                "retention.ms": str(HOUR_MS),
                "segment.ms": str(HOUR_MS),
                # The acknowledgement then carries the broker's time.
                "message.timestamp.type": "LogAppendTime",
                **isr,
            },
            critical=frozenset({"cleanup.policy", "message.timestamp.type"}),
        ),
    ]
    for q in settings.queues:
        specs.extend(queue_topics(n, q, isr))
    return specs


def registry_topic(n: TopicNames, isr: Mapping[str, str]) -> TopicSpec:
    """The queue registry: compacted (the latest spec of every queue is kept for
    ever), one partition, so every reader sees the records in write order."""
    return TopicSpec(
        n.queues,
        "queues",
        1,
        {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", **isr},
    )


def queue_topics(n: TopicNames, q: QueueSpec, isr: Mapping[str, str]) -> list[TopicSpec]:
    """The co-partitioned topics of one queue."""
    p = q.partitions
    specs = [
        TopicSpec(
            n.exec(q.name),
            "exec",
            p,
            {"cleanup.policy": "delete", "retention.ms": str(WEEK_MS), **isr},
            queue=q.name,
        ),
    ]
    specs.extend(
        TopicSpec(
            n.retry(q.name, tier),
            "retry",
            p,
            {"cleanup.policy": "delete", "retention.ms": str(WEEK_MS), **isr},
            queue=q.name,
        )
        for tier in q.retry_tiers_ms
    )
    specs.append(
        TopicSpec(
            n.dlq(q.name),
            "dlq",
            p,
            {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", **isr},
            queue=q.name,
        )
    )
    specs.append(
        TopicSpec(
            n.idempotency(q.name),
            "idempotency",
            p,
            {
                # compact keeps the last state per key; delete bounds the store.
                "cleanup.policy": "compact,delete",
                "retention.ms": str(q.idempotency_retention_ms),
                "segment.ms": str(min(q.idempotency_retention_ms, 3_600_000)),
                "min.cleanable.dirty.ratio": "0.1",
                **isr,
            },
            queue=q.name,
        )
    )
    specs.append(
        TopicSpec(
            n.steering(q.name),
            "steering",
            p,
            {
                # compact only: an entry lives as long as its job has timers in the
                # wheel, whatever the time; the owner removes it with a tombstone.
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": "0.1",
                "segment.ms": str(HOUR_MS),
                **isr,
            },
            queue=q.name,
        )
    )
    return specs
