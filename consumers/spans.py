"""One OpenTelemetry span per attempt, child of the trace the job carries.

Only used when tracing is on (:func:`dueflow.tracing.enabled`); the hot
path does no span work otherwise.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from dueflow import tracing
from dueflow.consumers.failures import Failure


def start_span(
    *, task: str, job_id: str, attempt: int, topic: str, headers: Any
) -> tuple[Any, Any]:
    """A started span for one attempt and the context to hand to the handler."""
    span = tracing.tracer().start_span(
        f"run {task}",
        context=tracing.extract(headers),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "dueflow.job_id": job_id,
            "dueflow.task": task,
            "dueflow.attempt": attempt,
            "messaging.destination.name": topic,
        },
    )
    return span, trace.set_span_in_context(span)


def end_span(span: Any, failure: Failure | None) -> None:
    if failure is not None:
        span.set_status(Status(StatusCode.ERROR, failure.summary))
        span.set_attribute("dueflow.error_type", failure.error_type)
    span.end()


def span_headers(span: Any) -> list[tuple[str, bytes]]:
    """``traceparent`` of ``span``: a retry then runs as its child, in the same trace."""
    return tracing.inject_headers(trace.set_span_in_context(span))
