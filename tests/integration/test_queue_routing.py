"""Queues created while everything runs, and jobs routed to them by task name.

Against the real broker, with a running emitter and worker: a queue created
with ``dueflow queue create`` (or a registry record any Kafka client writes)
is picked up by the SDK, the emitter and the worker without a restart; a job
scheduled by task name alone goes to the queue its ``@task`` (or the route
table) names, and runs; a job for a queue that does not exist is refused with
a message that says how to create it; static and registered specs merge (the
registry wins, the conflict is reported); a malformed registry record is
quarantined once and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.apps.ops.queue_admin import topics_of
from dueflow.config import QueueSpec, Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.errors import UnknownQueue
from dueflow.kafka.topics import names
from dueflow.producers import AsyncScheduler
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from dueflow.records.queue_registry import QueueConflict, encode_queue
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    FAST_WORKER,
    Ledger,
    WorkerThread,
    read_topic,
    wait_for,
)
from tests.support.emitters import (
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    emitter_env,
    ensure_topics,
    threaded_emitter,
)

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.routing_app"


def _settings(kafka: KafkaCluster, prefix: str, **overrides: Any) -> Settings:
    return kafka.settings(
        prefix,
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
        **{"queues": "default:1", **overrides},
    )


def _cli(kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    code = main([*args, "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix])
    out = capsys.readouterr()
    return code, out.out, out.err


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            doc = orjson.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def _quarantined(settings: Settings) -> list[dict[str, Any]]:
    records = read_topic(settings, names(settings).quarantine, timeout=5)
    return [codec.decode("quarantined", r.value) for r in records if r.value is not None]


@contextlib.contextmanager
def _worker_process(
    settings: Settings, ledger: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    env = emitter_env(
        settings,
        {
            "DUEFLOW_TEST_LEDGER": str(ledger),
            "PYTHONPATH": str(ROOT),
            "DUEFLOW_WORKER_SESSION_TIMEOUT_MS": "3000",
            "DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "50",
        },
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dueflow", "worker", "--app", APP],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.timeout(240)
def test_a_queue_created_while_everything_runs_gets_the_jobs_routed_to_it_by_task_name(
    kafka: KafkaCluster,
    prefix: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings(kafka, prefix)
    ensure_topics(settings)
    for key, value in emitter_env(settings).items():  # the CLI commands' settings too
        if key.startswith("DUEFLOW_"):
            monkeypatch.setenv(key, value)
    ledger = Ledger(tmp_path / "ledger.db")
    emitter = EmitterSubprocess(settings, tmp_path / "emitter.log").start()
    try:
        with (
            _worker_process(settings, ledger.path, tmp_path / "worker.log") as worker,
            Scheduler(settings, app=APP) as scheduler,
        ):
            # The worker serves the queues its tasks name; billing does not exist yet.
            def started() -> list[dict[str, Any]]:
                return [
                    e
                    for e in _events(tmp_path / "worker.log")
                    if e.get("event") == "worker started"
                ]

            wait_for("the worker to start", lambda: bool(started()), 60)
            (start,) = started()
            assert sorted(start["waiting_for"]) == ["billing", "shipping"]

            # Refused at the SDK, naming the queue and how to create it; nothing written.
            with pytest.raises(UnknownQueue) as refused:
                scheduler.schedule("charge", {"n": 0})
            assert "got 'billing'" in str(refused.value)
            assert "`dueflow queue create billing --partitions N`" in str(refused.value)
            # The CLI resolves the route the same way, and refuses the same way.
            code, _, err = _cli(kafka, prefix, capsys, "schedule", "charge", "--app", APP)
            assert code == 2
            assert "dueflow queue create billing --partitions N" in err

            code, out, err = _cli(
                kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "2"
            )
            assert code == 0, err
            # The running client follows the registry: no restart, no explicit queue.
            wait_for("the scheduler to see billing", lambda: "billing" in scheduler.queues, 30)
            job = scheduler.schedule("charge", {"n": 1})
            assert job.queue == "billing"
            code, out, err = _cli(
                kafka, prefix, capsys, "schedule", "charge", "--app", APP, "--json"
            )
            assert code == 0, err
            by_cli = orjson.loads(out)
            assert by_cli["queue"] == "billing"

            wait_for(
                "both jobs to run on billing",
                lambda: ledger.effects() == {job.job_id: 1, by_cli["job_id"]: 1},
                60,
            )
            assert worker.poll() is None
        worker_events = _events(tmp_path / "worker.log")
        served = [e for e in worker_events if e.get("event") == "queue registered: serving it now"]
        assert [e["queue"] for e in served] == ["billing"]
        emitter_events = emitter.events()
        assert any(
            e.get("event") == "emitter fires into new queues" and e.get("queues") == ["billing"]
            for e in emitter_events
        )
        assert emitter.alive()
    finally:
        emitter.stop()
    assert _quarantined(settings) == []  # no timer was set aside for an unknown queue


def _garbage_then(settings: Settings, spec: QueueSpec) -> None:
    """What any Kafka client may write: a malformed registry record, then a valid one
    (after the queue's topics, as the registry's contract asks)."""
    from dueflow.kafka.clients import make_admin
    from dueflow.kafka.topic_admin import TopicAdmin

    admin = TopicAdmin(make_admin(settings), replication_factor=1)
    assert admin.ensure(topics_of(settings, spec)).ok
    producer = Producer(settings.client_config())
    topic = names(settings).queues
    schema = [(hdr.SCHEMA, codec.schema_header("queue"))]
    raw: Any = producer.produce  # headers: list[tuple[str, bytes]]
    raw(topic, b"\x00\x01not avro", spec.name.encode(), headers=schema)
    key, value, headers = encode_queue(spec, created_ms=1, created_by="a raw client")
    raw(topic, value, key, headers=headers)
    assert producer.flush(10) == 0


@pytest.mark.timeout(180)
def test_a_registry_record_any_client_writes_is_picked_up_and_a_malformed_one_quarantined(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    settings = _settings(kafka, prefix)
    ensure_topics(settings)
    ledger = Ledger(tmp_path / "ledger.db")

    @task("ship", queue="shipping")
    def ship(_payload: object, ctx: TaskContext) -> None:
        ledger.effect(ctx.idempotency_key)

    registry = TaskRegistry([ship])
    with (
        threaded_emitter(settings) as emitter,
        WorkerThread(settings, registry) as worker,
        Scheduler(settings, app=registry) as scheduler,
    ):
        emitter.wait_active()
        assert worker.worker.waiting == ["shipping"]
        _garbage_then(settings, QueueSpec("shipping", 1, (500,)))
        # Followed by every process (no lookup: the tails read it).
        wait_for("the scheduler to see shipping", lambda: "shipping" in scheduler.queues, 30)
        wait_for("the worker to serve shipping", lambda: worker.worker.waiting == [], 30)
        assert scheduler.queues.get("shipping") == QueueSpec("shipping", 1, (500,))
        job = scheduler.schedule("ship")
        assert job.queue == "shipping"

        async def from_asyncio() -> str:
            async with AsyncScheduler(settings, app=registry) as aio:
                with pytest.raises(UnknownQueue):
                    await aio.schedule("ship", queue="shipping-typo")
                return (await aio.schedule("ship")).job_id

        second = asyncio.run(from_asyncio())
        wait_for("the jobs to run", lambda: ledger.effects() == {job.job_id: 1, second: 1}, 60)

        def quarantined() -> list[dict[str, Any]]:
            return [q for q in _quarantined(settings) if q["source_topic"] == f"{prefix}.queues"]

        wait_for("the bad record to be quarantined", lambda: bool(quarantined()), 30)
        (bad,) = quarantined()  # once, by the active emitter (not by every process)
        assert bad["source_offset"] == 0
        assert bad["component"] == "emitter"
        assert "bad queue registry record" in bad["reason"]
        assert bad["value"] == b"\x00\x01not avro"
        assert emitter.process is not None
        assert emitter.process.queues.view.get("shipping") == QueueSpec("shipping", 1, (500,))


@pytest.mark.timeout(180)
def test_static_queues_bootstrap_and_merge_with_the_registry_which_wins(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The registry says billing has 2 partitions; this deployment's static config says 4.
    code, _, err = _cli(kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "2")
    assert code == 0, err
    settings = _settings(
        kafka,
        prefix,
        queues=[{"name": "default", "partitions": 1}, {"name": "billing", "partitions": 4}],
        routes={"audit.*": "billing"},  # the route table sends audit.* to billing
    )
    ensure_topics(
        _settings(kafka, prefix, queues="default:1")  # the static default queue's topics
    )
    ledger = Ledger(tmp_path / "ledger.db")

    @task("audit.write")  # declared for default: the route table wins
    def audit(_payload: object, ctx: TaskContext) -> None:
        ledger.effect(ctx.idempotency_key)

    @task("note")
    def note(_payload: object, ctx: TaskContext) -> None:
        ledger.effect(ctx.idempotency_key)

    registry = TaskRegistry([audit, note])
    with (
        threaded_emitter(settings) as emitter,
        WorkerThread(settings, registry) as worker,
        Scheduler(settings, app=registry) as scheduler,
    ):
        emitter.wait_active()
        specs = {r.queue: r.spec for r in worker.worker.runtimes}
        assert specs == {"billing": QueueSpec("billing", 2), "default": QueueSpec("default", 1)}
        assert list(scheduler.queues.conflicts) == [QueueConflict("billing", "partitions", 4, 2)]
        routed = scheduler.schedule("audit.write")
        static = scheduler.schedule("note")  # a static-only queue still works
        assert (routed.queue, static.queue) == ("billing", "default")
        wait_for(
            "both jobs to run",
            lambda: ledger.effects() == {routed.job_id: 1, static.job_id: 1},
            60,
        )
