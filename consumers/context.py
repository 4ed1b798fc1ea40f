"""What a handler knows about the job it runs."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.model import Job
from dueflow.schemas.fast import (
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_QUEUE,
    F_TASK,
    F_TRACE,
    JobFields,
)

_LOGGER = "dueflow.task"


class TaskContext:
    """The job a handler runs, its attempt and a logger that names the job.

    Use ``idempotency_key`` for the handler's own external side effects (a
    payment provider's idempotency header, a unique database key): the key
    is stable across retries and redeliveries, so an effect the handler
    already made is recognised when the job runs again.
    """

    __slots__ = (
        "_fields",
        "_job",
        "_logger",
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
    ) -> None:
        # ``fields``: the Job's fields in dataclass order (see schemas.fast);
        # the Job object itself is built only if the handler asks for it.
        self._fields = fields
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
    ) -> TaskContext:
        """A context for calling a handler directly in a unit test::

            ctx = TaskContext.for_test("send-invoice", {"id": 7}, attempt=2, max_attempts=3)
            send_invoice({"id": 7}, ctx)

        The job is built the way a worker sees it: ``payload`` is encoded as the
        scheduling client would (JSON, or bytes as they are; a value JSON cannot
        hold raises :class:`~dueflow.errors.InvalidInput`), the record goes
        through the Avro encoding and back. ``source`` names no real record
        (``("test", 0, 0)``). For whole jobs (retries, timeouts, the DLQ) use
        :class:`dueflow.testing.InMemoryPipeline`.
        """
        from dueflow.job_request import content_hash, encode_payload
        from dueflow.schemas import codec
        from dueflow.schemas.fast import decode_job_fields

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
        return cls(fields, attempt, max_attempts, headers, ("test", 0, 0))

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
        # For process isolation: the child gets the job, not the logger or span.
        return (
            _rebuild,
            (self._fields, self.attempt, self.max_attempts, dict(self.headers), self.source),
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
) -> TaskContext:
    return TaskContext(
        fields, attempt=attempt, max_attempts=max_attempts, headers=headers, source=source
    )


class _JobLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the job's fields to every record, keeping the call's own ``extra``."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs
