"""OpenTelemetry through Kafka headers: one trace per job.

W3C trace context (``traceparent``/``tracestate``) travels in record headers
from ``schedule()`` through the emitter, the worker, each retry and the DLQ.
Tracing is off unless an exporter is configured by the standard ``OTEL_*``
environment variables (``OTEL_TRACES_EXPORTER``, ...) or a provider is
installed by the application; when off, :func:`enabled` is False and callers
skip all span work on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import get_global_textmap
from opentelemetry.sdk.trace import TracerProvider

from dueflow import headers as hdr

TRACER_NAME = "dueflow"


def enabled() -> bool:
    """True when a real tracer provider is installed (spans would be recorded)."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def inject_headers(ctx: otel_context.Context | None = None) -> list[tuple[str, bytes]]:
    """Headers carrying the current (or given) trace context."""
    carrier: dict[str, str] = {}
    get_global_textmap().inject(carrier, context=ctx)
    return [(k, v.encode()) for k, v in carrier.items()]


def carrier_from_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers or ():
        if key in (hdr.TRACEPARENT, hdr.TRACESTATE) and value is not None:
            out[key] = value.decode("ascii", "replace")
    return out


def extract(
    headers: Sequence[tuple[str, bytes | None]] | Mapping[str, str] | None,
) -> otel_context.Context:
    """The trace context found in record headers (or a carrier mapping)."""
    if headers is None:
        carrier: Mapping[str, str] = {}
    elif isinstance(headers, Mapping):
        carrier = headers
    else:
        carrier = carrier_from_headers(headers)
    return get_global_textmap().extract(carrier)


def trace_id_of(headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The 32-hex trace id in a ``traceparent`` header, without OpenTelemetry."""
    raw = hdr.header(headers, hdr.TRACEPARENT)
    if raw is None:
        return None
    parts = raw.split(b"-")
    return parts[1].decode("ascii", "replace") if len(parts) >= 4 else None


def configure_from_env() -> bool:
    """Install an SDK provider when ``OTEL_TRACES_EXPORTER`` names an exporter.

    Returns True when tracing is now on. ``none`` or unset leaves it off.
    """
    import os

    name = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if name in ("", "none"):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({}))
    exporter: Any
    if name == "console":
        exporter = ConsoleSpanExporter()
    elif name == "otlp":
        try:  # optional dependency: opentelemetry-exporter-otlp
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError:
            return False
        exporter = OTLPSpanExporter()
    else:
        return False
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True
