"""Create and describe registered queues (I/O edge of :mod:`dueflow.records.queue_registry`).

:func:`create_queue` makes the queue's topics first (exec, retry tiers, DLQ,
idempotency: ``dueflow.kafka.topics.queue_topics``) and writes the registry record
only when they all exist as the spec needs them, so a registered queue always
has its topics. Creating a queue again with the same spec is a no-op (its
topics are checked again, a missing one is created); another spec under the
same name is refused: a queue's partitions cannot change without breaking
co-partitioning, and its retry tiers are topics (see docs/queues.md).

There is deliberately no ``delete``: the timers of a queue wait in the shared
timing wheel, where no cheap check can prove that none is pending; a
registry tombstone would make the emitter quarantine them when they come
due. docs/queues.md says how to retire a queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dueflow.config import QueueSpec, Settings, validate_queue
from dueflow.errors import ConflictError, KafkaOperationError, TopicMismatch
from dueflow.kafka.clients import make_admin, make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.queue_reader import read_registry
from dueflow.kafka.topic_admin import Difference, TopicAdmin, TopicState, compare
from dueflow.kafka.topics import TopicSpec, names, queue_topics, registry_topic
from dueflow.records.queue_registry import QueueConflict, encode_queue, spec_conflicts, spec_json


@dataclass(slots=True)
class CreatedQueue:
    """What ``queue create`` did."""

    spec: QueueSpec
    registered: bool  # False: it was registered with this spec already
    topics_created: list[str] = field(default_factory=list)
    topics_unchanged: list[str] = field(default_factory=list)
    notes: list[Difference] = field(default_factory=list)  # non-critical config notes
    static_conflicts: list[QueueConflict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.spec.name,
            "spec": spec_json(self.spec),
            "registered": self.registered,
            "topics_created": self.topics_created,
            "topics_unchanged": self.topics_unchanged,
            "notes": [str(d) for d in self.notes],
            "static_conflicts": [str(c) for c in self.static_conflicts],
        }


def topics_of(settings: Settings, spec: QueueSpec) -> list[TopicSpec]:
    """The co-partitioned topics of ``spec`` under ``settings``' prefix."""
    isr = {"min.insync.replicas": str(settings.min_insync_replicas)}
    return queue_topics(names(settings), spec, isr)


def create_queue(
    settings: Settings,
    spec: QueueSpec,
    *,
    by: str,
    now_ms: int,
    admin: TopicAdmin | None = None,
    timeout_s: float = 30.0,
) -> CreatedQueue:
    """Create ``spec``'s topics, then register it (see the module doc).

    Raises :class:`ConflictError` when the registry has the queue with another
    spec and :class:`TopicMismatch` when one of its topics exists with other
    partitions or a critical config; nothing is registered then.
    """
    validate_queue(spec)
    admin = admin or TopicAdmin(
        make_admin(settings), replication_factor=settings.replication_factor
    )
    isr = {"min.insync.replicas": str(settings.min_insync_replicas)}
    base = admin.ensure([registry_topic(names(settings), isr)])
    _refuse_mismatches(base.differences, "the queue registry topic")
    reader = read_registry(settings, timeout_s)
    if reader.missing:
        raise KafkaOperationError(f"the queue registry {reader.topic} could not be read")
    existing = reader.catalog.registered.get(spec.name)
    if existing is not None and existing.spec != spec:
        diffs = ", ".join(
            f"{c.field} {c.registered!r} (asked: {c.static!r})"
            for c in spec_conflicts(spec, existing.spec)
        )
        raise ConflictError(
            f"queue {spec.name!r} exists with another spec: {diffs}; a queue's spec "
            "does not change in place (docs/queues.md)"
        )
    specs = topics_of(settings, spec)
    # Existing topics that do not fit refuse the queue before anything is created.
    _refuse_mismatches(
        [
            d
            for st, s in zip(admin.describe(specs), specs, strict=True)
            if st.partitions is not None
            for d in compare(s, st)
        ],
        f"queue {spec.name!r}",
    )
    report = admin.ensure(specs)
    _refuse_mismatches(report.differences, f"queue {spec.name!r}")
    result = CreatedQueue(
        spec,
        registered=existing is None,
        topics_created=list(report.created),
        topics_unchanged=list(report.unchanged),
        notes=[d for d in report.differences if not d.critical],
    )
    static = next((q for q in settings.queues if q.name == spec.name), None)
    if static is not None:
        result.static_conflicts = spec_conflicts(static, spec)
    if existing is None:
        _write(settings, spec, by=by, now_ms=now_ms, timeout_s=timeout_s)
    return result


def _refuse_mismatches(differences: Sequence[Difference], what: str) -> None:
    critical = [str(d) for d in differences if d.critical]
    if critical:
        raise TopicMismatch(
            f"{what}: existing topics differ from what it needs, nothing was created or "
            "registered: " + "; ".join(critical)
        )


def _write(settings: Settings, spec: QueueSpec, *, by: str, now_ms: int, timeout_s: float) -> None:
    key, value, headers = encode_queue(spec, created_ms=now_ms, created_by=by)
    producer = make_producer(settings)
    errors: list[Any] = []
    produce: Any = producer.produce  # headers: list[tuple[str, bytes]]
    produce(
        names(settings).queues,
        value,
        key,
        headers=headers,
        on_delivery=lambda err, _msg: errors.append(err),
    )
    left = served(producer.flush, timeout_s)
    if left or errors != [None]:
        raise KafkaOperationError(f"queue registry record not written: {errors or 'timed out'}")


def describe_topics(settings: Settings, spec: QueueSpec) -> list[tuple[TopicSpec, TopicState]]:
    """Each topic the queue needs, with what the cluster has (partitions ``None``:
    missing)."""
    specs = topics_of(settings, spec)
    admin = TopicAdmin(make_admin(settings), replication_factor=settings.replication_factor)
    states = {s.name: s for s in admin.describe(specs)}
    return [(s, states[s.name]) for s in specs]
