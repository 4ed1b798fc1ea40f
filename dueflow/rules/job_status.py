"""Where a job is, as its outcome records tell (pure).

Every state change of a job is an outcome record in ``<prefix>.outcomes``
keyed by job id: the client's ``scheduled`` (on by default) and
``rescheduled``/``cancelled``, the workers' ``retrying``, ``succeeded``,
``dead``, ``duplicate``, ... :func:`job_status` folds a job's records, in log
order, with the status view's own rule (:func:`dueflow.rules.job_state.apply_outcome`)
into a :class:`JobStatus`: what ``Scheduler.status``, ``dueflow job`` and the
lookups of ``cancel`` and ``reschedule`` see. Nothing here reads the clock or
Kafka: the records are an argument (the Kafka scan is
:mod:`dueflow.kafka.outcome_scan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dueflow.headers import CONTENT_HASH, header
from dueflow.rules.job_state import FINAL_STATES, JobView, apply_outcome
from dueflow.timeutil import format_utc, from_utc_ms

# View fields that JobStatus names itself (the others go to ``extra``).
_NAMED = frozenset(
    {
        "job_id",
        "state",
        "exec_partition",
        "queue",
        "queues",
        "task",
        "idempotency_key",
        "due_ms",
        "next_due_ms",
        "attempts",
        "updated_ms",
        "last_error",
        "schedule_id",
        "history",
        "duplicates",
        "partition",
        "content_hash",
        "result",
        "result_error",
        "progress",
        "progress_detail",
        "progress_ms",
        "progress_attempt",
        # to_json's own
        "pending",
        "due",
        "next_due",
        "last_outcome",
        "source",
        "complete",
    }
)

# Not started yet, as far as the outcomes tell: waiting for its due time (or
# fired and waiting for a worker; the emitter writes no outcome when it fires).
PENDING_STATES = frozenset({"scheduled", "rescheduled", "updated"})


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as its outcomes tell.

    ``state`` follows the status view's rules (a late ``scheduled`` never
    moves a job back, a ``duplicate`` is counted, not a state);
    ``last_outcome`` is the newest record's state, whatever it is.
    ``queues`` are every queue the job id has outcomes in: more than one
    when the id was reused across queues (then ``queue`` is the first).
    ``content_hash``: the job's, when its ``scheduled`` outcome carries it
    (the ``df-content-hash`` header; ``None`` otherwise). ``next_due_ms``: a
    ``retrying`` job's next attempt's due time (``due_ms`` stays the job's own);
    ``None`` in any other state, or when the worker that failed it did not say.

    ``source`` says who answered: ``status-view`` (its table of every job),
    ``kafka-scan`` (the client's bounded scan of the outcomes topic, when the
    view did not answer), ``client`` (what this client scheduled and nobody
    has folded yet), ``memory`` (the in-memory pipeline). ``complete`` is False
    when the answer may miss outcomes of the job: a scan that left older
    records of the partition unread, or the client's own memory.
    ``extra`` holds the view's other fields (``started_ms``, ``finished_ms``,
    ``duration_ms``, ``worker``, ``trace_id``, and the fields of newer outcome
    schemas, such as a result or progress).
    """

    job_id: str
    state: str
    queue: str
    task: str
    idempotency_key: str | None
    due_ms: int | None
    attempts: int
    last_outcome: str
    updated_ms: int
    last_error: Mapping[str, Any] | None
    schedule_id: str | None
    queues: tuple[str, ...]
    history: tuple[tuple[str, int, int], ...]
    duplicates: int = 0
    source: str = "kafka"
    content_hash: str | None = None
    complete: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)
    exec_partition: int | None = None  # where it is delivered, when an outcome said
    # The handler's return value (succeeded; JSON's value) or why it was not kept.
    result: Any = None
    result_error: str | None = None
    # The newest progress its handler reported (ctx.progress), with its attempt and time.
    progress: float | None = None
    progress_detail: Any = None
    progress_ms: int | None = None
    progress_attempt: int | None = None
    started_ms: int | None = None
    # retrying: when its next attempt is due (unknown from a worker of the release before)
    next_due_ms: int | None = None

    @property
    def running(self) -> bool:
        """An attempt runs (a worker said so: it runs long or reports progress)."""
        return self.state == "started"

    @property
    def pending(self) -> bool:
        """Not started yet: waiting for its due time (or fired, waiting for a worker)."""
        return self.state in PENDING_STATES

    @property
    def finished(self) -> bool:
        """Succeeded, dead, cancelled, expired or skipped: it will not run again by itself."""
        return self.state in FINAL_STATES

    @property
    def due(self) -> datetime | None:
        """The due time as a tz-aware UTC datetime."""
        return None if self.due_ms is None else from_utc_ms(self.due_ms)

    @property
    def next_due(self) -> datetime | None:
        """A retrying job's next attempt's due time (``next_due_ms``), tz-aware UTC."""
        return None if self.next_due_ms is None else from_utc_ms(self.next_due_ms)

    @classmethod
    def from_view(
        cls,
        view: Mapping[str, Any],
        *,
        queues: Iterable[str] = (),
        source: str = "kafka",
        content_hash: str | None = None,
        complete: bool = True,
    ) -> JobStatus:
        """From the status view's record of a job (``GET /jobs/{id}``, a scan's fold)."""
        history = tuple(
            (str(h[0]), int(h[1]), int(h[2])) for h in view.get("history") or () if len(h) >= 3
        )
        known = tuple(
            dict.fromkeys([str(view["queue"]), *map(str, view.get("queues") or ()), *queues])
        )
        return cls(
            job_id=str(view["job_id"]),
            state=str(view.get("state") or "unknown"),
            queue=str(view["queue"]),
            task=str(view.get("task") or ""),
            idempotency_key=view.get("idempotency_key"),
            due_ms=None if view.get("due_ms") is None else int(view["due_ms"]),
            attempts=int(view.get("attempts") or 0),
            last_outcome=history[-1][0] if history else str(view.get("state") or "unknown"),
            updated_ms=int(view.get("updated_ms") or 0),
            last_error=view.get("last_error"),
            schedule_id=view.get("schedule_id"),
            queues=known,
            history=history,
            duplicates=int(view.get("duplicates") or 0),
            source=source,
            content_hash=content_hash if content_hash is not None else view.get("content_hash"),
            complete=complete,
            exec_partition=None
            if view.get("exec_partition") is None
            else int(view["exec_partition"]),
            extra={k: v for k, v in view.items() if k not in _NAMED},
            result=view.get("result"),
            result_error=view.get("result_error"),
            progress=view.get("progress"),
            progress_detail=view.get("progress_detail"),
            progress_ms=view.get("progress_ms"),
            progress_attempt=view.get("progress_attempt"),
            started_ms=view.get("started_ms"),
            next_due_ms=None if view.get("next_due_ms") is None else int(view["next_due_ms"]),
        )

    def to_json(self) -> dict[str, Any]:
        """The status as one JSON document: the view's other fields (``extra``) beside
        the named ones."""
        return {
            **self.extra,
            "job_id": self.job_id,
            "state": self.state,
            "pending": self.pending,
            "queue": self.queue,
            "queues": list(self.queues),
            "task": self.task,
            "idempotency_key": self.idempotency_key,
            "due_ms": self.due_ms,
            "due": None if self.due_ms is None else format_utc(self.due_ms),
            "attempts": self.attempts,
            "last_outcome": self.last_outcome,
            "updated_ms": self.updated_ms,
            "last_error": None if self.last_error is None else dict(self.last_error),
            "schedule_id": self.schedule_id,
            "duplicates": self.duplicates,
            "history": [list(h) for h in self.history],
            "source": self.source,
            "content_hash": self.content_hash,
            "complete": self.complete,
            "exec_partition": self.exec_partition,
            "result": self.result,
            "result_error": self.result_error,
            "progress": self.progress,
            "progress_detail": self.progress_detail,
            "progress_ms": self.progress_ms,
            "progress_attempt": self.progress_attempt,
            "started_ms": self.started_ms,
            "next_due_ms": self.next_due_ms,
            "next_due": None if self.next_due_ms is None else format_utc(self.next_due_ms),
        }


