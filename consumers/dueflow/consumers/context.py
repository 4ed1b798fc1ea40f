"""What a handler knows about the job it runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple, Unpack

import orjson

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.follow_ups import Attempt, FollowUpPlanner, fixed_planner
from dueflow.errors import DueflowError, InvalidInput
from dueflow.group_model import GroupResults
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.job_options import JOB_KEYWORDS, JobOptions, check_keywords
from dueflow.records.job_request import content_hash, encode_payload
from dueflow.records.job_result import Progress, check_progress, decode_result, to_json
from dueflow.records.worker_codec import (
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_QUEUE,
    F_TASK,
    F_TRACE,
    JobFields,
    decode_job_fields,
)

if TYPE_CHECKING:
    from dueflow.records.follow_up import FollowUp, PlannedFollowUp

_LOGGER = "dueflow.task"


class ProgressReport(NamedTuple):
    """One ``ctx.progress`` call as a test sees it (``ctx.progress_reports``)."""

    fraction: float | None
    detail: Any


class TaskContext:
    """The job a handler runs, its attempt and a logger that names the job.

    Use ``idempotency_key`` for the handler's own external side effects (a
    payment provider's idempotency header, a unique database key): the key
    is stable across retries and redeliveries, so an effect the handler
    already made is recognised when the job runs again.

    :meth:`schedule` schedules follow-up jobs in the same Kafka transaction as
    this attempt's success; :meth:`progress` reports how far the attempt is;
    the handler's return value is the job's result (JSON), and a follow-up
    scheduled with ``pass_result=True`` reads it as :attr:`parent_result`.
    """

    __slots__ = (
        "_fields",
        "_job",
        "_logger",
        "_owner",
        "attempt",
        "headers",
        "max_attempts",
        "otel_context",
        "source",
    )

    def __init__(
        self,
        fields: JobFields,
        attempt: int,
        max_attempts: int,
        headers: Mapping[str, bytes],
        source: tuple[str, int, int],
        otel_context: Any = None,
        owner: Any = None,
    ) -> None:
        # ``fields``: the Job's fields in dataclass order (see schemas.fast);
        # the Job object itself is built only if the handler asks for it.
        # ``owner``: the attempt (a worker's Delivery, or a follow_ups.Attempt),
        # whose ``planner`` checks and keeps its follow-ups (None, or no planner:
        # this context cannot schedule them).
        self._fields = fields
        self._owner = owner
        self._job: Job | None = None
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.headers = headers
        #: (topic, partition, offset) of the record this attempt was read from
        self.source = source
        #: the OpenTelemetry context of this run's span (``None`` when tracing is off)
        self.otel_context = otel_context
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None

    @classmethod
    def for_test(
        cls,
        task: str = "test-task",
        payload: Any = None,
        *,
        attempt: int = 1,
        max_attempts: int = 4,
        job_id: str = "test-job",
        queue: str = "default",
        idempotency_key: str | None = None,
        due_ms: int = 0,
        schedule_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        traceparent: str | None = None,
        now_ms: int | None = None,
        queues: Iterable[str] = (),
        settings: Settings | None = None,
        parent_result: Any = None,
    ) -> TaskContext:
        """A context for calling a handler directly in a unit test::

            ctx = TaskContext.for_test("send-invoice", {"id": 7}, attempt=2, max_attempts=3)
            send_invoice({"id": 7}, ctx)
            assert [f.task for f in ctx.follow_ups] == ["email-receipt"]

        The job is built the way a worker sees it: ``payload`` is encoded as the
        scheduling client would (JSON, or bytes as they are; a value JSON cannot
        hold raises :class:`~dueflow.errors.InvalidInput`), the record goes
        through the Avro encoding and back. ``source`` names no real record
        (``("test", 0, 0)``). :meth:`schedule` checks follow-ups against
        ``settings`` (default: the queues ``default``, ``queue`` and ``queues``)
        with a clock that reads ``now_ms`` (default ``due_ms``), and keeps them
        in :attr:`follow_ups`. :meth:`progress` keeps every report in
        :attr:`progress_reports`. ``parent_result``: what :attr:`parent_result`
        gives (as a job scheduled with ``pass_result=True`` receives it). For
        whole jobs (retries, timeouts, the DLQ, chains) use
        :class:`dueflow.testing.InMemoryPipeline`.
        """
        for name, value in (("attempt", attempt), ("max_attempts", max_attempts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(name, value, "an integer >= 1")
        if attempt > max_attempts:
            raise InvalidInput("attempt", attempt, f"at most max_attempts ({max_attempts})")
        body, content_type = encode_payload(payload)
        job = Job(
            job_id=job_id,
            queue=queue,
            task=task,
            payload=body,
            content_type=content_type,
            due_ms=due_ms,
            idempotency_key=job_id if idempotency_key is None else idempotency_key,
            created_ms=due_ms,
            max_attempts=max_attempts,
            trace={} if traceparent is None else {hdr.TRACEPARENT: traceparent},
            schedule_id=schedule_id,
            content_hash=content_hash(task, body, content_type),
            labels=dict(labels or {}),
        )
        fields = decode_job_fields(codec.encode("job", job.to_record()))
        headers = {hdr.ATTEMPT: str(attempt).encode()}
        if parent_result is not None:
            passed = to_json(parent_result)
            if passed.json is None:
                raise InvalidInput("parent_result", parent_result, f"a JSON value ({passed.error})")
            headers[hdr.PARENT_RESULT] = passed.json
        if settings is None:
            known = dict.fromkeys(["default", queue, *queues])
            settings = Settings(queues=tuple(QueueSpec(q) for q in known)).validate()
        planner = fixed_planner(settings, now_ms=due_ms if now_ms is None else now_ms)
        owner = Attempt(planner, reports=[])
        return cls(fields, attempt, max_attempts, headers, ("test", 0, 0), None, owner)

    @property
    def job(self) -> Job:
        """The whole job record."""
        if self._job is None:
            self._job = Job(*self._fields)
        return self._job

    @property
    def job_id(self) -> str:
        return str(self._fields[F_JOB_ID])

    @property
    def idempotency_key(self) -> str:
        return str(self._fields[F_KEY])

    @property
    def task(self) -> str:
        return str(self._fields[F_TASK])

    @property
    def queue(self) -> str:
        return str(self._fields[F_QUEUE])

    @property
    def due_ms(self) -> int:
        """When the job was due (UTC epoch ms); a retry keeps the job's first due time."""
        return int(self._fields[F_DUE_MS])

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` the job carries (``None`` when it has none)."""
        raw = self.headers.get(hdr.TRACEPARENT)
        if raw is not None:
            return raw.decode("ascii", "replace")
        trace: Mapping[str, str] = self._fields[F_TRACE]
        return trace.get(hdr.TRACEPARENT)

    @property
    def trace_id(self) -> str | None:
        tp = self.traceparent
        parts = tp.split("-") if tp else []
        return parts[1] if len(parts) >= 4 else None

    @property
    def group(self) -> GroupResults | None:
        """On a group's callback: the group and how each member ended (``None`` on
        any other job). See ``Scheduler.group``."""
        raw = self.headers.get(hdr.GROUP_RESULTS)
        return None if raw is None else GroupResults.from_json(raw)

    @property
    def parent_job_id(self) -> str | None:
        """The job id of the job whose handler scheduled this one (``ctx.schedule``)."""
        raw = self.headers.get(hdr.PARENT)
        return None if raw is None else raw.decode("utf-8", "replace")

    @property
    def parent_result(self) -> Any:
        """The result of the job whose handler scheduled this one with
        ``ctx.schedule(..., pass_result=True)`` (its return value, as JSON gives it
        back); None when it returned None, when its result was not kept
        (:attr:`parent_result_error` says why) or when it passed none."""
        raw = self.headers.get(hdr.PARENT_RESULT)
        return None if raw is None else orjson.loads(raw)

    @property
    def parent_result_error(self) -> str | None:
        """Why the parent's result was not passed (not JSON, too large), if so."""
        raw = self.headers.get(hdr.PARENT_RESULT_ERROR)
        return None if raw is None else raw.decode("utf-8", "replace")

    # ------------------------------------------------------------ progress

    def progress(self, fraction: float | None = None, detail: Any = None) -> None:
        """Report how far this attempt is: ``fraction`` from 0 to 1 and/or ``detail``, a
        small JSON value (at most 1 KiB as JSON); :class:`~dueflow.errors.InvalidInput`
        otherwise. Call it as often as you like, from any thread of the handler: it
        does no I/O, the worker keeps the newest value and writes it (a ``started``
        outcome) at most once a second per attempt (``worker.progress_interval_ms``)
        and ``worker.progress_max_per_s`` per process. ``Scheduler.status``,
        ``dueflow job`` and the status page show it; a value not written when the
        attempt ends goes with its final outcome.
        """
        self.report_progress(check_progress(fraction, detail))

    def report_progress(self, value: Progress) -> None:
        """A checked progress value of this attempt (a child process's, relayed)."""
        owner = self._owner
        if owner is not None:
            owner.progressed(value)

    def relay_progress(self, sink: Callable[[Progress], None]) -> None:
        """Send this context's progress values to ``sink`` (a child process's pipe)."""
        owner = self._owner
        if owner is not None:
            owner.sink = sink

    @property
    def progress_reports(self) -> tuple[ProgressReport, ...]:
        """What :meth:`progress` reported so far, in call order, on a context made for a
        test (``TaskContext.for_test``, ``dueflow.testing.make_context``); empty on a
        worker's (it keeps only the newest value)."""
        reports = getattr(self._owner, "reports", None)
        if not reports:
            return ()
        return tuple(ProgressReport(v.fraction, decode_result(v.detail)) for v in reports)

    # ------------------------------------------------------------ follow-ups

    def schedule(
        self,
        task: str,
        payload: Any = None,
        *,
        pass_result: bool = False,
        **options: Unpack[JobOptions],
    ) -> FollowUp:
        """Schedule a follow-up job, written only if this attempt succeeds.

        The keywords are those of :meth:`dueflow.Scheduler.schedule` but a deadline
        and a unique key (:class:`~dueflow.records.job_options.JobOptions`; another
        one raises :class:`~dueflow.records.job_options.UnknownKeyword` naming it),
        checked the same way, at once (:class:`~dueflow.errors.InvalidInput` for
        bad input, nothing kept). ``queue`` defaults to the queue the task is
        declared in by this worker's app, else ``default``. The job's timer is
        written in the same Kafka transaction as this attempt's success (its
        idempotency record, outcome and offset): if the attempt fails, is
        retried or dead-lettered, or the worker dies before the commit, the
        follow-up does not exist, and the attempt that runs again schedules it
        again. Its job id and key default to ``<this job's key>/<n>`` for the
        n-th call (0-based): deterministic, so a job that runs twice schedules
        the same follow-up. Call it from sync and async handlers alike (it does
        no I/O), before the handler returns. ``pass_result=True``: the follow-up
        receives this job's result (what the handler returns) as
        ``ctx.parent_result``; its record must leave room for it (the task's
        ``result_max_bytes``).
        """
        planner = self._planner
        if planner is None:
            raise DueflowError(
                "this context cannot schedule follow-ups (only a running handler's can)"
            )
        if not isinstance(pass_result, bool):
            raise InvalidInput("pass_result", pass_result, "True or False")
        check_keywords("ctx.schedule", options, JOB_KEYWORDS)
        fields: dict[str, Any] = {k: v for k, v in options.items() if k != "queue"}
        queue = options.get("queue")
        return planner.schedule(
            self, self._owner, task, payload, queue, fields, pass_result=pass_result
        )

    @property
    def _planner(self) -> FollowUpPlanner | None:
        owner = self._owner
        planner: FollowUpPlanner | None = None if owner is None else owner.planner
        return planner

    @property
    def follow_ups(self) -> tuple[FollowUp, ...]:
        """The follow-ups this attempt scheduled so far, in call order."""
        planner = self._planner
        return () if planner is None else planner.pending(self._owner)

    def end_attempt(self) -> list[PlannedFollowUp]:
        """The attempt ended (in a child process): seal its follow-ups, return them."""
        planner = self._planner
        return [] if planner is None else planner.end(self._owner)

    def adopt_follow_ups(self, planned: list[PlannedFollowUp]) -> None:
        """Follow-ups a child process scheduled for this attempt (isolation="process")."""
        planner = self._planner
        if planned and planner is not None:
            planner.adopt(self._owner, planned)

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry job_id, queue, task, attempt and trace_id."""
        if self._logger is None:
            self._logger = _JobLogger(
                logging.getLogger(_LOGGER),
                {
                    "job_id": self.job_id,
                    "queue": self.queue,
                    "task": self.task,
                    "attempt": self.attempt,
                    "trace_id": self.trace_id,
                },
            )
        return self._logger

    def __reduce__(self) -> tuple[Any, ...]:
        # For process isolation: the child gets the job and the follow-up rules,
        # not the logger, the span or the attempt's buffer (it keeps one of its own).
        return (
            _rebuild,
            (
                self._fields,
                self.attempt,
                self.max_attempts,
                dict(self.headers),
                self.source,
                self._planner,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"TaskContext(job_id={self.job_id!r}, task={self.task!r}, "
            f"attempt={self.attempt}/{self.max_attempts})"
        )


def _rebuild(
    fields: JobFields,
    attempt: int,
    max_attempts: int,
    headers: dict[str, bytes],
    source: tuple[str, int, int],
    planner: FollowUpPlanner | None = None,
) -> TaskContext:
    return TaskContext(
        fields,
        attempt=attempt,
        max_attempts=max_attempts,
        headers=headers,
        source=source,
        owner=Attempt(planner),
    )


class _JobLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the job's fields to every record, keeping the call's own ``extra``."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs
