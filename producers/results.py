"""What the scheduling client returns: plain values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from dueflow.errors import DueflowError, InvalidInput
from dueflow.timeutil import format_utc, from_utc_ms


class Scheduled(NamedTuple):
    """A job that is in the timer topic.

    ``duplicate`` is True when the same job id with the same content had
    already been scheduled through this client: nothing new was written and
    the values are those of the first call.
    """

    job_id: str
    due_ms: int
    queue: str
    task: str
    idempotency_key: str
    content_hash: str
    partition: int
    duplicate: bool = False

    @property
    def due(self) -> datetime:
        """The due time as a tz-aware UTC datetime."""
        return from_utc_ms(self.due_ms)

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "due_ms": self.due_ms,
            "due": format_utc(self.due_ms),
            "queue": self.queue,
            "task": self.task,
            "idempotency_key": self.idempotency_key,
            "partition": self.partition,
            "duplicate": self.duplicate,
        }


@dataclass(frozen=True, slots=True)
class BulkError:
    """Why job ``index`` of a ``schedule_many`` call was not scheduled (nothing of it
    was written). ``str()`` names the job, and for invalid input the field, the
    value and what is accepted: ``jobs[3] (job id 'a'): delay: got ...; accepted: ...``.
    """

    index: int
    job_id: str | None
    error: DueflowError

    @property
    def field(self) -> str | None:
        """The rejected field, for invalid input."""
        return self.error.field if isinstance(self.error, InvalidInput) else None

    def __str__(self) -> str:
        job = f"jobs[{self.index}]"
        if self.job_id is not None:
            job += f" (job id {self.job_id!r})"
        return f"{job}: {self.error.message}"

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "job_id": self.job_id,
            "error": type(self.error).__name__,
            "field": self.field,
            "message": self.error.message,
            "retriable": self.error.retriable,
        }


@dataclass(slots=True)
class BulkResult:
    """Outcome of ``schedule_many``: counts, per-job errors, ids and due times.

    ``job_ids[i]`` and ``due_ms[i]`` belong to input ``i`` (``None`` when it
    failed). ``scheduled`` counts new jobs the broker acknowledged,
    ``duplicates`` jobs accepted idempotently without a write.
    """

    total: int = 0
    scheduled: int = 0
    duplicates: int = 0
    errors: list[BulkError] = field(default_factory=list)
    job_ids: list[str | None] = field(default_factory=list)
    due_ms: list[int | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def failed(self) -> int:
        return len(self.errors)

    def to_json(self) -> dict[str, object]:
        return {
            "total": self.total,
            "scheduled": self.scheduled,
            "duplicates": self.duplicates,
            "failed": self.failed,
            "errors": [e.to_json() for e in self.errors],
        }


class Cancelled(NamedTuple):
    """A cancellation written for ``idempotency_key`` on ``queue``.

    Workers skip a job whose key is cancelled. A job that already ran stays
    done; ``known`` says whether this client had scheduled the job itself.
    """

    job_id: str
    queue: str
    idempotency_key: str
    partition: int
    at_ms: int
    known: bool

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "idempotency_key": self.idempotency_key,
            "partition": self.partition,
            "at_ms": self.at_ms,
            "at": format_utc(self.at_ms),
            "known": self.known,
        }
