"""The status view as a process against a real broker: tables, HTTP, restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.kafka.clients import make_admin, make_consumer
from dueflow.kafka.topics import names
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.status_support import (
    ViewProcess,
    ensure_topics,
    outcome,
    start_view,
    write_outcomes,
)


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, queues="default:3")
    ensure_topics(s)
    return s


@pytest.fixture
def view(settings: Settings, tmp_path: Path) -> Iterator[ViewProcess]:
    proc = start_view(
        settings, port=free_port(), data_dir=tmp_path / "data", log_path=tmp_path / "view.log"
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _now() -> int:
    return int(time.time() * 1000)


@pytest.mark.timeout(150)
def test_folds_outcomes_and_answers_over_http(
    settings: Settings, view: ViewProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    t = _now()
    write_outcomes(
        settings,
        [
            outcome("job-a", "scheduled", at_ms=t, due_ms=t + 50),
            outcome("job-a", "fired", at_ms=t + 60),
            outcome("job-a", "started", at_ms=t + 70, attempt=1, worker="w1"),
            outcome(
                "job-a",
                "retrying",
                at_ms=t + 80,
                attempt=1,
                error_type="TimeoutError",
                error="smtp timed out",
            ),
            outcome("job-a", "started", at_ms=t + 1080, attempt=2),
            outcome("job-a", "succeeded", at_ms=t + 1090, attempt=2, duration_ms=9.5),
            outcome("job-b", "scheduled", at_ms=t, queue="default", task="report"),
        ],
    )
    # A record that is not an outcome: skipped and counted, the view goes on.
    topic = names(settings).outcomes
    p = Producer({"bootstrap.servers": settings.bootstrap})
    p.produce(topic, key=b"job-a", value=b"\xff\x00not avro")
    # An outcome inside an aborted transaction must never show (read_committed).
    tx = Producer({"bootstrap.servers": settings.bootstrap, "transactional.id": f"{topic}.t"})
    tx.init_transactions()
    tx.begin_transaction()
    rec = outcome("job-aborted", "succeeded", at_ms=t)
    tx.produce(
        topic,
        key=b"job-aborted",
        value=codec.encode("outcome", rec),
        headers=[(hdr.SCHEMA, codec.schema_header("outcome"))],
    )
    tx.flush(10)
    tx.abort_transaction()
    assert p.flush(10) == 0
    write_outcomes(settings, [outcome("job-c", "dead", at_ms=t + 5, attempt=4, error="x")])

    job = view.wait_job("job-a", "succeeded")
    view.wait_job("job-c", "dead")
    assert job["attempts"] == 2
    assert job["first_seen_ms"] == t
    assert job["due_ms"] == t + 50
    assert job["fired_ms"] == t + 60
    assert job["started_ms"] == t + 1080
    assert job["finished_ms"] == t + 1090
    assert job["duration_ms"] == 9.5
    assert job["worker"] == "w1"
    assert job["last_error"] == {
        "type": "TimeoutError",
        "message": "smtp timed out",
        "attempt": 1,
        "at_ms": t + 80,
    }
    assert [h[0] for h in job["history"]] == [
        "scheduled",
        "fired",
        "started",
        "retrying",
        "started",
        "succeeded",
    ]

    status, body = view.get("/jobs/job-aborted")
    assert status == 404
    assert body["job_id"] == "job-aborted"
    assert "unknown job id" in body["error"]

    status, queues = view.get("/queues")
    assert status == 200
    assert queues["queues"]["default"]["counts"] == {"succeeded": 1, "scheduled": 1, "dead": 1}
    assert queues["queues"]["default"]["total"] == 3

    status, metrics = view.get("/metrics")
    assert status == 200
    assert 'dueflow_records_skipped_total{component="status_view",reason="undecodable"} 1.0' in (
        metrics
    )
    assert 'dueflow_status_outcomes_total{state="started"} 2.0' in metrics
    assert 'dueflow_status_jobs{queue="default",state="succeeded"} 1.0' in metrics
    assert 'dueflow_dlq_depth{queue="default"} 0.0' in metrics
    assert 'dueflow_timers_pending{level="near"} 0.0' in metrics

    # The redrive button's endpoint: an empty DLQ redrives nothing.
    status, body = view.post("/dlq/default/redrive")
    assert status == 200
    assert body["items"] == []
    assert body["message"] == "0 redriven, 0 not redriven"
    assert view.post("/dlq/nope/redrive")[0] == 404

    status, page = view.get("/")
    assert status == 200
    assert "<title>dueflow status</title>" in page

    status, overview = view.get("/api/overview")
    assert status == 200
    assert [j["job_id"] for j in overview["recent_jobs"]][:1] == ["job-c"]
    assert {j["job_id"] for j in overview["recent_failures"]} == {"job-a", "job-c"}
    assert overview["cluster"]["dlq_depth"] == {"default": 0}

    # The commands ask the view when it runs.
    common = ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix]
    assert main(["status", *common, "--url", view.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "status-view"
    assert doc["queues"]["default"]["counts"] == {"succeeded": 1, "scheduled": 1, "dead": 1}
    assert main(["job", "job-a", *common, "--url", view.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "status-view"
    assert doc["job"]["state"] == "succeeded"
    assert main(["job", "job-zzz", *common, "--url", view.url]) == 1
    assert "job-zzz: unknown: no outcome found" in capsys.readouterr().out


@pytest.mark.timeout(150)
def test_a_jobs_progress_and_result_are_in_its_view(
    settings: Settings, view: ViewProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a worker writes for ctx.progress and a handler's return value (Outcome v3):
    /jobs/{id} has both, the overview's job list the progress but not the result
    (a result may be large), and dueflow job --result prints it."""
    t = _now()
    write_outcomes(
        settings,
        [
            outcome("job-p", "scheduled", at_ms=t),
            outcome("job-p", "started", at_ms=t + 1_000, attempt=1),
            outcome(
                "job-p",
                "started",
                at_ms=t + 2_000,
                attempt=1,
                progress=0.4,
                progress_detail=b'{"rows":40}',
            ),
        ],
    )
    running = view.wait_job("job-p", "started")
    assert (running["progress"], running["progress_detail"]) == (0.4, {"rows": 40})
    assert running["started_ms"] == t + 1_000
    common = ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix]
    assert main(["job", "job-p", *common, "--url", view.url]) == 0
    assert 'progress      40% {"rows":40}' in capsys.readouterr().out
    assert main(["job", "job-p", *common, "--url", view.url, "--result"]) == 1  # not ended

    write_outcomes(
        settings,
        [outcome("job-p", "succeeded", at_ms=t + 3_000, attempt=1, result=b'{"total":99}')],
    )
    done = view.wait_job("job-p", "succeeded")
    assert (done["result"], done["result_error"], done["progress"]) == ({"total": 99}, None, 0.4)
    status, overview = view.get("/api/overview")
    assert status == 200
    (listed,) = [j for j in overview["recent_jobs"] if j["job_id"] == "job-p"]
    assert listed["progress"] == 0.4
    assert "result" not in listed
    capsys.readouterr()
    assert main(["job", "job-p", *common, "--url", view.url, "--result"]) == 0
    assert json.loads(capsys.readouterr().out) == {"total": 99}


