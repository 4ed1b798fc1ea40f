"""Structured log lines: JSON keys of a job event, text for humans."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from dueflow import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger("dueflow")
    saved = (root.handlers[:], root.level, root.propagate)
    try:
        yield out
    finally:
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
    rec = json.loads(stream.getvalue())
    assert rec["event"] == "job.retry"
    assert rec["level"] == "warning"
    assert rec["duration_ms"] == 1.235
    assert rec["tier"] == "1s"
    assert set(logs.JOB_FIELDS) <= set(rec)
