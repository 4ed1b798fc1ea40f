"""The Python SDK's schema registry option against the real broker.

With ``producer.schema_registry_url`` pointing at a (fake) registry,
``Scheduler.schedule``, ``schedule_many``, ``AsyncScheduler`` and ``dueflow
schedule`` write Confluent-framed job values: job.avsc is registered once under
``<prefix>.timers-value``, every timer record starts with the magic byte and
that id and says ``dueflow.Job/1+confluent``, and a Python emitter and worker
run each job exactly once, never early, with its payload intact. A registry that
cannot be reached fails the first schedule with its URL, and nothing is written.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow import task
from dueflow.apps.cli.main import main
from dueflow.config import ProducerSettings, Settings
from dueflow.consumers import TaskContext, TaskRegistry
from dueflow.errors import SchemaRegistryError
from dueflow.kafka.topics import names
from dueflow.producers import AsyncScheduler, Scheduler
from dueflow.producers.schema_registry import job_schema_text
from dueflow.records.codec import decode_job_value
from dueflow.records.framing import unframe_job
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.worker_support import FAST_WORKER, WorkerThread, read_topic
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics, threaded_emitter
from tests.support.fake_registry import Registry, fake_registry

QUEUE = "framed"
RUNS: dict[str, list[tuple[int, Any]]] = {}


@task("registry.record", queue=QUEUE)
def record(payload: Any, ctx: TaskContext) -> None:
    RUNS.setdefault(ctx.job_id, []).append((time.time_ns() // 1_000_000, payload))


@pytest.fixture
def registry() -> Iterator[tuple[str, Registry]]:
    with fake_registry() as found:
        yield found


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str, registry: tuple[str, Registry]) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200]}],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
        producer={"schema_registry_url": registry[0], "schema_registry_timeout_s": 5},
    )
    ensure_topics(s)
    return s


def test_every_client_writes_framed_jobs_that_run_once_with_their_payload(
    settings: Settings,
    registry: tuple[str, Registry],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _url, reg = registry
    started = time.time_ns() // 1_000_000
    due: dict[str, int] = {}
    payloads: dict[str, Any] = {}
    with Scheduler(settings) as s:
        for i, (payload, delay) in enumerate([({"n": 1}, 0), (b"\x00raw\xff", 1.5), ([1, "é"], 3)]):
            got = s.schedule(
                "registry.record", payload, delay=delay, job_id=f"one-{i}", queue=QUEUE
            )
            due[got.job_id], payloads[got.job_id] = got.due_ms, payload
        # moved from 3 s to 6 s: the moved timer is framed too, and it runs at 6 s only
        moved = s.reschedule("one-2", delay=6, queue=QUEUE)
        assert moved.rescheduled, moved.reason
        due["one-2"] = moved.due_ms
        labelled = s.schedule(
            "registry.record", {"l": 1}, delay=1, labels={"team": "a"}, queue=QUEUE
        )
        due[labelled.job_id], payloads[labelled.job_id] = labelled.due_ms, {"l": 1}
        bulk = s.schedule_many(
            {"task": "registry.record", "payload": {"bulk": i}, "delay": i % 3, "queue": QUEUE}
            for i in range(20)
        )
        assert bulk.ok, bulk.errors
        for i, (job_id, due_ms) in enumerate(zip(bulk.job_ids, bulk.due_ms, strict=True)):
            assert job_id is not None
            assert due_ms is not None
            due[job_id], payloads[job_id] = due_ms, {"bulk": i}

    async def schedule_async() -> None:
        async with AsyncScheduler(settings) as a:
            got = await a.schedule(
                "registry.record", {"async": True}, delay=1, job_id="async-1", queue=QUEUE
            )
            due[got.job_id], payloads[got.job_id] = got.due_ms, {"async": True}

    asyncio.run(schedule_async())
    cli_env(monkeypatch, settings, _url)
    code = main(
        [
            "schedule",
            "registry.record",
            "--payload",
            '{"cli": 1}',
            "--delay",
            "1s",
            "--queue",
            QUEUE,
            "--job-id",
            "cli-1",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    due["cli-1"], payloads["cli-1"] = json.loads(out)["due_ms"], {"cli": 1}

    # job.avsc registered once per process, under the subject of the timer topic
    subject = f"{settings.topic_prefix}.timers-value"
    assert list(reg.subjects) == [subject]
    (schema_id,) = reg.subjects[subject]
    assert json.loads(reg.schemas[schema_id]) == json.loads(job_schema_text())
    assert [r[:2] for r in reg.requests] == [("POST", f"/subjects/{subject}/versions")]

    # every timer record is framed with that id and says so
    timers = read_topic(
        settings,
        names(settings).timers,
        until=lambda rs: len(rs) >= len(due) + 1,
    )
    mine = [(r.headers[hdr.JOB_ID].decode(), r) for r in timers]
    assert {job_id for job_id, _ in mine} == set(due)
    assert len(mine) == len(due) + 1  # one-2 twice: scheduled, then moved
    for job_id, rec in mine:
        assert rec.headers[hdr.SCHEMA] == b"dueflow.Job/1+confluent", job_id
        assert rec.value is not None
        assert rec.value[:5] == b"\x00" + schema_id.to_bytes(4, "big"), job_id
        assert unframe_job(rec.value, rec.headers[hdr.SCHEMA])[1:] == (b"dueflow.Job/1", schema_id)
        assert decode_job_value(rec.value, rec.headers[hdr.SCHEMA])["job_id"] == job_id

    # a Python emitter and worker run each once, not before its due time, payload intact
    with threaded_emitter(settings) as em, WorkerThread(settings, TaskRegistry([record])):
        em.wait_active()
        wait_for("every framed job ran", lambda: all(RUNS.get(j) for j in due), 60)
        ran = {j: RUNS[j] for j in due}
    for job_id, runs in ran.items():
        assert len(runs) == 1, (job_id, runs)
        at_ms, payload = runs[0]
        assert at_ms >= due[job_id] >= started, job_id
        assert payload == payloads[job_id], job_id


def test_an_unreachable_registry_fails_the_first_schedule_naming_its_url(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    unreachable = replace(
        settings, producer=ProducerSettings(schema_registry_url=url, schema_registry_timeout_s=2)
    )
    with Scheduler(unreachable) as s:
        with pytest.raises(SchemaRegistryError, match=url):
            s.schedule("registry.record", {"n": 1}, job_id="never", queue=QUEUE)
        with pytest.raises(SchemaRegistryError, match=url):
            s.schedule_many(
                [{"task": "registry.record", "payload": 1, "job_id": "never-2", "queue": QUEUE}]
            )
    cli_env(monkeypatch, settings, url)
    monkeypatch.setenv("DUEFLOW_PRODUCER_SCHEMA_REGISTRY_TIMEOUT_S", "2")
    code = main(["schedule", "registry.record", "--queue", QUEUE, "--job-id", "never-3"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert f"dueflow: schema registry at {url} (producer.schema_registry_url)" in err
    assert not [
        r
        for r in read_topic(settings, names(settings).timers, timeout=3)
        if r.headers.get(hdr.JOB_ID) in (b"never", b"never-2", b"never-3")
    ]


def cli_env(monkeypatch: pytest.MonkeyPatch, settings: Settings, registry_url: str) -> None:
    """The environment that points ``dueflow schedule`` at the test's topics and registry."""
    monkeypatch.setenv("DUEFLOW_BOOTSTRAP", settings.bootstrap)
    monkeypatch.setenv("DUEFLOW_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("DUEFLOW_QUEUES", f"{QUEUE}:3")
    monkeypatch.setenv("DUEFLOW_PRODUCER_SCHEMA_REGISTRY_URL", registry_url)
    for key, value in SMALL_WHEEL.items():
        monkeypatch.setenv(f"DUEFLOW_WHEEL_{key.upper()}", str(value))