@pytest.mark.timeout(200)
def test_table_survives_a_restart_from_its_changelog(settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    first = start_view(settings, port=port, data_dir=tmp_path / "d1", log_path=tmp_path / "1.log")
    t = _now()
    try:
        first.wait_ready()
        write_outcomes(
            settings,
            [
                outcome("job-r", "scheduled", at_ms=t),
                outcome("job-r", "started", at_ms=t + 10, attempt=1),
                outcome("job-s", "succeeded", at_ms=t + 20, attempt=1),
            ],
        )
        first.wait_job("job-r", "started")
        first.wait_job("job-s", "succeeded")
    finally:
        code = first.stop()
    assert code == 0, f"SIGTERM must stop the view cleanly:\n{first.log()}"

    # Remove every outcome record: after this only the changelog can bring them back.
    topic = names(settings).outcomes
    consumer = make_consumer(settings, "probe")
    ends = []
    for p in range(settings.outcomes_partitions):
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        ends.append(TopicPartition(topic, p, high))
    consumer.close()
    admin = make_admin(settings)  # keep a reference: the futures die with the client
    for fut in admin.delete_records(ends, request_timeout=10).values():
        fut.result(timeout=20)

    second = start_view(settings, port=port, data_dir=tmp_path / "d2", log_path=tmp_path / "2.log")
    try:
        second.wait_ready()
        status, job = second.get("/jobs/job-r")
        assert status == 200, f"job lost across the restart:\n{second.log()}"
        assert job["state"] == "started"
        assert job["first_seen_ms"] == t
        assert second.get("/queues")[1]["queues"]["default"]["counts"] == {
            "started": 1,
            "succeeded": 1,
        }
        # and it goes on from there
        write_outcomes(settings, [outcome("job-r", "succeeded", at_ms=t + 30, attempt=1)])
        job = second.wait_job("job-r", "succeeded")
        assert [h[0] for h in job["history"]] == ["scheduled", "started", "succeeded"]
        assert second.get("/queues")[1]["queues"]["default"]["counts"] == {"succeeded": 2}
    finally:
        assert second.stop() == 0


@pytest.mark.timeout(150)
def test_finished_jobs_leave_the_table_after_the_retention(
    settings: Settings, tmp_path: Path
) -> None:
    # Long enough for the checks below on a loaded machine (a fresh-clone run saw
    # 1.5 s pass before the first of them: the job was swept already).
    env = {"DUEFLOW_OBSERVABILITY_STATUS_RETENTION_MS": "6000"}
    port = free_port()
    first = start_view(
        settings, port=port, data_dir=tmp_path / "d1", log_path=tmp_path / "1.log", env=env
    )
    try:
        first.wait_ready()
        t = _now()  # the outcomes' time: the retention counts from here
        year = 365 * 86_400_000
        write_outcomes(
            settings,
            [
                outcome("done", "succeeded", at_ms=t, attempt=1),
                outcome("busy", "started", at_ms=t, attempt=1),
                # scheduled long ago, due in ten years: pending, never swept
                outcome("waiting", "scheduled", at_ms=t - year, due_ms=t + 10 * year),
            ],
        )
        first.wait_job("done", "succeeded")  # (each partition is folded as it is fetched)
        first.wait_job("busy", "started")
        first.wait_job("waiting", "scheduled")
        asking = replace(
            settings, observability=replace(settings.observability, status_url=first.url)
        )
        with Scheduler(asking) as s:
            done = s.status("done")
            assert done is not None
            assert (done.state, done.source) == ("succeeded", "status-view")
            deadline = time.monotonic() + 30
            while first.get("/jobs/done")[0] != 404:
                assert time.monotonic() < deadline, f"finished job never swept:\n{first.log()}"
                time.sleep(0.2)
            assert s.status("done") is None, "gone after the retention"
            waiting = s.status("waiting")
            assert waiting is not None
            assert (waiting.state, waiting.due_ms) == ("scheduled", t + 10 * year)
        assert first.get("/jobs/busy")[0] == 200, "unfinished jobs stay"
        assert first.get("/queues")[1]["queues"]["default"]["counts"] == {
            "started": 1,
            "scheduled": 1,
        }
    finally:
        assert first.stop() == 0
    second = start_view(
        settings, port=port, data_dir=tmp_path / "d2", log_path=tmp_path / "2.log", env=env
    )
    try:
        second.wait_ready()
        assert second.get("/jobs/done")[0] == 404, "the removal is in the changelog"
        assert second.get("/jobs/busy")[0] == 200
        assert second.get("/jobs/waiting")[0] == 200
        assert second.get("/queues")[1]["queues"]["default"]["counts"] == {
            "started": 1,
            "scheduled": 1,
        }
    finally:
        assert second.stop() == 0


@pytest.mark.timeout(90)
def test_refuses_to_bind_beyond_loopback_without_a_token(
    settings: Settings, tmp_path: Path
) -> None:
    """192.0.2.1 (TEST-NET-1) is beyond loopback: without a configured token the view
    exits at once with an error naming the setting, before it touches Kafka or binds
    (no interface here has that address, so even a view that tried binds nothing)."""
    view = start_view(
        settings,
        port=free_port(),
        data_dir=tmp_path / "data",
        log_path=tmp_path / "view.log",
        bind="192.0.2.1",
        token=None,
    )
    try:
        code = view.proc.wait(60)
    finally:
        view.stop()
    log = view.log()
    assert code == 2, log
    assert "setting 'observability.status_token'" in log
    assert "DUEFLOW_OBSERVABILITY_STATUS_TOKEN" in log
    assert "'192.0.2.1'" in log
    assert "Traceback" not in log
    assert not (tmp_path / "data").exists(), "it stopped before doing anything"
