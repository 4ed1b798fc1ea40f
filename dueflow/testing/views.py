"""What a test asserts on: runs, pending jobs, a job's state (plain values)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from dueflow.apps.ops.dlq import DeadLetterEntry
from dueflow.consumers.failures import Failure
from dueflow.records.follow_up import FollowUp
from dueflow.timeutil import format_utc, from_utc_ms

Outcome = Literal["succeeded", "retrying", "dead", "duplicate", "cancelled"]


@dataclass(frozen=True, slots=True)
class JobRun:
    """What the worker decided for one delivery of a job: an attempt that ran
    (``ran``: succeeded, retrying or dead) or one that did not (duplicate,
    cancelled, or dead before running: unknown task, undecodable payload).

    Times are the fake clock's (UTC epoch ms); ``seconds`` is how long the
    handler ran in real time.
    """

    job_id: str
    task: str
    queue: str
    idempotency_key: str
    attempt: int
    max_attempts: int
    outcome: Outcome
    ran: bool
    due_ms: int | None  # the job's due time (a retry keeps the first one)
    not_before_ms: int  # this delivery's "not before": the due time, or the retry's
    at_ms: int  # when the worker took it (the attempt's start)
    finished_ms: int  # when its outcome was recorded
    seconds: float = 0.0
    payload: Any = None
    failure: Failure | None = None
    retry_at_ms: int | None = None  # outcome retrying: the next attempt's "not before"
    retry_tier: str | None = None  # the retry tier topic's label ("1s", "10s", ...)
    dead_reason: str | None = None  # outcome dead: exhausted, timeout, permanent_error, ...
    schedule_id: str | None = None
    source: tuple[str, int, int] = ("", 0, 0)  # (topic, partition, offset) read from
    # The jobs its handler scheduled with ctx.schedule, written with its success
    # (a failed attempt's were dropped: empty then).
    follow_ups: tuple[FollowUp, ...] = ()
    # outcome succeeded: what the handler returned, as JSON gives it back (None: it
    # returned None, or the value was not kept: result_error says why)
    result: Any = None
    result_error: str | None = None

    @property
    def started(self) -> datetime:
        return from_utc_ms(self.at_ms)

    @property
    def error_type(self) -> str | None:
        return None if self.failure is None else self.failure.error_type

    @property
    def error(self) -> str | None:
        """``<type>: <message>`` of the failure, if any."""
        return None if self.failure is None else self.failure.summary

    @property
    def timed_out(self) -> bool:
        return self.failure is not None and self.failure.timed_out

    def __repr__(self) -> str:
        extra = f", error={self.error!r}" if self.failure else ""
        return (
            f"JobRun({self.job_id!r}, task={self.task!r}, attempt={self.attempt}/"
            f"{self.max_attempts}, outcome={self.outcome!r}, at={format_utc(self.at_ms)}{extra})"
        )


Where = Literal["timer", "exec", "retry"]


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job that has not reached an outcome: waiting for its due time (``timer``),
    fired and not taken yet (``exec``), or waiting for a retry (``retry``).

    ``consumed`` is False when no worker of the pipeline reads its queue: it would
    wait there forever (on a cluster, until retention deletes it).
    """

    job_id: str
    task: str
    queue: str
    due_ms: int  # when it may start (a retry's "not before")
    where: Where
    attempt: int = 1
    topic: str = ""
    consumed: bool = True
    cron: bool = False
    schedule_id: str | None = None

    @property
    def due(self) -> datetime:
        return from_utc_ms(self.due_ms)

    def __repr__(self) -> str:
        flag = "" if self.consumed else ", NOT CONSUMED by any worker"
        return (
            f"PendingJob({self.job_id!r}, task={self.task!r}, queue={self.queue!r}, "
            f"{self.where} due {format_utc(self.due_ms)}, attempt {self.attempt}{flag})"
        )


@dataclass(frozen=True, slots=True)
class JobState:
    """Where job ``job_id`` is: its state, runs, what is pending, its dead letter.

    ``state``: ``scheduled`` (waiting for its due time or a worker), ``retrying``
    (an attempt failed, the next waits), ``succeeded``, ``dead``, ``cancelled``,
    or ``unknown``. ``view`` is what the status view (``dueflow job ID``) shows,
    folded from the job's outcome records.
    """

    job_id: str
    state: str
    runs: tuple[JobRun, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    dead_letter: DeadLetterEntry | None = None
    view: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def attempts(self) -> int:
        """Attempts that ran."""
        return sum(1 for r in self.runs if r.ran)

    @property
    def due_ms(self) -> int | None:
        """When it may start next (pending), else None."""
        return min((p.due_ms for p in self.pending), default=None)

    @property
    def result(self) -> Any:
        """What its handler returned when it succeeded (JSON's value; None: nothing)."""
        return None if self.view is None else self.view.get("result")

    @property
    def result_error(self) -> str | None:
        """Why the handler's return value was not kept (not JSON, over the cap)."""
        return None if self.view is None else self.view.get("result_error")

    @property
    def progress(self) -> float | None:
        """The newest progress fraction its handler reported (``ctx.progress``)."""
        return None if self.view is None else self.view.get("progress")

    @property
    def progress_detail(self) -> Any:
        """The newest progress detail its handler reported (``ctx.progress``)."""
        return None if self.view is None else self.view.get("progress_detail")
