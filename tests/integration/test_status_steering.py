"""The status view follows steered jobs on the real broker: the verdicts the
partition owner writes for commands (Outcome v3) move, update and cancel the
job's view, a refused command changes nothing, and a client waiting on
``GET /jobs/{id}?wait_ms=&until=final`` is answered when the job is cancelled."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.producers import Scheduler
from dueflow.producers.steering_commands import command_records
from dueflow.producers.view_client import ViewClient
from dueflow.steering_model import Command
from dueflow.timeutil import from_utc_ms
from tests.conftest import KafkaCluster
from tests.integration.status_support import ViewProcess, ensure_topics, start_view
from tests.integration.steering_support import (
    RunLedger,
    finalize_when_workers_joined,
    ledger_task,
)
from tests.integration.worker_support import FAST_WORKER, WorkerThread, wait_for

QUEUE = "steer"
CENTURY_MS = 100 * 365 * 86_400_000
DAY_MS = 86_400_000


@pytest.fixture
def view_port() -> int:
    return free_port()


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str, view_port: int) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200]}],
        worker=FAST_WORKER,
        observability={"status_url": f"http://127.0.0.1:{view_port}"},
    )
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


def _send(settings: Settings, cmd: Command) -> None:
    producer = make_producer(settings, **{"linger.ms": 0})
    for rec in command_records(names(settings), cmd, partitions=settings.queue(QUEUE).partitions):
        produce: Any = producer.produce  # headers: bytes values
        produce(rec.topic, rec.value, rec.key, rec.partition, headers=rec.headers)
    assert producer.flush(30) == 0


def _view_of(view: ViewProcess, job_id: str, done: Any, what: str) -> dict[str, Any]:
    """The view's record of ``job_id`` once ``done(record)`` holds."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        code, body = view.get(f"/jobs/{job_id}")
        seen.clear()
        if code == 200:
            seen.update(body)
        return code == 200 and bool(done(body))

    wait_for(what, check, timeout=60)
    return seen


@pytest.mark.timeout(300)
def test_the_view_follows_the_owners_verdicts_on_commands(
    settings: Settings, view: ViewProcess, tmp_path: Path
) -> None:
    ledger = RunLedger(tmp_path / "runs.db")
    with WorkerThread(settings, ledger_task(ledger, queue=QUEUE)) as worker:
        finalize_when_workers_joined(settings, QUEUE)
        wait_for("the worker to own its partitions", lambda: worker.assigned() > 0)
        with Scheduler(settings) as s:
            due = int(time.time() * 1000) + CENTURY_MS
            job = s.schedule("steered", {"i": 1}, queue=QUEUE, run_at=from_utc_ms(due))
            view.wait_job(job.job_id, "scheduled", timeout_s=60)

            moved = s.reschedule(job.job_id, run_at=from_utc_ms(due + DAY_MS), wait=30)
            assert moved.verdict == "rescheduled", moved.message
            v = _view_of(
                view,
                job.job_id,
                lambda r: (r.get("last_command") or {}).get("command_id") == moved.command_id,
                "the move's verdict in the view",
            )
            assert (v["state"], v["due_ms"], v["version"]) == (
                "rescheduled",
                due + DAY_MS,
                moved.command_id,
            )
            assert v["last_command"]["outcome"] == "rescheduled"
            st = s.status(job.job_id)
            assert st is not None
            assert (st.state, st.due_ms, st.source, st.complete) == (
                "rescheduled",
                due + DAY_MS,
                "status-view",
                True,
            )
            assert st.extra["version"] == moved.command_id

            updated = s.update(job.job_id, payload={"i": 2}, wait=30)
            assert updated.verdict == "updated", updated.message
            v = _view_of(
                view,
                job.job_id,
                lambda r: (r.get("last_command") or {}).get("command_id") == updated.command_id,
                "the update's verdict in the view",
            )
            assert (v["state"], v["due_ms"], v["version"]) == (
                "updated",
                due + DAY_MS,
                updated.command_id,
            )

            # A command the owner refuses (it expects another version): nothing changes.
            refused_id = uuid.uuid4().hex
            _send(
                settings,
                Command(
                    command_id=refused_id,
                    op="move",
                    job_id=job.job_id,
                    idempotency_key=job.idempotency_key,
                    queue=QUEUE,
                    at_ms=int(time.time() * 1000),
                    expect_version="not-its-version",
                    due_ms=due + 2 * DAY_MS,
                ),
            )
            v = _view_of(
                view,
                job.job_id,
                lambda r: (r.get("last_command") or {}).get("command_id") == refused_id,
                "the refusal in the view",
            )
            assert (v["state"], v["due_ms"], v["version"]) == (
                "updated",
                due + DAY_MS,
                updated.command_id,
            )
            assert v["last_command"]["outcome"] == "refused"
            assert "not-its-version" in v["last_command"]["error"]
            assert v["last_error"] is None

            # A client waiting for the job's end through the view is answered when
            # the cancel's verdict is folded.
            client = ViewClient.from_settings(settings)
            answers: list[dict[str, Any] | None] = []
            waiting = threading.Thread(
                target=lambda: answers.append(client.job(job.job_id, wait_ms=60_000, until="final"))
            )
            waiting.start()
            try:
                cancelled = s.cancel(job.job_id, wait=30)
            finally:
                waiting.join(90)
                client.close()
            assert cancelled.verdict == "cancelled", cancelled.message
            [answer] = answers
            assert answer is not None
            assert answer["state"] == "cancelled"
            assert answer["last_command"]["command_id"] == cancelled.command_id
            final = s.status(job.job_id)
            assert final is not None
            assert (final.state, final.pending, final.finished) == ("cancelled", False, True)
    assert ledger.runs() == []
