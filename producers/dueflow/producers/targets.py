"""Which job a ``cancel`` or ``reschedule`` means: queue, key, state (pure).

A job id alone does not say where the job is: cancellations and reschedules
go to the idempotency topic of the job's queue, keyed by its idempotency
key. :func:`resolve_target` decides from what is known, in this order:

1. the job's outcomes (:class:`~dueflow.rules.job_status.JobStatus`, found by the
   client's lookup): the queue(s) it is known in, its key, due time and
   state. A ``queue=`` the job is not known in is refused (it would write
   where no worker of the job looks, and the job would still run); a job id
   known in more than one queue needs ``queue=`` to say which;
2. else what this client scheduled itself (its recent-jobs memory);
3. else the caller's ``queue=``: the job is not found, and the record is
   written blind (``found`` False); without ``queue=`` that is refused:
   there is no right queue to guess.

Errors are :class:`~dueflow.errors.InvalidInput` naming the field and how to
give it. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from dueflow.errors import InvalidInput
from dueflow.producers.results import Scheduled
from dueflow.rules.job_status import JobStatus


@dataclass(frozen=True, slots=True)
class Target:
    """The job a call means."""

    job_id: str
    queue: str
    idempotency_key: str
    found: bool  # its outcomes were found, or this client scheduled it
    state: str | None  # what its outcomes say (None: not known)
    due_ms: int | None
    task: str
    schedule_id: str | None
    content_hash: str | None
    known: bool  # this client scheduled it (recent-jobs memory)
    # the exec partition it is delivered on when known (a job admitted under a unique
    # key: its key's); None: its idempotency key's
    partition: int | None = None


def resolve_target(
    job_id: str,
    *,
    queue: str | None,
    idempotency_key: str | None,
    status: JobStatus | None,
    recent: Scheduled | None,
    queues: Collection[str],
    verb: str = "cancel",
) -> Target:
    """The job ``job_id`` means for ``verb`` (``cancel``, ``reschedule``); raises
    :class:`InvalidInput` when the queue or key is wrong or ambiguous."""
    if queue is not None and queue not in queues:
        raise InvalidInput("queue", queue, f"one of the configured queues {sorted(queues)}")
    if status is not None:
        return _known_target(job_id, queue, idempotency_key, status, recent, verb)
    if recent is not None:
        if queue is not None and queue != recent.queue:
            raise InvalidInput(
                "queue", queue, f"the queue job {job_id!r} was scheduled to ({recent.queue!r})"
            )
        return Target(
            job_id=job_id,
            queue=recent.queue,
            idempotency_key=idempotency_key or recent.idempotency_key,
            found=True,
            state=None,
            due_ms=recent.due_ms,
            task=recent.task,
            schedule_id=None,
            content_hash=recent.content_hash or None,
            known=True,
        )
    if queue is None:
        raise InvalidInput(
            "queue",
            None,
            f"the job's queue: job {job_id!r} is not known (no outcome of it was found and "
            f"this client did not schedule it), so its queue cannot be told; give {_FLAG} "
            f"to {verb} it there anyway",
        )
    return Target(
        job_id=job_id,
        queue=queue,
        idempotency_key=idempotency_key or job_id,
        found=False,
        state=None,
        due_ms=None,
        task="",
        schedule_id=None,
        content_hash=None,
        known=False,
    )


# How a caller names the queue (the SDK's keyword, the CLI's flag).
_FLAG = "queue= (--queue on the command line)"


def _known_target(
    job_id: str,
    queue: str | None,
    idempotency_key: str | None,
    status: JobStatus,
    recent: Scheduled | None,
    verb: str,
) -> Target:
    """The target of a job whose outcomes were found (``status``): the queue they
    name (``queue`` must be one of them), its key; :class:`InvalidInput` otherwise."""
    known_in = list(status.queues) or [status.queue]
    if queue is None:
        if len(known_in) > 1:
            raise InvalidInput(
                "queue",
                None,
                f"one of {known_in}: job id {job_id!r} is known in more than one queue; "
                f"give {_FLAG} to say which one to {verb}",
            )
        queue = known_in[0]
    elif queue not in known_in:
        raise InvalidInput(
            "queue",
            queue,
            f"the queue job {job_id!r} was scheduled to ({', '.join(map(repr, known_in))}): "
            f"a {verb} written to {queue!r} would not reach it",
        )
    single = len(known_in) == 1
    key = status.idempotency_key or job_id
    if idempotency_key is not None and idempotency_key != key and single:
        raise InvalidInput(
            "idempotency_key",
            idempotency_key,
            f"the key job {job_id!r} was scheduled with ({key!r}), or none",
        )
    return Target(
        job_id=job_id,
        queue=queue,
        idempotency_key=idempotency_key or key,
        found=True,
        # an id reused across queues: its outcomes mix, its state is not known
        state=status.state if single else None,
        due_ms=status.due_ms if single else None,
        task=status.task,
        schedule_id=status.schedule_id,
        content_hash=recent.content_hash if recent is not None else None,
        known=recent is not None,
        partition=status.exec_partition if single else None,
    )


def beyond_retention(due_ms: int, *, now_ms: int, retention_ms: int, margin_ms: int) -> bool:
    """True when a record written now about a job due at ``due_ms`` would be gone
    (the idempotency topic's and the workers' stores' retention) before the job
    is delivered: workers keep a cancellation or reschedule ``retention_ms``
    after it was written, and ``margin_ms`` covers a late delivery."""
    return due_ms > now_ms + retention_ms - margin_ms
