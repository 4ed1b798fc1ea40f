"""Structured logs: one JSON object per line (orjson), or text for humans.

Use :func:`event` for anything an operator may search for: job start,
success, retry, failure, dead-letter, leadership changes. Fields travel as
keyword arguments and become top-level JSON keys (``job_id``, ``queue``,
``task``, ``attempt``, ``duration_ms``, ``outcome``, ``trace_id``, ...).
When a span is current and no ``trace_id`` is given, the span's trace id is
added, so log lines and traces join up.

Every dueflow process calls :func:`configure` once at start with the
``observability.log_format`` (``--log-format json|text``) and
``observability.log_level`` settings.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson
from opentelemetry import trace

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

# The fields of a job event, in the order the text format shows them first.
JOB_FIELDS = ("job_id", "queue", "task", "attempt", "duration_ms", "outcome", "trace_id")
FORMATS = ("json", "text")

# Event names operators search for (workers and the emitter log these).
JOB_STARTED = "job.started"
JOB_SUCCEEDED = "job.succeeded"
JOB_RETRY = "job.retry"
JOB_FAILED = "job.failed"
JOB_DEAD_LETTER = "job.dead_letter"
EMITTER_LEADERSHIP = "emitter.leadership"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "event": ..., **fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level logger event key=value ...`` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        first = [k for k in JOB_FIELDS if k in fields]
        ordered = first + [k for k in fields if k not in JOB_FIELDS]
        shown = " ".join(f"{k}={fields[k]}" for k in ordered)
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        )
        if shown:
            line += "  " + shown
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every ``dueflow.*`` logger to ``stream`` (stderr) in ``fmt`` (json or text)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: accepted: json, text")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("dueflow")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def event(logger: logging.Logger, name: str, /, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``name`` with structured ``fields`` (skipped cheaply when the level is off).

    Field names that clash with :class:`logging.LogRecord` attributes (``name``,
    ``msg``, ``args``, ...) are kept with a trailing underscore instead of failing.
    """
    if not logger.isEnabledFor(level):
        return
    if "trace_id" not in fields:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            fields["trace_id"] = format(ctx.trace_id, "032x")
    if not _RESERVED.isdisjoint(fields):
        fields = {(f"{k}_" if k in _RESERVED else k): v for k, v in fields.items()}
    logger.log(level, name, extra=fields, stacklevel=2)


def job_event(
    logger: logging.Logger,
    name: str,
    /,
    *,
    job_id: str,
    queue: str,
    task: str,
    attempt: int,
    duration_ms: float | None = None,
    outcome: str | None = None,
    trace_id: str | None = None,
    level: int = logging.INFO,
    **extra: Any,
) -> None:
    """A job event (:data:`JOB_STARTED`, ...) with every field of :data:`JOB_FIELDS`.

    Fields that are ``None`` are left out, except that ``trace_id`` falls back
    to the current span's.
    """
    fields: dict[str, Any] = {"job_id": job_id, "queue": queue, "task": task, "attempt": attempt}
    if duration_ms is not None:
        fields["duration_ms"] = round(duration_ms, 3)
    if outcome is not None:
        fields["outcome"] = outcome
    if trace_id is not None:
        fields["trace_id"] = trace_id
    event(logger, name, level, **fields, **extra)
