"""Status by id against the real broker: Scheduler.status, AsyncScheduler.status and
``dueflow job`` answer any job through the status view (pending a century out,
running, finished, older than the scan window), the view's job file survives a
restart without re-reading the changelog and is made again when deleted, and
without the view the SDK falls back to the scan and says it may be incomplete."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from dueflow.apps.cli.main import main
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.errors import ConflictError
from dueflow.kafka.clients import make_consumer, make_producer
from dueflow.kafka.topics import names
from dueflow.producers.aio import AsyncScheduler
from dueflow.producers.scheduler import Scheduler
from dueflow.rules.job_status import JobStatus
from dueflow.rules.partitioning import partition_for_key
from tests.conftest import KafkaCluster
from tests.integration.status_support import (
    ViewProcess,
    ensure_topics,
    outcome,
    start_view,
    write_outcomes,
)

CENTURY = datetime(2126, 6, 1, tzinfo=UTC)
SCAN_LIMIT = 500  # the scan window of these tests' clients (the default is 200,000)
FILLER = 1_500  # outcome records written after the old job, in its partition


def _now() -> int:
    return int(time.time() * 1000)


def _settings(kafka: KafkaCluster, prefix: str, url: str) -> Settings:
    return kafka.settings(prefix, queues="default:3", observability={"status_url": url})


@pytest.fixture
def view_port() -> int:
    return free_port()


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str, view_port: int) -> Settings:
    s = _settings(kafka, prefix, f"http://127.0.0.1:{view_port}")
    ensure_topics(s)
    return s


@pytest.fixture
def view(settings: Settings, view_port: int, tmp_path: Path) -> Iterator[ViewProcess]:
    proc = start_view(
        settings, port=view_port, data_dir=tmp_path / "data", log_path=tmp_path / "view.log"
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _write_filler(settings: Settings, partition: int, count: int) -> list[str]:
    """Outcomes of ``count`` other jobs whose ids hash to ``partition``: they push an
    older job of that partition out of the scan window. Returns their ids."""
    from dueflow import headers as hdr
    from dueflow.records import codec

    t = _now()
    ids: list[str] = []
    n = 0
    while len(ids) < count:
        job_id = f"filler-{n}"
        n += 1
        if partition_for_key(job_id.encode(), settings.outcomes_partitions) == partition:
            ids.append(job_id)
    producer = make_producer(settings, **{"linger.ms": 20})
    topic = names(settings).outcomes
    for i, job_id in enumerate(ids):
        rec = outcome(job_id, "succeeded", at_ms=t, attempt=1)
        producer.produce(
            topic,
            key=job_id.encode(),
            value=codec.encode("outcome", rec),
            headers=[(hdr.SCHEMA, codec.schema_header("outcome"))],
        )
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return ids


def _three_ways(
    settings: Settings,
    kafka: KafkaCluster,
    capsys: pytest.CaptureFixture[str],
    job_id: str,
    **client: Any,
) -> tuple[JobStatus | None, JobStatus | None, dict[str, Any]]:
    """The job as Scheduler.status, AsyncScheduler.status and `dueflow job --json` see it."""
    with Scheduler(settings, **client) as s:
        sync = s.status(job_id)

    async def from_asyncio() -> JobStatus | None:
        async with AsyncScheduler(settings, **client) as a:
            return await a.status(job_id)

    aio = asyncio.run(from_asyncio())
    capsys.readouterr()
    main(
        [
            "job",
            job_id,
            *kafka.cli_options(settings.topic_prefix),
            "--url",
            settings.observability.status_base_url,
            "--scan-limit",
            str(SCAN_LIMIT),
            "--json",
        ]
    )
    return sync, aio, json.loads(capsys.readouterr().out)


@pytest.mark.timeout(240)
def test_any_job_is_answered_through_the_view(
    settings: Settings,
    kafka: KafkaCluster,
    view: ViewProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:
    t = _now()
    with Scheduler(settings, status_scan_limit=SCAN_LIMIT) as s:
        far = s.schedule("remind", {"user": 42}, run_at=CENTURY, job_id="job-far")
        # read-your-writes: asked at once, the job this client just wrote is known
        mine = s.status(far.job_id)
    assert mine is not None
    assert (mine.state, mine.due_ms, mine.pending) == ("scheduled", far.due_ms, True)
    assert mine.source in ("status-view", "client")

    old = "job-old"
    write_outcomes(
        settings,
        [
            outcome(old, "scheduled", at_ms=t - 1000, due_ms=t + 10 * 365 * 86_400_000),
            outcome("job-running", "scheduled", at_ms=t, due_ms=t),
            outcome("job-running", "started", at_ms=t + 5, attempt=1, worker="w-1"),
            outcome("job-done", "scheduled", at_ms=t, due_ms=t),
            outcome("job-done", "succeeded", at_ms=t + 9, attempt=1, duration_ms=3.5),
        ],
    )
    old_partition = partition_for_key(old.encode(), settings.outcomes_partitions)
    filler = _write_filler(settings, old_partition, FILLER)
    view.wait_job(filler[-1], "succeeded", timeout_s=90)
    view.wait_job("job-far", "scheduled")

    expected = {
        "job-far": ("scheduled", far.due_ms),
        "job-running": ("started", t),
        "job-done": ("succeeded", t),
        old: ("scheduled", t + 10 * 365 * 86_400_000),
    }
    for job_id, (state, due_ms) in expected.items():
        sync, aio, cli = _three_ways(settings, kafka, capsys, job_id, status_scan_limit=SCAN_LIMIT)
        for got in (sync, aio):
            assert got is not None, job_id
            assert (got.state, got.due_ms, got.source, got.complete) == (
                state,
                due_ms,
                "status-view",
                True,
            ), job_id
        assert cli["source"] == "status-view", job_id
        assert (cli["job"]["state"], cli["job"]["due_ms"]) == (state, due_ms), job_id
    running = _three_ways(settings, kafka, capsys, "job-running")[0]
    assert running is not None
    assert running.extra["worker"] == "w-1"

    # The old job is beyond what the scan reads: only the view finds it.
    dead_view = _settings(kafka, settings.topic_prefix, f"http://127.0.0.1:{free_port()}")
    with Scheduler(dead_view, status_scan_limit=SCAN_LIMIT) as s:
        assert s.status(old) is None
        scanned = s.status(filler[-1])  # its partition's newest: in the window
    assert scanned is not None
    assert (scanned.state, scanned.source, scanned.complete) == ("succeeded", "kafka-scan", False)

    # A job nobody wrote: unknown, without a scan.
    with Scheduler(settings) as s:
        assert s.status("no-such-job") is None

    # Another process reusing the id: the view knows the job's content hash.
    with Scheduler(settings, check_existing_ids=True) as s:
        again = s.schedule("remind", {"user": 42}, run_at=CENTURY, job_id="job-far")
        assert (again.duplicate, again.due_ms) == (True, far.due_ms)
    with (
        Scheduler(settings, check_existing_ids=True) as s,
        pytest.raises(ConflictError, match="already exists with other content"),
    ):
        s.schedule("remind", {"user": 43}, run_at=CENTURY, job_id="job-far")


@pytest.mark.timeout(120)
def test_without_the_view_the_sdk_scans_and_says_the_answer_may_be_incomplete(
    kafka: KafkaCluster,
    prefix: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _settings(kafka, prefix, f"http://127.0.0.1:{free_port()}")  # nobody there
    ensure_topics(settings)
    t = _now()
    write_outcomes(settings, [outcome("job-old", "scheduled", at_ms=t, due_ms=t + 1)])
    partition = partition_for_key(b"job-old", settings.outcomes_partitions)
    recent = _write_filler(settings, partition, SCAN_LIMIT + 10)[-1]
    with caplog.at_level(logging.WARNING, logger="dueflow.producers"):
        sync, aio, cli = _three_ways(settings, kafka, capsys, recent, status_scan_limit=SCAN_LIMIT)
        with Scheduler(settings, status_scan_limit=SCAN_LIMIT) as s:
            assert s.status("job-old") is None
    for got in (sync, aio):
        assert got is not None
        assert (got.state, got.source, got.complete) == ("succeeded", "kafka-scan", False)
    assert (cli["source"], cli["found"], cli["complete"]) == ("kafka", True, False)
    assert "did not answer" in cli["status_view_error"]
    # (the CLI run configures dueflow's logging: what follows it goes to stderr)
    logged = " ".join(r.getMessage() for r in caplog.records) + capsys.readouterr().err
    assert "status view did not answer" in logged
    assert "job not found by the outcomes scan: the answer may be incomplete" in logged

    capsys.readouterr()
    code = main(
        [
            "job",
            "job-old",
            *kafka.cli_options(prefix),
            "--url",
            settings.observability.status_base_url,
            "--scan-limit",
            str(SCAN_LIMIT),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "the status view did not answer" in out
    assert "the answer may be incomplete" in out


def _restored(view: ViewProcess) -> float:
    status, text = view.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith("dueflow_status_changelog_restored_total "):
            return float(line.split()[1])
    raise AssertionError("no dueflow_status_changelog_restored_total in /metrics")


def _changelog_records(settings: Settings, app_id: str) -> int:
    """Records in the jobs changelog (end offsets minus start offsets, every partition)."""
    topic = f"{app_id}-jobs-changelog"
    consumer = make_consumer(settings, "probe")
    try:
        total = 0
        for p in range(settings.outcomes_partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


@pytest.mark.timeout(300)
def test_a_restart_reads_only_newer_changelog_records_and_a_lost_file_is_made_again(
    settings: Settings, view_port: int, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    app_id = f"{settings.topic_prefix}.status"
    job_file = data / f"{app_id}.jobs.sqlite"
    t = _now()
    jobs = 120
    records = []
    for i in range(jobs):
        records.append(outcome(f"j{i}", "scheduled", at_ms=t + i, due_ms=t + 86_400_000 * 365))
        if i % 3 == 0:
            records.append(outcome(f"j{i}", "succeeded", at_ms=t + i + 1, attempt=1))
    finished = len(range(0, jobs, 3))
    expected_counts = {"scheduled": jobs - finished, "succeeded": finished}

    def start(log: str) -> ViewProcess:
        proc = start_view(settings, port=view_port, data_dir=data, log_path=tmp_path / log)
        proc.wait_ready()
        return proc

    def check(proc: ViewProcess) -> None:
        for i in (0, 1, jobs - 1):
            want = "succeeded" if i % 3 == 0 else "scheduled"
            status, body = proc.get(f"/jobs/j{i}")
            assert (status, body.get("state")) == (200, want), proc.log()
        assert proc.get("/queues")[1]["queues"]["default"]["counts"] == expected_counts

    first = start("1.log")
    try:
        write_outcomes(settings, records)
        # Every job, not the last one written: outcomes are folded as their
        # partitions are fetched, in no order across partitions.
        for i in range(jobs):
            first.wait_job(f"j{i}", "succeeded" if i % 3 == 0 else "scheduled")
        assert _restored(first) == 0  # a new file and an empty changelog
    finally:
        assert first.stop() == 0, first.log()
    assert job_file.exists()
    deadline = time.monotonic() + 30
    while (in_changelog := _changelog_records(settings, app_id)) < jobs:
        assert time.monotonic() < deadline, f"{in_changelog} changelog records for {jobs} jobs"
        time.sleep(0.2)

    second = start("2.log")
    try:
        check(second)
        assert _restored(second) == 0, "a clean stop wrote everything: nothing re-read"
        more = [outcome(f"k{i}", "scheduled", at_ms=t, due_ms=t + 1) for i in range(30)]
        write_outcomes(settings, more)
        for i in range(30):
            second.wait_job(f"k{i}", "scheduled")
        # killed: what was acknowledged but not written is read again, nothing more
        os.kill(second.proc.pid, signal.SIGKILL)
        second.proc.wait(30)
    finally:
        second.stop()
    expected_counts["scheduled"] += 30

    third = start("3.log")
    try:
        check(third)
        assert third.get("/jobs/k29")[0] == 200
        assert _restored(third) <= 30 + 1, "at most what came after the last write"
    finally:
        assert third.stop() == 0, third.log()

    in_changelog = _changelog_records(settings, app_id)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{job_file}{suffix}").unlink(missing_ok=True)
    fourth = start("4.log")
    try:
        check(fourth)
        assert fourth.get("/jobs/k29")[0] == 200
        rebuilt = _restored(fourth)
        assert jobs + 30 <= rebuilt <= in_changelog, "made again from the whole changelog"
        loaded = [
            json.loads(line)
            for line in (tmp_path / "4.log").read_text().splitlines()
            if '"status.job_file_loaded"' in line
        ]
        assert [e["records"] for e in loaded] == [rebuilt], "in bulk, before faust's recovery"
    finally:
        assert fourth.stop() == 0, fourth.log()
    assert job_file.exists()
