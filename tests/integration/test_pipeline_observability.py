"""Observability of the whole pipeline, across real processes.

The SDK schedules jobs in this process; ``dueflow emitter`` and ``dueflow
worker`` run as subprocesses (stopped by pid). The tests scrape their
``/metrics``, read their log lines and the spans they export, and check the
numbers against what the jobs did: ``ok`` succeeds, ``flaky`` fails once and
succeeds on its retry, ``doomed`` fails twice and ends in the DLQ.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.ports import free_port
from dueflow.kafka.topics import names
from dueflow.observability import logs
from dueflow.observability.tracing import DEAD_LETTER, EXECUTE, FIRE, SCHEDULE, JobTracer
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, Samples, scrape, wait_for
from tests.integration.test_health_probes import probe, status_of
from tests.integration.test_worker_processes import group_assignment
from tests.integration.worker_support import outcomes_of, read_topic


@pytest.fixture
def pipeline(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka.bootstrap, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def schedule(p: Pipeline, plan: dict[str, int], tracer: JobTracer | None = None) -> dict[str, str]:
    """Schedule ``plan`` (task -> count) due 0.1-2.9 s from now; job id -> task."""
    out: dict[str, str] = {}
    with Scheduler(p.settings, tracer=tracer) as s:
        i = 0
        for task, count in plan.items():
            for _ in range(count):
                job = s.schedule(task, {"i": i}, queue=QUEUE, delay=0.1 + (i % 15) * 0.2)
                out[job.job_id] = task
                i += 1
    return out


def final_outcomes(p: Pipeline, jobs: dict[str, str], timeout: float = 90) -> list[dict[str, Any]]:
    """The committed outcomes once every job is final (succeeded or dead)."""

    def done(records: list[Any]) -> bool:
        final = {o["job_id"] for o in outcomes_of(records) if o["state"] in ("succeeded", "dead")}
        return final >= set(jobs)

    records = read_topic(p.settings, names(p.settings).outcomes, until=done, timeout=timeout)
    outs = outcomes_of(records)
    finals = {o["job_id"] for o in outs if o["state"] in ("succeeded", "dead")}
    assert finals >= set(jobs), f"not final: {set(jobs) - finals}\n{p.logs()}"
    return outs


def scrape_until(port: int, what: str, check: Any, timeout: float = 60) -> Samples:
    """Scrape ``port`` until ``check(samples)`` holds (metrics are added up per commit)."""

    def ready() -> Samples | None:
        samples = scrape(port)
        return samples if samples is not None and check(samples) else None

    result: Samples = wait_for(what, ready, timeout)
    return result


# ------------------------------------------------------------------ metrics + logs


@pytest.mark.timeout(240)
def test_metrics_and_job_logs_of_one_emitter_and_one_worker(pipeline: Pipeline) -> None:
    p = pipeline
    em_port, wk_port = free_port(), free_port()
    emitter = p.emitter(em_port)
    worker = p.worker(wk_port, "--log-format", "json")
    scrape_until(em_port, "an active emitter", lambda s: s.value("dueflow_emitter_leader") == 1)
    plan = {"ok": 12, "flaky": 4, "doomed": 1}
    jobs = schedule(p, plan)
    n = len(jobs)
    outs = final_outcomes(p, jobs)
    assert Counter(o["state"] for o in outs if o["state"] not in ("retrying", "started")) == {
        "scheduled": 17,  # the client's, one per job
        "succeeded": 16,
        "dead": 1,
    }

    # --- the emitter: every job fired once, lateness measured for each
    em = scrape_until(
        em_port,
        "fires of every job",
        lambda s: (s.value("dueflow_fire_lateness_seconds_count", queue=QUEUE) or 0) >= n,
    )
    # (a takeover after CPU starvation may fire again what came after the last commit)
    refires = em.value("dueflow_emitter_refires_total") or 0
    fired = em.value("dueflow_fires_total", queue=QUEUE) or 0
    assert n <= fired <= n + refires
    assert em.value("dueflow_fire_lateness_seconds_bucket", queue=QUEUE, le="+Inf") == fired
    # Sane lateness: none early (no negative sum), none later than 10 s on a busy machine.
    assert em.value("dueflow_fire_lateness_seconds_bucket", queue=QUEUE, le="10.0") == fired
    lateness_sum = em.value("dueflow_fire_lateness_seconds_sum", queue=QUEUE)
    assert lateness_sum is not None
    assert 0 <= lateness_sum < 10 * n
    assert em.value("dueflow_emitter_leader") == 1
    # One takeover, unless CPU starvation cost it the lease once: the log says so too.
    activations = emitter.events("emitter is active")
    assert em.value("dueflow_emitter_failovers_total") == len(activations) >= 1
    assert {e["role"] for e in activations} == {"active"}
    committed = em.value("dueflow_emitter_offset_commits_total", result="committed") or 0
    assert committed >= 1
    assert (em.value("dueflow_emitter_transactions_total", result="committed") or 0) == 0
    # Every commit's duration is observed, and none took longer than the 30 s timeout.
    assert em.value("dueflow_emitter_commit_seconds_count") == committed
    assert em.value("dueflow_emitter_commit_seconds_bucket", le="10.0") == committed
    levels = {lbl["level"] for lbl in em.labels_of("dueflow_timers_pending")}
    assert levels == {"near", "0", "1", "2"}
    offset = em.value("dueflow_clock_offset_seconds")
    assert offset is not None
    assert -1.0 < offset < 5.0  # same host: read time minus broker append time
    assert em.total("dueflow_quarantined_total") == 0

    # --- the worker: outcomes, attempts, retries by tier, the dead letter
    def jobs_total(s: Samples, task: str, outcome: str) -> float | None:
        return s.value("dueflow_jobs_total", queue=QUEUE, task=task, outcome=outcome)

    wk = scrape_until(
        wk_port,
        "the worker's job counters",
        lambda s: (
            s.total("dueflow_jobs_total", outcome="succeeded") == 16
            and s.total("dueflow_jobs_total", outcome="dead") == 1
        ),
    )
    assert jobs_total(wk, "ok", "succeeded") == 12
    assert jobs_total(wk, "flaky", "retrying") == 4
    assert jobs_total(wk, "flaky", "succeeded") == 4
    assert jobs_total(wk, "doomed", "retrying") == 1
    assert jobs_total(wk, "doomed", "dead") == 1
    for task, attempts in (("ok", 12), ("flaky", 8), ("doomed", 2)):
        assert wk.value("dueflow_job_attempts_total", queue=QUEUE, task=task) == attempts
        assert wk.value("dueflow_job_duration_seconds_count", queue=QUEUE, task=task) == attempts
    assert wk.value("dueflow_retries_total", queue=QUEUE, tier="200ms") == 5
    assert wk.value("dueflow_retries_total", queue=QUEUE, tier="500ms") == 0
    assert wk.value("dueflow_dead_letters_total", queue=QUEUE, reason="exhausted") == 1
    assert wk.value("dueflow_duplicates_skipped_total", queue=QUEUE) == 0
    assert wk.total("dueflow_quarantined_total") == 0
    group = names(p.settings).worker_group(QUEUE)
    exec_topic = names(p.settings).exec(QUEUE)

    def lags(s: Samples) -> dict[tuple[str, str], float]:
        return {
            (lbl["topic"], lbl["partition"]): v
            for n, lbl, v in s.rows
            if n == "dueflow_consumer_lag" and lbl["group"] == group
        }

    wk = scrape_until(
        wk_port,
        "no lag on any exec partition (the commit markers are not lag), the DLQ depth",
        lambda s: (
            {part: v for (topic, part), v in lags(s).items() if topic == exec_topic}
            == {"0": 0, "1": 0, "2": 0}
            and (s.value("dueflow_dlq_depth", queue=QUEUE) or 0) >= 1
        ),
        timeout=40,  # the DLQ depth is read every 15 s
    )
    assert set(lags(wk).values()) == {0}  # the retry tiers too
    assert wk.value("dueflow_jobs_in_flight", queue=QUEUE) == 0

    # --- job log lines (JSON): start, success, failure, retry, dead letter
    lines = worker.json_lines()
    by_event: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line.get("event", "").startswith("job."):
            assert set(logs.JOB_FIELDS) - {"duration_ms", "outcome"} <= set(line), line
            assert line["queue"] == QUEUE
            assert line["task"] == jobs[line["job_id"]]
            assert line["trace_id"] is None  # tracing is off
            by_event.setdefault(line["event"], []).append(line)
    started = Counter((e["job_id"], e["attempt"]) for e in by_event[logs.JOB_STARTED])
    expected_attempts = {
        (job, a) for job, task in jobs.items() for a in range({"ok": 1}.get(task, 2))
    }
    assert set(started) == {(job, a + 1) for job, a in expected_attempts}
    assert set(started.values()) == {1}
    succeeded = by_event[logs.JOB_SUCCEEDED]
    assert sorted(e["job_id"] for e in succeeded) == sorted(
        j for j, t in jobs.items() if t != "doomed"
    )
    assert all(e["outcome"] == "succeeded" and e["duration_ms"] >= 0 for e in succeeded)
    failed = by_event[logs.JOB_FAILED]
    assert len(failed) == 6
    assert all(e["level"] == "warning" and e["error_type"] == "RuntimeError" for e in failed)
    retries = by_event[logs.JOB_RETRY]
    assert sorted(e["job_id"] for e in retries) == sorted(j for j, t in jobs.items() if t != "ok")
    assert all(e["tier"] == "200ms" and e["outcome"] == "retrying" for e in retries)
    (dead,) = by_event[logs.JOB_DEAD_LETTER]
    assert jobs[dead["job_id"]] == "doomed"
    assert (dead["attempt"], dead["outcome"], dead["reason"]) == (2, "dead", "exhausted")
    assert dead["level"] == "error"
    assert dead["duration_ms"] >= 0


@pytest.mark.timeout(240)
def test_worker_processes_serve_one_merged_view_and_text_logs(pipeline: Pipeline) -> None:
    p = pipeline
    em_port, wk_port = free_port(), free_port()
    p.emitter(em_port)
    worker = p.worker(wk_port, "--processes", "2", "--log-format", "text")

    def two_members() -> bool:
        members = group_assignment(p.settings)
        return len(members) == 2 and all(members.values())

    wait_for("two worker processes with partitions", two_members, 90)
    jobs = schedule(p, {"ok": 30})
    outs = final_outcomes(p, jobs)
    ran_by = {o["worker"] for o in outs if o["state"] == "succeeded"}
    assert len(ran_by) == 2, f"both processes ran jobs: {ran_by}"
    wk = scrape_until(
        wk_port,
        "the merged job counter",
        lambda s: s.value("dueflow_jobs_total", queue=QUEUE, task="ok", outcome="succeeded") == 30,
    )
    assert wk.value("dueflow_job_attempts_total", queue=QUEUE, task="ok") == 30
    assert wk.value("dueflow_job_duration_seconds_count", queue=QUEUE, task="ok") == 30
    assert wk.value("dueflow_jobs_in_flight", queue=QUEUE) == 0  # summed over live children

    # The parent's probes judge its children's published gauges: a series per child,
    # and the parent's own (ready when the whole is).
    def all_ready(s: Samples) -> bool:
        values = [v for n, _l, v in s.rows if n == "dueflow_ready"]
        return len(values) == 3 and set(values) == {1.0}

    scrape_until(wk_port, "the parent and both children ready", all_ready)
    assert probe(wk_port, "/readyz") == (200, {"ok": True, "reasons": {}})
    assert status_of(wk_port, "/livez") == 200
    # Text log lines, for humans: "<time> info    dueflow.worker: job.succeeded  job_id=..."
    text = worker.log()
    assert not worker.json_lines()
    for job_id in jobs:
        assert f"job.succeeded  job_id={job_id} queue={QUEUE} task=ok attempt=1" in text


# ------------------------------------------------------------------ traces


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(240)
def test_one_trace_per_job_from_schedule_through_retries_and_the_dlq(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    spans_file = tmp_path / "spans.jsonl"
    otel = {"OTEL_TRACES_EXPORTER": "jsonl", "DUEFLOW_TRACES_JSONL": str(spans_file)}
    em_port, wk_port = free_port(), free_port()
    emitter = p.emitter(em_port, env=otel)
    worker = p.worker(wk_port, env=otel)
    scrape_until(em_port, "an active emitter", lambda s: s.value("dueflow_emitter_leader") == 1)

    # The application's own span: schedule() is its child.
    sdk = JobTracer.from_env(otel, service_name="test-app", install_global=False)
    assert sdk.provider is not None
    app_tracer = sdk.provider.get_tracer("test-app")
    try:
        with app_tracer.start_as_current_span("handle-request") as request:
            jobs = schedule(p, {"ok": 1, "flaky": 1, "doomed": 1}, tracer=sdk)
    finally:
        sdk.close()
    request_id = format(request.get_span_context().span_id, "016x")
    by_task = {task: job for job, task in jobs.items()}
    outs = final_outcomes(p, jobs)

    # Every step of every job ends in a span; the worker writes them as attempts end.
    expected = {"ok": 3, "flaky": 4, "doomed": 5}  # schedule, fire, attempts, dead letter

    def all_spans() -> list[dict[str, Any]] | None:
        spans = read_spans(spans_file)
        counts = Counter(s["attributes"].get("dueflow.job_id") for s in spans)
        return spans if all(counts[by_task[t]] == k for t, k in expected.items()) else None

    spans = wait_for(f"the spans of every job\n{p.logs()}", all_spans, 60)
    dlq = read_topic(
        p.settings, names(p.settings).dlq(QUEUE), until=lambda r: len(r) >= 1, timeout=30
    )
    (dead_record,) = [codec.decode("dead_letter", r.value or b"") for r in dlq]

    for task, job_id in by_task.items():
        mine = [s for s in spans if s["attributes"].get("dueflow.job_id") == job_id]
        traces = {s["trace_id"] for s in mine}
        assert len(traces) == 1, f"{task}: one trace per job, got {traces}"
        (trace_id,) = traces
        named: dict[str, list[dict[str, Any]]] = {}
        for s in mine:
            named.setdefault(s["name"], []).append(s)
        (sched,) = named[SCHEDULE]
        (fire,) = named[FIRE]
        assert sched["parent_span_id"] == request_id  # child of the caller's span
        assert sched["service"] == "test-app"
        assert fire["parent_span_id"] == sched["span_id"]
        assert (fire["service"], fire["pid"]) == ("dueflow-emitter", emitter.pid)
        attempts = sorted(named[EXECUTE], key=lambda s: s["attributes"]["dueflow.attempt"])
        assert [a["attributes"]["dueflow.attempt"] for a in attempts] == list(
            range(1, len(attempts) + 1)
        )
        for i, a in enumerate(attempts):
            assert a["parent_span_id"] == fire["span_id"], "attempts are siblings under fire"
            assert (a["service"], a["pid"]) == ("dueflow-worker", worker.pid)
            links = [link["span_id"] for link in a["links"]]
            assert links == ([] if i == 0 else [attempts[i - 1]["span_id"]])
        statuses = [a["status"] for a in attempts]
        # Outcomes carry the trace id too.
        assert {o["trace_id"] for o in outs if o["job_id"] == job_id} == {trace_id}
        if task == "ok":
            assert statuses == ["unset"]
            assert DEAD_LETTER not in named
        elif task == "flaky":
            assert statuses == ["error", "unset"]
            assert DEAD_LETTER not in named
        else:
            assert statuses == ["error", "error"]
            (dead,) = named[DEAD_LETTER]
            assert dead["parent_span_id"] == fire["span_id"]
            assert [link["span_id"] for link in dead["links"]] == [attempts[-1]["span_id"]]
            assert dead["attributes"]["dueflow.reason"] == "exhausted"
            assert dead_record["job_id"] == job_id
            assert dead_record["trace_id"] == trace_id
        # The worker's log lines name the trace.
        job_lines = [e for e in worker.json_lines() if e.get("job_id") == job_id]
        assert job_lines
        assert {e["trace_id"] for e in job_lines} == {trace_id}
