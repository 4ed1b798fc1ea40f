"""OpenTelemetry through Kafka headers: one trace per job.

W3C trace context (``traceparent``/``tracestate``) travels in record headers
from ``schedule()`` through the emitter, the worker, each retry and the DLQ,
so one job is one trace::

    schedule                      (child of the caller's span, if any)
     └─ fire                      (emitter; parent from the timer record)
         ├─ execute attempt=1     (worker; parent from the exec record)
         ├─ execute attempt=2     link -> attempt 1
         └─ dead-letter           link -> attempt 2

Attempts and the dead-letter step are siblings under ``fire`` (the job's
*anchor*); the step that caused them is a *link*, carried in the
``df-trace-link`` header. A span current in the calling process (a batch,
a redrive command) that is not the job's parent is linked too.

Components get a :class:`JobTracer` through their constructor (built by
:meth:`JobTracer.from_env` at process start) and call ``span_for_*``; each
returns a :class:`TraceStep`, used as a context manager (or ended with
:meth:`TraceStep.end`), whose ``headers`` are set on the records the step
writes with ``dueflow.headers.replace(record_headers, step.headers)``.

Tracing is off unless ``OTEL_TRACES_EXPORTER`` names an exporter. Off, every
``span_for_*`` returns one shared inert step with no headers: no span, no
context object, no allocation, and the incoming trace headers travel on
unchanged (so a traced producer's context still reaches a traced worker
through an untraced emitter).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import get_global_textmap
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dueflow import headers as hdr
from dueflow.errors import ConfigError

TRACER_NAME = "dueflow"
TRACE_HEADERS = (hdr.TRACEPARENT, hdr.TRACESTATE, hdr.TRACE_LINK)

# Span names of a job's steps.
SCHEDULE = "dueflow.schedule"
FIRE = "dueflow.fire"
EXECUTE = "dueflow.execute"
DEAD_LETTER = "dueflow.dead_letter"

HeaderInput = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | str] | None
StepHeaders = tuple[tuple[str, bytes | None], ...]

_W3C = TraceContextTextMapPropagator()
log = logging.getLogger("dueflow.observability.tracing")


# --------------------------------------------------------------------------- headers


def _header(headers: HeaderInput, name: str) -> str | None:
    if not headers:
        return None
    raw = headers.get(name) if isinstance(headers, Mapping) else hdr.header(headers, name)
    if raw is None:
        return None
    return raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw


def carrier_from_headers(headers: HeaderInput) -> dict[str, str]:
    """``traceparent``/``tracestate`` of record headers as a text-map carrier."""
    out: dict[str, str] = {}
    for key in (hdr.TRACEPARENT, hdr.TRACESTATE):
        value = _header(headers, key)
        if value is not None:
            out[key] = value
    return out


def extract(headers: HeaderInput) -> otel_context.Context:
    """The trace context found in record headers (or a carrier mapping)."""
    return _W3C.extract(carrier_from_headers(headers))


def inject_headers(ctx: otel_context.Context | None = None) -> list[tuple[str, bytes]]:
    """Headers carrying the current (or given) trace context (global propagator)."""
    carrier: dict[str, str] = {}
    get_global_textmap().inject(carrier, context=ctx)
    return [(k, v.encode()) for k, v in carrier.items()]


def span_headers(ctx: otel_context.Context) -> list[tuple[str, bytes]]:
    """``traceparent`` (and ``tracestate``) naming the current span of ``ctx`` (W3C,
    whatever the global propagator): a record with them starts a child of that
    span. Empty when ``ctx`` holds no valid span."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return [(k, carrier[k].encode()) for k in (hdr.TRACEPARENT, hdr.TRACESTATE) if k in carrier]


def trace_id_of(headers: HeaderInput) -> str | None:
    """The 32-hex trace id in a ``traceparent`` header, without OpenTelemetry.

    Works whether tracing is on or off in this process: use it for log lines.
    """
    raw = _header(headers, hdr.TRACEPARENT)
    if raw is None:
        return None
    parts = raw.split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else None


def _span_context_of(traceparent: str | None) -> trace.SpanContext | None:
    if traceparent is None:
        return None
    ctx = trace.get_current_span(_W3C.extract({hdr.TRACEPARENT: traceparent})).get_span_context()
    return ctx if ctx.is_valid else None


