"""The worker's trace steps (see :mod:`dueflow.observability.tracing`): one ``execute`` span per
attempt and a ``dead_letter`` span when a job is parked.

Only called when the worker's :class:`~dueflow.observability.tracing.JobTracer` is enabled;
off, the hot path does no span work at all and the records keep the trace
headers they came with.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from dueflow.consumers.failures import Failure
from dueflow.observability.tracing import JobTracer, TraceStep


def start_attempt(
    tracer: JobTracer,
    *,
    headers: Any,
    attempt: int,
    job_id: str,
    queue: str,
    task: str,
) -> tuple[TraceStep, Any]:
    """The attempt's step and the OpenTelemetry context a handler's spans nest under."""
    step = tracer.span_for_attempt(headers, attempt=attempt, job_id=job_id, queue=queue, task=task)
    context = trace.set_span_in_context(step.span) if step.span is not None else None
    return step, context


def end_attempt(step: TraceStep, failure: Failure | None) -> None:
    if step.span is not None and failure is not None:
        step.span.set_status(Status(StatusCode.ERROR, failure.summary))
        step.set(error_type=failure.error_type, timed_out=failure.timed_out)
    step.end()
