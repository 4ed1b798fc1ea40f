"""Operator commands on the control topic (pure): pausing and resuming queues.

``<prefix>.control`` is compacted, one partition, keyed by target. A queue's
target is ``queue:<name>``; its value is a small JSON document::

    {"v": 1, "action": "pause", "queue": "billing", "by": "ada@host", "at_ms": 1700000000000,
     "reason": "downstream outage"}

``action`` is ``pause`` or ``resume``; a tombstone (null value) means
resumed too. The newest record of a key wins. Workers tail the topic and
stop starting jobs of a paused queue (its partitions are paused, the group
membership stays); the emitter ignores it and keeps firing into the queue,
so the work waits in the exec topic. See docs/wire-format.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from dueflow.errors import FieldOutOfRange, InvalidInput, UndecodableRecord
from dueflow.rules.wire_bounds import (
    MAX_DUE_MS,
    MAX_NAME_CHARS,
    MIN_TIME_MS,
    MS_ACCEPTED,
    in_range,
)

QUEUE_TARGET = "queue:"
ACTIONS = ("pause", "resume")
VERSION = 1
MAX_REASON_CHARS = 1_000  # an operator's reason for a pause


@dataclass(frozen=True, slots=True)
class QueueControl:
    """The operator's last word on one queue."""

    queue: str
    paused: bool
    by: str = ""
    at_ms: int = 0
    reason: str = ""

    @property
    def action(self) -> str:
        return "pause" if self.paused else "resume"

    def to_json(self) -> dict[str, object]:
        return {
            "queue": self.queue,
            "paused": self.paused,
            "by": self.by,
            "at_ms": self.at_ms,
            "reason": self.reason,
        }


def queue_key(queue: str) -> bytes:
    return f"{QUEUE_TARGET}{queue}".encode()


def encode_control(control: QueueControl) -> tuple[bytes, bytes]:
    """``(key, value)`` of the control record."""
    if not control.queue:
        raise InvalidInput("queue", control.queue, "a queue name")
    if len(control.by) > MAX_NAME_CHARS:
        raise InvalidInput("by", control.by, f"at most {MAX_NAME_CHARS} characters")
    if len(control.reason) > MAX_REASON_CHARS:
        raise InvalidInput("reason", control.reason, f"at most {MAX_REASON_CHARS} characters")
    value = orjson.dumps(
        {
            "v": VERSION,
            "action": control.action,
            "queue": control.queue,
            "by": control.by,
            "at_ms": control.at_ms,
            "reason": control.reason,
        }
    )
    return queue_key(control.queue), value


def decode_control(key: bytes | None, value: bytes | None) -> QueueControl | None:
    """The command in a control record; ``None`` for a target that is not a queue
    (other commands may share the topic later). :class:`UndecodableRecord` for a
    record that is no command."""
    if key is None:
        raise UndecodableRecord("control record without a key")
    try:
        target = key.decode()
    except UnicodeDecodeError:
        raise UndecodableRecord(f"control key is not UTF-8: {key[:60]!r}") from None
    if not target.startswith(QUEUE_TARGET):
        return None
    queue = target[len(QUEUE_TARGET) :]
    if not queue:
        raise UndecodableRecord(f"control key {target!r} names no queue")
    if value is None:
        return QueueControl(queue, paused=False)
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise UndecodableRecord(f"control value is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("action") not in ACTIONS:
        raise UndecodableRecord(f"control value has no action of {ACTIONS}: {value[:120]!r}")
    if doc.get("queue", queue) != queue:
        raise UndecodableRecord(f"control value names queue {doc.get('queue')!r}, key {queue!r}")
    at_ms = in_range(
        doc.get("at_ms", 0), "at_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED
    )
    by = doc.get("by", "")
    if not isinstance(by, str) or len(by) > MAX_NAME_CHARS:
        raise FieldOutOfRange("by", by, f"a string of at most {MAX_NAME_CHARS} characters")
    reason = doc.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise FieldOutOfRange(
            "reason", reason, f"a string of at most {MAX_REASON_CHARS} characters"
        )
    return QueueControl(queue, paused=doc["action"] == "pause", by=by, at_ms=at_ms, reason=reason)


def paused_queues(controls: Iterable[QueueControl]) -> dict[str, QueueControl]:
    """Fold commands in log order: the queues paused now, with the pausing command."""
    out: dict[str, QueueControl] = {}
    for c in controls:
        if c.paused:
            out[c.queue] = c
        else:
            out.pop(c.queue, None)
    return out