def _context_headers(span: Span) -> tuple[tuple[str, bytes | None], ...]:
    """``traceparent`` (and ``tracestate``, or its removal) naming ``span``."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    state = carrier.get(hdr.TRACESTATE)
    return (
        (hdr.TRACEPARENT, carrier[hdr.TRACEPARENT].encode()),
        (hdr.TRACESTATE, state.encode() if state else None),
    )


# --------------------------------------------------------------------------- steps


class TraceStep:
    """One traced step of a job: a span (or nothing, when tracing is off).

    ``headers`` are the trace headers to set on the records this step writes
    (``None`` values remove a header); empty when tracing is off.
    """

    __slots__ = ("_token", "headers", "span")

    def __init__(self, span: Span | None = None, headers: StepHeaders = ()) -> None:
        self.span = span
        self.headers = headers
        self._token: object | None = None

    @property
    def trace_id(self) -> str | None:
        """32-hex trace id of the span (``None`` when off: use :func:`trace_id_of`)."""
        if self.span is None:
            return None
        return format(self.span.get_span_context().trace_id, "032x")

    def set(self, **attributes: str | int | float | bool) -> None:
        """Add attributes to the span (``dueflow.`` is prefixed to each name)."""
        if self.span is not None:
            self.span.set_attributes({f"dueflow.{k}": v for k, v in attributes.items()})

    def fail(self, exc: BaseException, *, description: str | None = None) -> None:
        """Mark the step failed with ``exc`` (an attempt that raised, a timeout)."""
        if self.span is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, description or type(exc).__name__))

    def end(self) -> None:
        """End the span (when not used as a context manager)."""
        if self.span is not None:
            self.span.end()

    def __enter__(self) -> TraceStep:
        if self.span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.span is None:
            return
        if exc is not None:
            self.fail(exc)
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        self.span.end()


_OFF = TraceStep()


class JobTracer:
    """Starts the spans of a job's steps; inert (and free) without a provider."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        service_name: str,
        install_global: bool = True,
    ) -> JobTracer:
        """The tracer the ``OTEL_*`` variables in ``env`` ask for (off by default).

        With ``install_global`` the provider also becomes OpenTelemetry's global
        one, so spans that task handlers start nest under their attempt.
        """
        provider = provider_from_env(env, service_name=service_name)
        if provider is not None and install_global and not enabled():
            trace.set_tracer_provider(provider)
        return cls(provider)

    def close(self) -> None:
        """Flush and stop the exporters."""
        if isinstance(self.provider, TracerProvider):
            self.provider.shutdown()

    # ----------------------------------------------------------------- steps
    def span_for_schedule(
        self, *, job_id: str, queue: str, task: str, due_ms: int | None = None
    ) -> TraceStep:
        """The ``schedule`` span: child of the caller's current span, if any.

        ``step.headers`` carry its context onto the timer record.
        """
        if self._tracer is None:
            return _OFF
        span = self._tracer.start_span(
            SCHEDULE,
            kind=SpanKind.PRODUCER,
            attributes=_attributes(job_id=job_id, queue=queue, task=task, due_ms=due_ms),
        )
        return TraceStep(span, (*_context_headers(span), (hdr.TRACE_LINK, None)))

    def span_for_fire(
        self,
        headers: HeaderInput,
        *,
        job_id: str | None = None,
        queue: str | None = None,
        lateness_ms: int | None = None,
    ) -> TraceStep:
        """The ``fire`` span: child of the schedule context in the timer headers.

        ``step.headers`` make it the job's anchor on the exec record.
        """
        if self._tracer is None:
            return _OFF
        span = self._start(
            FIRE,
            headers,
            SpanKind.CONSUMER,
            _attributes(job_id=job_id, queue=queue, lateness_ms=lateness_ms),
            follow_link=False,
        )
        return TraceStep(span, (*_context_headers(span), (hdr.TRACE_LINK, None)))

    def span_for_attempt(
        self,
        headers: HeaderInput,
        *,
        attempt: int,
        job_id: str | None = None,
        queue: str | None = None,
        task: str | None = None,
    ) -> TraceStep:
        """An ``execute`` span for one attempt: child of the anchor in the record
        headers, linked to the previous attempt (``df-trace-link``).

        ``step.headers`` go on the retry or DLQ record this attempt writes.
        """
        if self._tracer is None:
            return _OFF
        return self._sibling(
            EXECUTE,
            headers,
            SpanKind.CONSUMER,
            _attributes(job_id=job_id, queue=queue, task=task, attempt=attempt),
        )

    def span_for_dead_letter(
        self,
        headers: HeaderInput,
        *,
        reason: str,
        job_id: str | None = None,
        queue: str | None = None,
        attempts: int | None = None,
    ) -> TraceStep:
        """The ``dead-letter`` span: child of the anchor, linked to the last attempt.

        ``step.headers`` go on the DLQ record (a redriven attempt links to it).
        """
        if self._tracer is None:
            return _OFF
        return self._sibling(
            DEAD_LETTER,
            headers,
            SpanKind.PRODUCER,
            _attributes(job_id=job_id, queue=queue, reason=reason, attempts=attempts),
        )

    # -------------------------------------------------------------- internals
    def _sibling(
        self, name: str, headers: HeaderInput, kind: SpanKind, attributes: dict[str, Any]
    ) -> TraceStep:
        span = self._start(name, headers, kind, attributes, follow_link=True)
        if _span_context_of(_header(headers, hdr.TRACEPARENT)) is None:
            # No anchor upstream: this span becomes the anchor of later steps.
            return TraceStep(span, (*_context_headers(span), (hdr.TRACE_LINK, None)))
        return TraceStep(span, ((hdr.TRACE_LINK, _context_headers(span)[0][1]),))

    def _start(
        self,
        name: str,
        headers: HeaderInput,
        kind: SpanKind,
        attributes: dict[str, Any],
        *,
        follow_link: bool,
    ) -> Span:
        assert self._tracer is not None
        parent = extract(headers)
        parent_ctx = trace.get_current_span(parent).get_span_context()
        links: list[Link] = []
        linked = {parent_ctx.span_id}
        if follow_link:
            previous = _span_context_of(_header(headers, hdr.TRACE_LINK))
            if previous is not None:
                links.append(Link(previous, {"dueflow.link": "previous_step"}))
                linked.add(previous.span_id)
        ambient = trace.get_current_span().get_span_context()
        if ambient.is_valid and ambient.span_id not in linked:
            links.append(Link(ambient, {"dueflow.link": "caller"}))
        return self._tracer.start_span(
            name, context=parent, kind=kind, attributes=attributes, links=links
        )


