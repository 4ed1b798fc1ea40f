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

import contextlib
import logging
import sys
import threading
import time
from typing import Any, TextIO

from opentelemetry import trace

from dueflow.control_chars import escape_text, json_text

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
JOB_RESULT_NOT_KEPT = "job.result_not_kept"
EMITTER_LEADERSHIP = "emitter.leadership"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")
    }


_LEVEL_NAMES = {
    level: logging.getLevelName(level)
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
}


class _Second:
    """The last second stamped and its text (one strftime per second, not per line);
    one tuple, replaced whole, so threads never see a second with another's text."""

    last: tuple[int, str] = (-1, "")


def _utc_stamp(created: float) -> str:
    second = int(created)
    last = _Second.last
    if last[0] != second:
        last = _Second.last = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{last[1]}.{int(created * 1000) % 1000:03d}Z"


class _LineFormatter(logging.Formatter):
    """A record as one line: subclasses define ``line`` (also used without records)."""

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created, record.levelname, record.name, record.getMessage(), _fields(record), exc
        )

    @staticmethod
    def line(
        created: float,
        levelname: str,
        logger: str,
        name: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        raise NotImplementedError


class JsonFormatter(_LineFormatter):
    """``{"ts": ..., "level": ..., "logger": ..., "event": ..., **fields}``."""

    @staticmethod
    def line(
        created: float,
        levelname: str,
        logger: str,
        name: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        out: dict[str, Any] = {
            "ts": _utc_stamp(created),
            "level": levelname.lower(),
            "logger": logger,
            "event": name,
            **fields,
        }
        if exc:
            out["exc"] = exc
        return json_text(out, default=str)  # control characters escaped, never raises


class TextFormatter(_LineFormatter):
    """``HH:MM:SS level logger event key=value ...`` for humans."""

    @staticmethod
    def line(
        created: float,
        levelname: str,
        logger: str,
        name: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        first = [k for k in JOB_FIELDS if k in fields]
        ordered = first + [k for k in fields if k not in JOB_FIELDS]
        shown = " ".join(f"{k}={escape_text(fields[k])}" for k in ordered)
        text = (
            f"{time.strftime('%H:%M:%S', time.localtime(created))} "
            f"{levelname.lower():7} {logger}: {escape_text(name)}"
        )
        if shown:
            text += "  " + shown
        if exc:
            text += "\n" + escape_text(exc, keep="\n")
        return text


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs; job events may bypass ``LogRecord``.

    :func:`job_event` runs once or twice per job in a worker doing tens of
    thousands of jobs per second. Through ``logging`` a line costs about
    15 us (the ``LogRecord``, the caller lookup, a write and flush per
    line); :meth:`write_event` formats the same line in about 3 us and
    queues it: queued lines are written together at most
    :data:`FLUSH_INTERVAL_S` later (a daemon thread), before any other
    record, when :data:`MAX_QUEUED` are waiting, and on :meth:`flush` (which
    ``logging.shutdown`` calls at exit).
    """

    FLUSH_INTERVAL_S = 0.1
    MAX_QUEUED = 5_000

    def __init__(self, stream: TextIO, fmt: str) -> None:
        super().__init__(stream)
        self._line = JsonFormatter.line if fmt == "json" else TextFormatter.line
        self.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        self._queued: list[str] = []
        self._flusher: threading.Thread | None = None
        self._stop_flushing = threading.Event()

    def write_event(self, level: int, logger: str, name: str, fields: dict[str, Any]) -> None:
        text = self._line(
            time.time(),
            _LEVEL_NAMES.get(level) or logging.getLevelName(level),
            logger,
            name,
            fields,
        )
        with self.lock:  # type: ignore[union-attr]
            queued = self._queued
            queued.append(text)
            if len(queued) >= self.MAX_QUEUED:
                self._write_queued()
            elif self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="dueflow-log-flush", daemon=True
                )
                self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        # Called with the lock held (Handler.handle): queued lines go first.
        if self._queued:
            self._write_queued()
        super().emit(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._queued:
                self._write_queued()
        super().flush()

    def close(self) -> None:
        self._stop_flushing.set()
        with contextlib.suppress(ValueError, OSError):  # the stream may be closed already
            self.flush()
        super().close()

    def _write_queued(self) -> None:
        text, self._queued = "\n".join(self._queued) + self.terminator, []
        # Logging never fails the caller (nor the flusher thread): a stream that
        # cannot be written (closed, full disk) loses these lines.
        with contextlib.suppress(ValueError, OSError):
            self.stream.write(text)
            self.stream.flush()

    def _flush_loop(self) -> None:
        while not self._stop_flushing.wait(self.FLUSH_INTERVAL_S):
            if self._queued:
                with self.lock:  # type: ignore[union-attr]
                    if self._queued:
                        self._write_queued()


def _line_handler(logger: logging.Logger, level: int) -> LineHandler | None:
    """The :class:`LineHandler` that alone handles ``logger``'s records, if so."""
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        if current.handlers:
            handlers = current.handlers
            if len(handlers) == 1 and type(handlers[0]) is LineHandler:
                handler = handlers[0]
                return handler if level >= handler.level and not handler.filters else None
            return None
        if not current.propagate:
            return None
        current = current.parent
    return None


def configure(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every ``dueflow.*`` logger to ``stream`` (stderr) in ``fmt`` (json or text)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: accepted: json, text")
    handler = LineHandler(stream or sys.stderr, fmt)
    root = logging.getLogger("dueflow")
    for previous in root.handlers:
        if isinstance(previous, LineHandler):
            previous.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def flush() -> None:
    """Write the job event lines still queued (tests, before reading the stream)."""
    for handler in logging.getLogger("dueflow").handlers:
        handler.flush()


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
    """A job event (:data:`JOB_STARTED`, ...) with the fields of :data:`JOB_FIELDS`.

    ``duration_ms`` and ``outcome`` are left out when ``None``; ``trace_id``
    is the job's (from its record headers: the caller knows it, so no
    current span is looked up), ``null`` when the job has no trace. Cheap
    enough to call per job: a check of the level when it is off, a few
    microseconds per line through :class:`LineHandler`.
    """
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, Any] = {"job_id": job_id, "queue": queue, "task": task, "attempt": attempt}
    if duration_ms is not None:
        fields["duration_ms"] = round(duration_ms, 3)
    if outcome is not None:
        fields["outcome"] = outcome
    fields["trace_id"] = trace_id
    if extra:
        if not _RESERVED.isdisjoint(extra):
            extra = {(f"{k}_" if k in _RESERVED else k): v for k, v in extra.items()}
        fields.update(extra)
    handler = _line_handler(logger, level)
    if handler is not None:
        handler.write_event(level, logger.name, name, fields)
    else:
        logger.log(level, name, extra=fields, stacklevel=2)
