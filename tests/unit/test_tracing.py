"""One job is one trace: span helpers through Kafka headers, and free when off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dueflow import headers as hdr
from dueflow.errors import ConfigError
from dueflow.observability import tracing
from dueflow.observability.tracing import JobTracer


@pytest.fixture
def traced() -> tuple[JobTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return JobTracer(provider), exporter


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def _span_id(s: ReadableSpan) -> int:
    ctx = s.get_span_context()
    assert ctx is not None
    return ctx.span_id


def test_schedule_fire_retries_dead_letter_are_one_trace(
    traced: tuple[JobTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    # SDK: schedule() writes the timer record with the step's headers.
    with tracer.span_for_schedule(job_id="j1", queue="billing", task="charge") as s:
        timer = hdr.replace([(hdr.DUE, b"1000")], s.headers)
    # Emitter: fires it; the exec record carries the fire span (the job's anchor).
    with tracer.span_for_fire(timer, job_id="j1", queue="billing", lateness_ms=3) as f:
        exec_rec = hdr.replace(timer, f.headers)
    # Worker: attempt 1 fails -> retry record; attempt 2 fails -> DLQ record.
    with tracer.span_for_attempt(exec_rec, attempt=1, job_id="j1", task="charge") as a1:
        a1.fail(RuntimeError("boom 1"))
        retry_rec = hdr.replace(exec_rec, a1.headers)
    a2 = tracer.span_for_attempt(retry_rec, attempt=2)
    after_a2 = hdr.replace(retry_rec, a2.headers)
    with pytest.raises(RuntimeError, match="boom 2"), a2:
        raise RuntimeError("boom 2")
    with tracer.span_for_dead_letter(after_a2, reason="exhausted", attempts=2) as d:
        dlq_rec = hdr.replace(after_a2, d.headers)

    spans = exporter.get_finished_spans()
    assert len(spans) == 5
    assert len({s.context.trace_id for s in spans if s.context}) == 1, "one job, one trace"
    named = _by_name(spans)
    schedule, fire = named[tracing.SCHEDULE][0], named[tracing.FIRE][0]
    att1, att2 = sorted(
        named[tracing.EXECUTE], key=lambda s: str((s.attributes or {}).get("dueflow.attempt"))
    )
    dead = named[tracing.DEAD_LETTER][0]
    assert schedule.parent is None
    assert fire.parent is not None
    assert fire.parent.span_id == _span_id(schedule)
    for child in (att1, att2, dead):
        assert child.parent is not None
        assert child.parent.span_id == _span_id(fire)
    assert not att1.links
    assert [link.context.span_id for link in att2.links] == [_span_id(att1)]
    assert [link.context.span_id for link in dead.links] == [_span_id(att2)]
    assert att1.status.status_code.name == "ERROR"
    assert att2.status.status_code.name == "ERROR"
    assert any(e.name == "exception" for e in att2.events)
    assert fire.attributes is not None
    assert fire.attributes["dueflow.lateness_ms"] == 3
    assert dead.attributes is not None
    assert dead.attributes["dueflow.reason"] == "exhausted"
    # The DLQ record still names the anchor and links the dead-letter step,
    # so a redriven attempt continues the same trace.
    assert tracing.trace_id_of(dlq_rec) == format(fire.context.trace_id, "032x")
    assert hdr.header_text(dlq_rec, hdr.TRACE_LINK) is not None
    assert _hex(_span_id(dead)) in (hdr.header_text(dlq_rec, hdr.TRACE_LINK) or "")


def test_schedule_is_child_of_the_callers_span_and_header_dicts_work(
    traced: tuple[JobTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    assert tracer.provider is not None
    app_tracer = tracer.provider.get_tracer("app")
    with app_tracer.start_as_current_span("http request") as request:
        step = tracer.span_for_schedule(job_id="j", queue="q", task="t")
        step.end()
    as_dict = {k: v for k, v in step.headers if v is not None}
    fire = tracer.span_for_fire(as_dict)
    fire.end()
    spans = _by_name(exporter.get_finished_spans())
    sched = spans[tracing.SCHEDULE][0]
    assert sched.parent is not None
    assert sched.parent.span_id == request.get_span_context().span_id
    assert spans[tracing.FIRE][0].parent.span_id == _span_id(sched)  # type: ignore[union-attr]


def test_a_batch_span_of_the_caller_becomes_a_link_not_the_parent(
    traced: tuple[JobTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    with tracer.span_for_schedule(job_id="j", queue="q", task="t") as s:
        timer = hdr.replace(None, s.headers)
    assert tracer.provider is not None
    with tracer.provider.get_tracer("emitter").start_as_current_span("batch") as batch:
        tracer.span_for_fire(timer).end()
    fire = _by_name(exporter.get_finished_spans())[tracing.FIRE][0]
    assert fire.parent is not None
    assert fire.parent.span_id == _span_id(
        _by_name(exporter.get_finished_spans())[tracing.SCHEDULE][0]
    )
    assert [link.context.span_id for link in fire.links] == [batch.get_span_context().span_id]


def test_an_untraced_producer_gets_a_trace_from_the_fire_on(
    traced: tuple[JobTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    with tracer.span_for_attempt([(hdr.DUE, b"1")], attempt=1) as a1:
        rec = hdr.replace([], a1.headers)
    with tracer.span_for_attempt(rec, attempt=2):
        pass
    att1, att2 = exporter.get_finished_spans()
    assert att1.parent is None
    assert att2.parent is not None
    assert att2.parent.span_id == _span_id(att1)
    assert att1.context.trace_id == att2.context.trace_id


def test_off_creates_no_spans_and_headers_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tracer(*_a: object, **_k: object) -> None:
        raise AssertionError("a tracer was asked for while tracing is off")

    monkeypatch.setattr(trace, "get_tracer", no_tracer)
    monkeypatch.setattr(TracerProvider, "get_tracer", no_tracer)
    tracer = JobTracer(None)
    upstream = [(hdr.TRACEPARENT, b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")]
    steps = [
        tracer.span_for_schedule(job_id="j", queue="q", task="t"),
        tracer.span_for_fire(upstream),
        tracer.span_for_attempt(upstream, attempt=1),
        tracer.span_for_dead_letter(upstream, reason="exhausted"),
    ]
    for step in steps:
        with step as s:
            s.fail(RuntimeError("x"))
            s.set(attempt=1)
        assert s.span is None
        assert s.headers == ()
        assert s is steps[0], "one shared inert step: nothing is allocated per call"
    assert hdr.replace(upstream, steps[2].headers) == upstream, "context travels unchanged"
    assert tracing.trace_id_of(upstream) == "a" * 32


def test_env_selects_exporters(tmp_path: Path) -> None:
    assert tracing.provider_from_env({}, service_name="x") is None
    assert tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "none"}, service_name="x") is None
    env = {"OTEL_TRACES_EXPORTER": "jsonl", "DUEFLOW_TRACES_JSONL": str(tmp_path / "t.jsonl")}
    assert tracing.provider_from_env({**env, "OTEL_SDK_DISABLED": "true"}, service_name="x") is None
    tracer = JobTracer.from_env(env, service_name="dueflow-test", install_global=False)
    assert tracer.enabled
    with tracer.span_for_schedule(job_id="j9", queue="q", task="t"):
        pass
    tracer.close()
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert rec["name"] == tracing.SCHEDULE
    assert rec["service"] == "dueflow-test"
    assert rec["attributes"]["dueflow.job_id"] == "j9"
    assert len(rec["trace_id"]) == 32
    assert rec["parent_span_id"] is None
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "zipkin"}, service_name="x")
    with pytest.raises(ConfigError, match="DUEFLOW_TRACES_JSONL"):
        tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "jsonl"}, service_name="x")