def _attributes(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"messaging.system": "kafka"}
    out.update({f"dueflow.{k}": v for k, v in values.items() if v is not None})
    return out


# --------------------------------------------------------------------------- setup


def enabled() -> bool:
    """True when an SDK tracer provider is installed globally."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


EXPORTERS = ("none", "console", "otlp", "jsonl")


def provider_from_env(env: Mapping[str, str], *, service_name: str) -> TracerProvider | None:
    """An SDK provider for ``OTEL_TRACES_EXPORTER`` (``None`` when unset/``none``).

    Exporters: ``console`` (stdout), ``otlp`` (needs the optional package
    ``opentelemetry-exporter-otlp``; endpoint from ``OTEL_EXPORTER_OTLP_*``),
    ``jsonl`` (dueflow's: one JSON object per finished span appended to the
    file ``DUEFLOW_TRACES_JSONL``, for tests and debugging). Sampling,
    service name and resource attributes follow the standard ``OTEL_*``
    variables; ``OTEL_SDK_DISABLED=true`` turns tracing off.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(resource=Resource.create(attrs))
    for name in names:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "jsonl":
            path = env.get("DUEFLOW_TRACES_JSONL")
            if not path:
                raise ConfigError("DUEFLOW_TRACES_JSONL", path, "a file path (for jsonl)")
            # imported here: the SDK's export modules load only for this exporter
            from dueflow.observability.trace_export import JsonLinesSpanExporter

            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
        elif name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
        else:
            raise ConfigError("OTEL_TRACES_EXPORTER", name, ", ".join(EXPORTERS))
    return provider


def _otlp_exporter() -> Any:
    try:  # optional dependency: opentelemetry-exporter-otlp
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER",
            "otlp",
            "otlp with the package opentelemetry-exporter-otlp installed "
            "(pip install 'opentelemetry-exporter-otlp-proto-http')",
        ) from exc
    return OTLPSpanExporter()
