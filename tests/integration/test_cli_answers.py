"""What the one-shot commands answer, on the real broker with the real emitter and
worker: ``dueflow job`` of a job that ran (fired, started) and of one nothing fires,
``dueflow status`` without log lines, ``dlq list`` after a redrive, a dry run's
counts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dueflow import PermanentJobError, task
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry
from dueflow.producers import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.worker_support import FAST_WORKER, WorkerThread
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    ensure_topics,
    threaded_emitter,
)

QUEUE = "answers"


RUNS_S = 0.2  # each run of the handler
STAMP_SLACK_MS = 50


class Started:
    """Wall ms at which the handler started, by job id; the jobs listed in ``broken``
    fail for good (thread-safe)."""

    def __init__(self) -> None:
        self.at: dict[str, int] = {}
        self.broken: set[str] = set()
        self.lock = threading.Lock()

    def registry(self) -> TaskRegistry:
        @task("note", queue=QUEUE)
        def note(_payload: object, ctx: TaskContext) -> None:
            with self.lock:
                self.at.setdefault(ctx.job_id, time.time_ns() // 1_000_000)
                if ctx.job_id in self.broken:
                    raise PermanentJobError("broken for now")
            time.sleep(RUNS_S)  # started and finished far enough apart to tell

        return TaskRegistry([note])


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 2, "retry_tiers_ms": [200]}],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(s)
    return s


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line sees the test's cluster, queues and wheel."""
    wheel = settings.wheel
    values = {
        "DUEFLOW_BOOTSTRAP": settings.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": settings.topic_prefix,
        "DUEFLOW_QUEUES": f"{QUEUE}:2",
        "DUEFLOW_WHEEL_LEVELS": SMALL_WHEEL["levels"],
        "DUEFLOW_WHEEL_NEAR_PARTITIONS": str(wheel.near_partitions),
        "DUEFLOW_WHEEL_NEAR_WINDOW_MS": str(wheel.near_window_ms),
        "DUEFLOW_WHEEL_LOOKAHEAD_MS": str(wheel.lookahead_ms),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def started() -> Started:
    return Started()


@pytest.fixture
def pipeline(settings: Settings, started: Started) -> Iterator[None]:
    with threaded_emitter(settings) as em, WorkerThread(settings, started.registry()):
        em.wait_active()
        yield


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """``dueflow ARGV`` in this process: (exit code, stdout (JSON with --json), stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    got = capsys.readouterr()
    out: Any = json.loads(got.out) if "--json" in argv and got.out.strip() else got.out
    return code, out, got.err


NO_VIEW = ("--url", "http://127.0.0.1:9")  # no status view there: Kafka directly


def test_job_shows_when_a_job_that_ran_was_fired_and_started(
    settings: Settings,
    pipeline: None,
    cli_env: None,
    started: Started,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Scheduler(settings) as s:
        job = s.schedule("note", queue=QUEUE, delay="1s")
        wait_for(
            "the job's outcome",
            lambda: (st := s.status(job.job_id)) is not None and st.state == "succeeded",
            30,
        )
    code, doc, _ = cli(capsys, "job", job.job_id, *NO_VIEW, "--json")
    assert code == 0
    view = doc["job"]
    ran_at = started.at[job.job_id]
    assert job.due_ms - AHEAD_MS <= view["fired_ms"] <= ran_at  # df-fired, ahead at most
    # the worker's start: its outcome's time less the handler's duration. Outcome
    # times are stamped with the latest the broker's clock can read (the worker's
    # clock probe), which can be a few ms past the handler's own wall clock.
    assert abs(view["started_ms"] - ran_at) <= STAMP_SLACK_MS
    assert view["finished_ms"] - view["started_ms"] >= RUNS_S * 1000
    assert view["started_ms"] <= view["finished_ms"]
    code, text, _ = cli(capsys, "job", job.job_id, *NO_VIEW)
    lines = dict(line.split(None, 1) for line in text.splitlines() if line[:1].isalpha())
    assert lines["fired"].strip() != "-"
    assert lines["started"].strip() != "-"


def test_a_job_nothing_fires_says_that_no_emitter_is_active(
    settings: Settings, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with Scheduler(settings) as s:  # no emitter runs
        job = s.schedule("note", queue=QUEUE, delay="0s")
    wait_for(
        "the job to be overdue",
        lambda: time.time_ns() // 1_000_000 >= job.due_ms + 5_000,
        10,
    )
    code, text, _ = cli(capsys, "job", job.job_id, *NO_VIEW)
    assert code == 0
    assert "scheduled (pending: not started)" in text
    assert "no emitter is active" in text
    assert "`dueflow emitter`" in text
    code, doc, _ = cli(capsys, "job", job.job_id, *NO_VIEW, "--json")
    assert "no emitter is active" in doc["note"]


def test_status_answers_without_log_lines(
    settings: Settings, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # a registered queue: reading the registry logged "queue registered" (info)
    code, _, err = cli(capsys, "queue", "create", "extra", "--partitions", "1")
    assert code == 0, err
    code, out, err = cli(capsys, "status", *NO_VIEW)
    assert code == 0
    assert out.startswith("source: kafka")
    assert "{" not in out
    assert "queue registered" not in err
    code, out, err = cli(capsys, "status", *NO_VIEW, "--log-level", "INFO")
    assert "queue registered" in err  # asked for


def test_dlq_list_marks_what_became_of_a_redriven_dead_letter(
    settings: Settings,
    pipeline: None,
    cli_env: None,
    started: Started,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Scheduler(settings) as s:
        job = s.schedule("note", queue=QUEUE, job_id="fragile-1")
        started.broken.add(job.job_id)

        def listed() -> list[dict[str, Any]]:
            code, doc, _ = cli(capsys, "dlq", "list", "--queue", QUEUE, "--json")
            assert code == 0
            return list(doc["entries"])

        (entry,) = wait_for("the dead letter", listed, 30)
        assert entry["state"] == "dead"

        code, out, _ = cli(capsys, "dlq", "redrive", "--queue", QUEUE, "--all", "--dry-run")
        assert code == 0
        assert "would be redriven" in out
        assert "dry run, nothing written: 1 would be redriven, 0 would be skipped" in out
        code, doc, _ = cli(
            capsys, "dlq", "redrive", "--queue", QUEUE, "--all", "--dry-run", "--json"
        )
        assert (doc["redriven"], doc["would_redrive"]) == (0, 1)

        started.broken.clear()
        code, out, _ = cli(capsys, "dlq", "redrive", "--queue", QUEUE, "--all")
        assert code == 0
        assert "1 redriven, 0 skipped" in out
        wait_for(
            "the redriven job to succeed",
            lambda: (st := s.status(job.job_id)) is not None and st.state == "succeeded",
            30,
        )
    (entry,) = listed()
    assert entry["state"] == "redriven, done"
    code, text, _ = cli(capsys, "dlq", "list", "--queue", QUEUE)
    header, _, row, *_ = text.splitlines()
    assert header.split()[-1] == "now"
    assert row.endswith("redriven, done")
