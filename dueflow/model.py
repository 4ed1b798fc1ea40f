"""Domain values shared by producers, the emitter and workers, and their
conversion to and from the Avro record dicts of ``dueflow.schemas``.

Conversion lives here, serialization in the codec: a ``Job`` never touches
bytes itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class BackoffKind(StrEnum):
    EXPONENTIAL = "exponential"
    FIXED = "fixed"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays of a job: ``base_ms * multiplier**(attempt-1)``, capped at ``max_ms``."""

    kind: BackoffKind = BackoffKind.EXPONENTIAL
    base_ms: int = 1_000
    max_ms: int = 3_600_000
    multiplier: float = 2.0
    jitter: bool = True

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "base_ms": self.base_ms,
            "max_ms": self.max_ms,
            "multiplier": self.multiplier,
            "jitter": self.jitter,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | None) -> Backoff | None:
        if rec is None:
            return None
        return cls(
            kind=BackoffKind(rec["kind"]),
            base_ms=rec["base_ms"],
            max_ms=rec["max_ms"],
            multiplier=rec["multiplier"],
            jitter=rec["jitter"],
        )


@dataclass(frozen=True, slots=True)
class Job:
    """One job to run once at or after ``due_ms`` (UTC epoch milliseconds)."""

    job_id: str
    queue: str
    task: str
    payload: bytes
    due_ms: int
    idempotency_key: str
    created_ms: int
    content_type: str = "application/json"
    max_attempts: int = 4
    backoff: Backoff | None = None
    timeout_ms: int | None = None
    jitter_ms: int = 0
    trace: Mapping[str, str] = field(default_factory=dict)
    schedule_id: str | None = None
    schedule_version: int | None = None
    content_hash: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "task": self.task,
            "payload": self.payload,
            "content_type": self.content_type,
            "due_ms": self.due_ms,
            "idempotency_key": self.idempotency_key,
            "max_attempts": self.max_attempts,
            "backoff": None if self.backoff is None else self.backoff.to_record(),
            "timeout_ms": self.timeout_ms,
            "jitter_ms": self.jitter_ms,
            "created_ms": self.created_ms,
            "trace": dict(self.trace),
            "schedule_id": self.schedule_id,
            "schedule_version": self.schedule_version,
            "content_hash": self.content_hash,
            "labels": dict(self.labels),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Job:
        return cls(
            job_id=rec["job_id"],
            queue=rec["queue"],
            task=rec["task"],
            payload=rec["payload"],
            content_type=rec["content_type"],
            due_ms=rec["due_ms"],
            idempotency_key=rec["idempotency_key"],
            max_attempts=rec["max_attempts"],
            backoff=Backoff.from_record(rec["backoff"]),
            timeout_ms=rec["timeout_ms"],
            jitter_ms=rec["jitter_ms"],
            created_ms=rec["created_ms"],
            trace=rec["trace"],
            schedule_id=rec["schedule_id"],
            schedule_version=rec["schedule_version"],
            content_hash=rec["content_hash"],
            labels=rec["labels"],
        )
