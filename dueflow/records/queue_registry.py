"""Queues as data: the queue registry's records and the merge with static config (pure).

``<prefix>.queues`` is compacted, one partition, keyed by the queue name
(UTF-8); the value is Avro ``dueflow.Queue`` (``schemas/dueflow/schemas/queue.avsc``): every
field of :class:`~dueflow.config.QueueSpec`, plus who wrote it and when. A
tombstone (null value) deletes the queue from the registry; its topics stay.
``dueflow queue create`` writes a record only after the queue's topics exist,
so a registered queue always has its topics.

Processes know two kinds of queues:

- static ones, from their settings (``DUEFLOW_QUEUES``, ``[[queues]]``, or
  the built-in ``default``): known from the start, a bootstrap;
- registered ones, read from the registry at start and tailed afterwards.

Merge rule (:func:`merge_queues`): **the registry wins**. A queue in the
registry has the registry's spec in every process, whatever its static
config says; a static queue the registry does not have keeps its static spec.
A queue in both whose specs differ is a :class:`QueueConflict`: every process
logs it and ``dueflow queue list`` shows it, because the static config of that
process is wrong about the cluster (``topics ensure`` from it would report the
topics as mismatched). The registry's spec is the one its topics were created
with, so using it is always safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from dueflow import headers as hdr
from dueflow.config import QueueSpec, validate_queue
from dueflow.errors import ConfigError, UndecodableRecord
from dueflow.records import codec

SPEC_FIELDS = tuple(f.name for f in fields(QueueSpec) if f.name != "name")


@dataclass(frozen=True, slots=True)
class RegisteredQueue:
    """A queue as the registry has it."""

    spec: QueueSpec
    created_ms: int = 0
    created_by: str = ""
    offset: int = -1  # where it was read (-1: not read from the topic)

    def to_json(self) -> dict[str, object]:
        return {
            **spec_json(self.spec),
            "created_ms": self.created_ms,
            "created_by": self.created_by,
        }


def spec_json(spec: QueueSpec) -> dict[str, object]:
    """A spec as plain JSON values (for ``--json`` output)."""
    return {
        "name": spec.name,
        "partitions": spec.partitions,
        "retry_tiers_ms": list(spec.retry_tiers_ms),
        "idempotency_retention_ms": spec.idempotency_retention_ms,
        "rate_limit_per_s": spec.rate_limit_per_s,
    }


def queue_key(name: str) -> bytes:
    return name.encode()


def queue_record(spec: QueueSpec, *, created_ms: int, created_by: str) -> dict[str, object]:
    """The Avro record (``dueflow.Queue``) of ``spec``."""
    return {
        "name": spec.name,
        "partitions": spec.partitions,
        "retry_tiers_ms": list(spec.retry_tiers_ms),
        "idempotency_retention_ms": spec.idempotency_retention_ms,
        "rate_limit_per_s": (
            float(spec.rate_limit_per_s) if spec.rate_limit_per_s is not None else None
        ),
        "created_ms": created_ms,
        "created_by": created_by,
    }


def encode_queue(
    spec: QueueSpec, *, created_ms: int, created_by: str
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of the registry record of ``spec`` (checked first)."""
    validate_queue(spec)
    value = codec.encode("queue", queue_record(spec, created_ms=created_ms, created_by=created_by))
    return queue_key(spec.name), value, [(hdr.SCHEMA, codec.schema_header("queue"))]


