"""Feature flags of a queue in the control topic (pure): ``dueflow queue finalize``.

A queue's features record lives in the compacted ``<prefix>.control``
beside the pause commands, keyed ``features:<queue>``::

    {"v": 1, "steering": 1, "by": "ada@host", "at_ms": 1900000000000}

``steering`` 1 says every worker of the queue applies commands
(:mod:`dueflow.records.command`): clients then cancel, move and update its jobs
with commands instead of the idempotency records of the release before. Like
Kafka's ``metadata.version``, it only goes up: a record with a lower level
than the one before is read as the higher one. Workers of the release
before ignore the key (keys other than ``queue:`` are reserved for other
commands). The newest record of a key wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from dueflow.errors import InvalidInput, UndecodableRecord

FEATURES_TARGET = "features:"
VERSION = 1
STEERING = 1  # the steering level this release writes and reads
WORKER_CLIENT = "dueflow-worker"
# The first release whose workers apply commands.
MIN_STEERING_VERSION = (0, 1, 0)
_CLIENT_ID = re.compile(r"^dueflow-worker/(\d+)\.(\d+)\.(\d+)[^/]*/")


def worker_client_id(version: str, host: str) -> str:
    """The ``client.id`` of a worker's group consumer: ``dueflow-worker/<version>/<host>``
    (what ``queue finalize`` checks)."""
    return f"{WORKER_CLIENT}/{version}/{host}"


def steering_capable(client_id: str) -> bool:
    """Whether a worker group member with ``client_id`` applies commands."""
    m = _CLIENT_ID.match(client_id or "")
    return m is not None and tuple(int(x) for x in m.groups()) >= MIN_STEERING_VERSION


@dataclass(frozen=True, slots=True)
class QueueFeatures:
    """What a queue's workers can do, as the operator finalized it."""

    queue: str
    steering: int = 0
    by: str = ""
    at_ms: int = 0

    @property
    def steerable(self) -> bool:
        """Clients steer its jobs with commands."""
        return self.steering >= STEERING

    def to_json(self) -> dict[str, object]:
        return {"queue": self.queue, "steering": self.steering, "by": self.by, "at_ms": self.at_ms}


def features_key(queue: str) -> bytes:
    return f"{FEATURES_TARGET}{queue}".encode()


def encode_features(features: QueueFeatures) -> tuple[bytes, bytes]:
    """``(key, value)`` of a features record."""
    if not features.queue:
        raise InvalidInput("queue", features.queue, "a queue name")
    value = orjson.dumps(
        {"v": VERSION, "steering": features.steering, "by": features.by, "at_ms": features.at_ms}
    )
    return features_key(features.queue), value


def decode_features(key: bytes | None, value: bytes | None) -> QueueFeatures | None:
    """The features in a control record; ``None`` for a record about something else.
    :class:`UndecodableRecord` for a ``features:`` record that is no such document."""
    if key is None or not key.startswith(FEATURES_TARGET.encode()):
        return None
    try:
        queue = key[len(FEATURES_TARGET) :].decode()
    except UnicodeDecodeError:
        raise UndecodableRecord(f"features key is not UTF-8: {key[:60]!r}") from None
    if not queue:
        raise UndecodableRecord("features key names no queue")
    if value is None:
        return QueueFeatures(queue)
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise UndecodableRecord(f"features value is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UndecodableRecord(f"features value is not a JSON object: {value[:120]!r}")
    level = doc.get("steering", 0)
    if type(level) is not int or level < 0:
        raise UndecodableRecord(f"features value: steering {level!r} is not a level (0, 1, ...)")
    at_ms = doc.get("at_ms", 0)
    return QueueFeatures(
        queue, steering=level, by=str(doc.get("by", "")), at_ms=at_ms if type(at_ms) is int else 0
    )


def fold_features(records: Iterable[QueueFeatures]) -> dict[str, QueueFeatures]:
    """Fold records in log order: each queue's features, levels never going down."""
    out: dict[str, QueueFeatures] = {}
    for f in records:
        before = out.get(f.queue)
        if before is None or f.steering >= before.steering:
            out[f.queue] = f
    return out
