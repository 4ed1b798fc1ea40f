"""Structured log lines: JSON keys of a job event, text for humans."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from dueflow.observability import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger("dueflow")
    saved = (root.handlers[:], root.level, root.propagate)
    try:
        yield out
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:
                handler.close()
        root.handlers[:], root.level, root.propagate = saved


def test_json_line_has_the_job_fields(stream: io.StringIO) -> None:
    logs.configure("json", "INFO", stream)
    logs.event(
        logging.getLogger("dueflow.worker"),
        "job.succeeded",
        job_id="j-1",
        queue="billing",
        task="charge",
        attempt=2,
        duration_ms=12.5,
        outcome="succeeded",
        trace_id="a" * 32,
    )
    (line,) = stream.getvalue().splitlines()
    rec = json.loads(line)
    assert rec["event"] == "job.succeeded"
    assert rec["logger"] == "dueflow.worker"
    assert rec["level"] == "info"
    assert rec["ts"].endswith("Z")
    assert {k: rec[k] for k in logs.JOB_FIELDS} == {
        "job_id": "j-1",
        "queue": "billing",
        "task": "charge",
        "attempt": 2,
        "duration_ms": 12.5,
        "outcome": "succeeded",
        "trace_id": "a" * 32,
    }


def test_leadership_change_and_reserved_names_and_odd_values(stream: io.StringIO) -> None:
    logs.configure("json", "INFO", stream)
    log = logging.getLogger("dueflow.emitter")
    logs.event(log, "emitter.leadership", leader=True, name="emitter-1", args=(1, 2), at=object())
    rec = json.loads(stream.getvalue())
    assert rec["leader"] is True
    assert rec["name_"] == "emitter-1"
    assert rec["args_"] == [1, 2]
    assert rec["at"].startswith("<object")


def test_below_level_is_not_written(stream: io.StringIO) -> None:
    logs.configure("json", "WARNING", stream)
    logs.event(logging.getLogger("dueflow.x"), "job.started", job_id="j")
    assert stream.getvalue() == ""


def test_current_span_supplies_the_trace_id(stream: io.StringIO) -> None:
    logs.configure("json", "INFO", stream)
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        logs.event(logging.getLogger("dueflow.x"), "job.started", job_id="j")
    rec = json.loads(stream.getvalue())
    assert rec["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_text_format_puts_job_fields_first(stream: io.StringIO) -> None:
    logs.configure("text", "INFO", stream)
    logs.event(logging.getLogger("dueflow.w"), "job.retry", extra_x=1, attempt=1, job_id="j")
    line = stream.getvalue().strip()
    assert "job.retry  job_id=j attempt=1 extra_x=1" in line
    with pytest.raises(ValueError, match="json, text"):
        logs.configure("xml")


def test_job_event_helper(stream: io.StringIO) -> None:
    logs.configure("json", "INFO", stream)
    log = logging.getLogger("dueflow.worker")
    logs.job_event(
        log,
        logs.JOB_RETRY,
        job_id="j",
        queue="q",
        task="t",
        attempt=1,
        duration_ms=1.23456,
        outcome="retrying",
        trace_id="c" * 32,
        tier="1s",
        level=logging.WARNING,
    )
    logs.flush()
    rec = json.loads(stream.getvalue())
    assert rec["event"] == "job.retry"
    assert rec["level"] == "warning"
    assert rec["duration_ms"] == 1.235
    assert rec["tier"] == "1s"
    assert set(logs.JOB_FIELDS) <= set(rec)


def _job_line(log: logging.Logger, event_name: str, /, **extra: object) -> None:
    logs.job_event(
        log,
        event_name,
        job_id="j-9",
        queue="q",
        task="t",
        attempt=2,
        duration_ms=4.0,
        outcome="succeeded",
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_job_event_lines_are_queued_written_in_order_and_equal_to_logging_lines(
    stream: io.StringIO, fmt: str
) -> None:
    logs.configure(fmt, "INFO", stream)
    log = logging.getLogger("dueflow.worker")
    _job_line(log, logs.JOB_STARTED)  # queued
    logs.event(log, "worker stopping", why="test")  # any other record writes them first
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "job.started" in lines[0]
    assert "worker stopping" in lines[1]
    # The queued line is the line logging would write for the same fields.
    plain = io.StringIO()
    handler = logging.StreamHandler(plain)
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    other = logging.getLogger("dueflow-plain.worker")
    other.addHandler(handler)
    other.setLevel(logging.INFO)
    other.propagate = False
    try:
        _job_line(other, logs.JOB_STARTED)
    finally:
        other.removeHandler(handler)
    expected = plain.getvalue().strip().replace("dueflow-plain.worker", "dueflow.worker")
    assert _without_time(lines[0], fmt) == _without_time(expected, fmt)


def _without_time(line: str, fmt: str) -> object:
    """The line without its time stamp (the two lines were written at different times)."""
    if fmt == "json":
        rec = json.loads(line)
        rec.pop("ts")
        return rec
    return line.split(" ", 1)[1]


def test_queued_job_lines_are_written_within_the_flush_interval(stream: io.StringIO) -> None:
    logs.configure("json", "INFO", stream)
    _job_line(logging.getLogger("dueflow.worker"), logs.JOB_SUCCEEDED)
    deadline = time.monotonic() + 10
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    rec = json.loads(stream.getvalue())
    assert rec["event"] == "job.succeeded"
    assert rec["trace_id"] is None  # present, null: the job has no trace


def test_job_event_below_level_or_under_foreign_handlers_uses_logging(
    stream: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    logs.configure("json", "WARNING", stream)
    _job_line(logging.getLogger("dueflow.worker"), logs.JOB_SUCCEEDED)
    logs.flush()
    assert stream.getvalue() == ""
    root = logging.getLogger("dueflow")
    root.handlers[:] = []
    root.propagate = True
    root.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger="dueflow"):
        _job_line(logging.getLogger("dueflow.worker"), logs.JOB_SUCCEEDED, name="n")
    (record,) = caplog.records
    assert record.getMessage() == "job.succeeded"
    assert record.job_id == "j-9"  # type: ignore[attr-defined]
    assert record.name_ == "n"  # type: ignore[attr-defined]


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_job_line_with_any_value_from_the_wire_is_written_and_never_raises(
    stream: io.StringIO, fmt: str
) -> None:
    """orjson refuses ints past 64 bits even with ``default=str`` (``TypeError: Integer
    exceeds 64-bit range``): a df-attempt of 2**64 in job.started raised in the
    worker after the job had taken its concurrency slot."""
    logs.configure(fmt, "INFO", stream)
    log = logging.getLogger("dueflow.worker")
    odd: dict[str, Any] = {
        "huge": 2**64,
        "negative": -(2**63) - 1,
        "vast": 2**20_000,  # str() of it raises (Python's int digits limit)
        "nested": {1: [2**70, {"x": 2**64}], (1, 2): b"\xff\x00"},
        "unprintable": _Unprintable(),
    }
    logs.job_event(log, logs.JOB_STARTED, job_id="j", queue="q", task="t", attempt=2**64, **odd)
    logs.event(log, "record quarantined", attempt=2**64, **odd)
    logs.flush()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    if fmt == "json":
        first = json.loads(lines[0])
        assert first["attempt"] == str(2**64)
        assert first["huge"] == str(2**64)
        assert first["negative"] == str(-(2**63) - 1)
        assert first["vast"] == "an integer of 20001 bits"
        assert first["nested"]["1"] == [str(2**70), {"x": str(2**64)}]
        assert "raised RuntimeError" in first["unprintable"]
        assert json.loads(lines[1])["attempt"] == str(2**64)
    else:
        assert f"attempt={2**64}" in lines[0]
        assert "vast=an integer of 20001 bits" in lines[0]