def decode_queue(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    *,
    offset: int = -1,
) -> tuple[str, RegisteredQueue | None]:
    """The queue name and spec of a registry record (``None``: a tombstone).

    :class:`UndecodableRecord` says why a record is no queue: no key, a key that
    is no queue name, bytes that are no ``dueflow.Queue``, a spec that is not
    valid, or a name that is not the key.
    """
    if not key:
        raise UndecodableRecord("queue registry record without a key (the queue name)")
    try:
        name = key.decode()
    except UnicodeDecodeError:
        raise UndecodableRecord(f"queue registry key is not UTF-8: {key[:60]!r}") from None
    if value is None:
        return name, None
    version = codec.parse_schema_header(hdr.header(headers, hdr.SCHEMA), expected="queue")
    rec = codec.decode("queue", value, writer_version=version)
    if rec["name"] != name:
        raise UndecodableRecord(f"queue registry record names {rec['name']!r}, its key {name!r}")
    spec = QueueSpec(
        name=rec["name"],
        partitions=rec["partitions"],
        retry_tiers_ms=tuple(rec["retry_tiers_ms"]),
        idempotency_retention_ms=rec["idempotency_retention_ms"],
        rate_limit_per_s=rec["rate_limit_per_s"],
    )
    try:
        validate_queue(spec, f"queue {name!r}")
    except ConfigError as exc:
        raise UndecodableRecord(f"invalid queue spec: {exc}") from None
    return name, RegisteredQueue(spec, rec["created_ms"], rec["created_by"], offset)


# --------------------------------------------------------------------- merging


@dataclass(frozen=True, slots=True)
class QueueConflict:
    """A queue whose static spec differs from the registry's in ``field``."""

    queue: str
    field: str
    static: object
    registered: object

    def __str__(self) -> str:
        return (
            f"queue {self.queue!r}: {self.field} is {self.registered!r} in the queue registry "
            f"but {self.static!r} in the static config (DUEFLOW_QUEUES / [[queues]]); "
            "the registry's is used: fix or drop the static entry"
        )


@dataclass(frozen=True, slots=True)
class QueueView:
    """The queues a process knows: merged specs, where each comes from, conflicts."""

    specs: Mapping[str, QueueSpec]
    sources: Mapping[str, str] = field(default_factory=dict)  # static | registry | both
    conflicts: tuple[QueueConflict, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.specs)

    def get(self, name: str) -> QueueSpec | None:
        return self.specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.specs


def spec_conflicts(static: QueueSpec, registered: QueueSpec) -> list[QueueConflict]:
    """The fields in which a static spec differs from the registered one."""
    out = []
    for name in SPEC_FIELDS:
        a, b = getattr(static, name), getattr(registered, name)
        if a != b:
            out.append(QueueConflict(static.name, name, a, b))
    return out


def merge_queues(static: Iterable[QueueSpec], registered: Mapping[str, QueueSpec]) -> QueueView:
    """Static queues and registered ones: the registry wins (see the module doc).

    Order: static queues as configured, then registry-only queues by name.
    """
    specs: dict[str, QueueSpec] = {}
    sources: dict[str, str] = {}
    conflicts: list[QueueConflict] = []
    for q in static:
        reg = registered.get(q.name)
        if reg is None:
            specs[q.name], sources[q.name] = q, "static"
            continue
        specs[q.name], sources[q.name] = reg, "both"
        conflicts.extend(spec_conflicts(q, reg))
    for name in sorted(registered):
        if name not in specs:
            specs[name], sources[name] = registered[name], "registry"
    return QueueView(specs, sources, tuple(conflicts))


class QueueCatalog:
    """The registry folded in log order, merged with the static queues (no I/O)."""

    def __init__(self, static: Sequence[QueueSpec]) -> None:
        self.static = tuple(static)
        self.registered: dict[str, RegisteredQueue] = {}
        self._view = merge_queues(self.static, {})

    @property
    def view(self) -> QueueView:
        return self._view

    def apply(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
        *,
        offset: int = -1,
    ) -> str | None:
        """Apply one registry record; the name of the queue whose spec changed (or
        ``None``). :class:`UndecodableRecord` for a record that is no queue: the
        catalog is then unchanged."""
        name, queue = decode_queue(key, value, headers, offset=offset)
        before = self.registered.get(name)
        if queue is None:
            if before is None:
                return None
            del self.registered[name]
        else:
            self.registered[name] = queue
            if before is not None and before.spec == queue.spec:
                return None
        self._view = merge_queues(self.static, {n: q.spec for n, q in self.registered.items()})
        return name
