"""Structured logs: one JSON object per line (orjson), or text for humans.

Use :func:`event` for anything an operator may search for: job start,
success, retry, failure, dead-letter, leadership changes. Fields travel as
keyword arguments and become top-level JSON keys (``job_id``, ``queue``,
``task``, ``attempt``, ``duration_ms``, ``outcome``, ``trace_id``, ...).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


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
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level logger event key=value ...`` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{k}={v}"
            for k, v in record.__dict__.items()
            if k not in _RESERVED and not k.startswith("_")
        )
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        )
        if fields:
            line += "  " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every ``dueflow.*`` logger to ``stream`` (stderr) in ``fmt``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("dueflow")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``name`` with structured ``fields`` (skipped cheaply when the level is off)."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra=fields)
