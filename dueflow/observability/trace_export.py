"""A span exporter that appends one JSON object per finished span to a file.

Selected with ``OTEL_TRACES_EXPORTER=jsonl`` and ``DUEFLOW_TRACES_JSONL=PATH``.
Several processes may append to the same file (one ``write`` per line on a
file opened for appending), so a test can follow one job's trace across the
scheduler, the emitter and the worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The JSON shape of one span (ids as lower-case hex)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": None if span.parent is None else format(span.parent.span_id, "016x"),
        "kind": span.kind.name.lower(),
        "status": span.status.status_code.name.lower(),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "links": [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "service": span.resource.attributes.get("service.name"),
        "pid": os.getpid(),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to ``path``, one JSON object per line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._lock = threading.Lock()
        self._fd: int | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = b"".join(orjson.dumps(span_record(s), default=str) + b"\n" for s in spans)
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, data)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
