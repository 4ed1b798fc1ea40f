"""Where a job is, as its outcome records tell (pure).

Every state change of a job is an outcome record in ``<prefix>.outcomes``
keyed by job id: the client's ``scheduled`` (on by default) and
``rescheduled``/``cancelled``, the workers' ``retrying``, ``succeeded``,
``dead``, ``duplicate``, ... :func:`job_status` folds a job's records, in log
order, with the status view's own rule (:func:`dueflow.rules.job_state.apply_outcome`)
into a :class:`JobStatus`: what ``Scheduler.status``, ``dueflow job`` and the
lookups of ``cancel`` and ``reschedule`` see. Nothing here reads the clock or
Kafka: the records are an argument (the Kafka scan is
:mod:`dueflow.streams.status.outcome_scan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dueflow.rules.job_state import FINAL_STATES, JobView, apply_outcome
from dueflow.timeutil import format_utc, from_utc_ms

# Not started yet, as far as the outcomes tell: waiting for its due time (or
# fired and waiting for a worker; the emitter writes no outcome when it fires).
PENDING_STATES = frozenset({"scheduled", "rescheduled"})


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as its outcomes tell.

    ``state`` follows the status view's rules (a late ``scheduled`` never
    moves a job back, a ``duplicate`` is counted, not a state);
    ``last_outcome`` is the newest record's state, whatever it is.
    ``queues`` are every queue the job id has outcomes in: more than one
    when the id was reused across queues (then ``queue`` is the first).
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

    @classmethod
    def from_view(
        cls,
        view: Mapping[str, Any],
        *,
        queues: Iterable[str] = (),
        source: str = "kafka",
    ) -> JobStatus:
        """From the status view's record of a job (``GET /jobs/{id}``, a scan's fold)."""
        history = tuple(
            (str(h[0]), int(h[1]), int(h[2])) for h in view.get("history") or () if len(h) >= 3
        )
        known = tuple(dict.fromkeys([str(view["queue"]), *queues]))
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
        )

    def to_json(self) -> dict[str, Any]:
        return {
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
        }


def job_status(
    job_id: str,
    outcomes: Iterable[tuple[int, Mapping[str, Any]]],
    *,
    source: str = "kafka",
) -> JobStatus | None:
    """Fold ``(partition, outcome record)`` pairs of ``job_id`` (others are ignored),
    in log order; None when there is none."""
    view: JobView | None = None
    queues: list[str] = []
    for partition, outcome in outcomes:
        if outcome.get("job_id") != job_id:
            continue
        view = apply_outcome(view, outcome, partition=partition)
        queue = str(outcome.get("queue"))
        if queue not in queues:
            queues.append(queue)
    return None if view is None else JobStatus.from_view(view, queues=queues, source=source)