def job_status(
    job_id: str,
    outcomes: Iterable[tuple[int, Mapping[str, Any]]],
    *,
    source: str = "kafka",
    content_hash: str | None = None,
) -> JobStatus | None:
    """Fold ``(partition, outcome record)`` pairs of ``job_id`` (others are ignored),
    in log order; None when there is none. ``content_hash``: from the job's
    ``scheduled`` outcome's header (:func:`scheduled_content_hash`)."""
    view: JobView | None = None
    queues: list[str] = []
    for partition, outcome in outcomes:
        if outcome.get("job_id") != job_id:
            continue
        view = apply_outcome(view, outcome, partition=partition)
        queue = str(outcome.get("queue"))
        if queue not in queues:
            queues.append(queue)
    if view is None:
        return None
    return JobStatus.from_view(view, queues=queues, source=source, content_hash=content_hash)


def scheduled_content_hash(
    outcome: Mapping[str, Any], headers: Sequence[tuple[str, bytes | None]] | None
) -> str | None:
    """The ``df-content-hash`` of a ``scheduled`` outcome (``None``: another state, no
    header, or one that is no hash: 32 hex digits)."""
    if outcome.get("state") != "scheduled":
        return None
    raw = header(headers, CONTENT_HASH)
    if raw is None or len(raw) != 32:
        return None
    text = raw.decode("ascii", "replace")
    return text if all(c in "0123456789abcdef" for c in text) else None
