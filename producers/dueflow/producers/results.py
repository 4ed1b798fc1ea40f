"""What the scheduling client returns: plain values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, TypeAlias

from dueflow.errors import DueflowError, InvalidInput
from dueflow.timeutil import format_utc, from_utc_ms, show_utc

# A value JSON holds: what ``Scheduler.result`` gives back of a handler's return value.
JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None


class Scheduled(NamedTuple):
    """A job that is in the timer topic.

    ``duplicate`` is True when the same job id with the same content had
    already been scheduled through this client: nothing new was written and
    the values are those of the first call. ``expires_ms``: the job's deadline
    (``expires`` / ``max_lateness``), if it has one.

    With ``unique_key=``: ``duplicate`` is True when the key was held by another
    job, whose id ``job_id`` then is (the other fields are the request's);
    ``pending_admission`` is True when the worker's verdict did not come within
    the wait (the request stands, and is decided when the worker gets to it).
    """

    job_id: str
    due_ms: int
    queue: str
    task: str
    idempotency_key: str
    content_hash: str
    partition: int
    duplicate: bool = False
    expires_ms: int | None = None
    pending_admission: bool = False

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
            "expires_ms": self.expires_ms,
            "pending_admission": self.pending_admission,
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
    """What ``cancel`` did for ``idempotency_key`` on ``queue``.

    ``cancelled``: a cancellation was written; workers skip every delivery of
    the key from then on (an attempt running now finishes; its retries do not
    run). ``found``: the job's outcomes were found (or this client scheduled
    it); False means the cancellation was written blind to the ``queue=``
    given. ``state``: the job's state before, as its outcomes told (``None``:
    not known); a job that had finished (``succeeded``, ``dead``, ...) is not
    cancelled. ``known``: this client scheduled the job itself.

    On a finalized queue the cancellation is a command (``command_id``) that
    the worker owning the job's partition applies; with ``wait=`` the call
    returns its ``verdict`` (``cancelled``, or ``refused`` with ``reason``,
    then ``cancelled`` is False); ``verdict`` None: not waited for, or none
    came in time (``reason`` says which).
    """

    job_id: str
    queue: str
    idempotency_key: str
    partition: int
    at_ms: int
    known: bool
    found: bool = True
    state: str | None = None
    cancelled: bool = True
    command_id: str | None = None
    verdict: str | None = None
    reason: str | None = None

    @property
    def message(self) -> str:
        """One line for humans: what happened and what it means."""
        where = f"queue {self.queue}, key {self.idempotency_key}"
        if not self.cancelled and self.verdict == "refused":
            return f"job {self.job_id} not cancelled: {self.reason} ({where})"
        if not self.cancelled:
            return f"job {self.job_id} not cancelled: it has {self.state} already ({where})"
        if self.command_id is not None and self.verdict is None:
            why = f" ({self.reason})" if self.reason else ""
            return (
                f"cancel of job {self.job_id} sent to its worker ({where}){why}: "
                "it applies it before the job's due time"
            )
        if not self.found:
            return (
                f"job {self.job_id} not found (no outcome of it): a cancellation was written "
                f"to {where} anyway; workers of that queue skip the key"
            )
        if self.state == "retrying":
            return f"cancelled job {self.job_id} ({where}): its retries will not run"
        return f"cancelled job {self.job_id} ({where}): it will not run"

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "idempotency_key": self.idempotency_key,
            "partition": self.partition,
            "at_ms": self.at_ms,
            "at": format_utc(self.at_ms),
            "known": self.known,
            "found": self.found,
            "state": self.state,
            "cancelled": self.cancelled,
            "command_id": self.command_id,
            "verdict": self.verdict,
            "reason": self.reason,
            "message": self.message,
        }


class Rescheduled(NamedTuple):
    """What ``reschedule`` did for ``job_id``.

    ``rescheduled``: a new timer due at ``due_ms`` and the reschedule record were
    written; the job runs then, and not at ``old_due_ms`` (see
    :mod:`dueflow.records.reschedule` for the rule and its races). Otherwise
    ``reason`` says why not (not found, started or finished, a cron occurrence,
    due then already, its timer has fired and a worker took it).

    On a finalized queue the move is a command (``command_id``) that the worker
    owning the job's partition applies; with ``wait=`` the call returns its
    ``verdict`` (``rescheduled``, or ``refused`` with ``reason``, then
    ``rescheduled`` is False).
    """

    job_id: str
    queue: str
    idempotency_key: str
    old_due_ms: int | None
    due_ms: int
    rescheduled: bool
    found: bool
    state: str | None
    reason: str | None = None
    partition: int = -1  # of the new timer (of the command, on a finalized queue)
    command_id: str | None = None
    verdict: str | None = None

    @property
    def due(self) -> datetime:
        """The new due time as a tz-aware UTC datetime."""
        return from_utc_ms(self.due_ms)

    @property
    def old_due(self) -> datetime | None:
        """The due time before, as a tz-aware UTC datetime (None: not known)."""
        return None if self.old_due_ms is None else from_utc_ms(self.old_due_ms)

    @property
    def message(self) -> str:
        """One line for humans."""
        if not self.rescheduled:
            return f"job {self.job_id} not rescheduled: {self.reason}"
        old = "?" if self.old_due_ms is None else show_utc(self.old_due_ms)
        return (
            f"rescheduled job {self.job_id} (queue {self.queue}): due {format_utc(self.due_ms)}, "
            f"not {old}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "idempotency_key": self.idempotency_key,
            "old_due_ms": self.old_due_ms,
            "old_due": None if self.old_due_ms is None else show_utc(self.old_due_ms),
            "due_ms": self.due_ms,
            "due": format_utc(self.due_ms),
            "rescheduled": self.rescheduled,
            "found": self.found,
            "state": self.state,
            "reason": self.reason,
            "partition": self.partition,
            "command_id": self.command_id,
            "verdict": self.verdict,
            "message": self.message,
        }


class Updated(NamedTuple):
    """What ``update`` did for ``job_id``: a command replacing its payload (and maybe
    its due time) that the worker owning the job's partition applies before the job
    runs. ``updated`` False: ``reason`` says why not (not found, started or finished,
    a cron occurrence, or the worker refused it: ``verdict`` ``refused``).
    ``verdict`` None: not waited for (``wait=``), or none came in time."""

    job_id: str
    queue: str
    idempotency_key: str
    updated: bool
    found: bool
    state: str | None
    due_ms: int | None = None  # the new due time, when one was given
    reason: str | None = None
    partition: int = -1
    command_id: str | None = None
    verdict: str | None = None

    @property
    def message(self) -> str:
        """One line for humans."""
        if not self.updated:
            return f"job {self.job_id} not updated: {self.reason}"
        due = "" if self.due_ms is None else f", due {format_utc(self.due_ms)}"
        if self.verdict is None:
            return f"update of job {self.job_id} (queue {self.queue}{due}) sent to its worker" + (
                f" ({self.reason})" if self.reason else ""
            )
        return f"updated job {self.job_id} (queue {self.queue}{due}): it runs with the new payload"

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "idempotency_key": self.idempotency_key,
            "updated": self.updated,
            "found": self.found,
            "state": self.state,
            "due_ms": self.due_ms,
            "due": None if self.due_ms is None else format_utc(self.due_ms),
            "reason": self.reason,
            "partition": self.partition,
            "command_id": self.command_id,
            "verdict": self.verdict,
            "message": self.message,
        }
