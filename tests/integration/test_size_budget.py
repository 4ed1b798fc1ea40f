"""No single record stops the pipeline: the size budget against the real broker.

A job whose records could not all be written is refused at the door (SDK, CLI),
saying by how much and where. A record that is too large anyway (written by
another client, or a limit lowered later) is set aside with a reason, and the
jobs behind it run on time: the emitter quarantines it, a worker dead-letters
it with its traceback trimmed or its value by reference, and redrive runs it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from dueflow.apps.cli.main import main
from dueflow.apps.ops.dlq import DlqFilter
from dueflow.apps.ops.redrive import Redriver
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topics import names
from dueflow.producers import AsyncScheduler, Scheduler
from dueflow.records import codec
from dueflow.records.job_request import JobRequest
from dueflow.records.record_size import record_size
from dueflow.records.size_budget import VALUE_REF, RecordTooLarge
from tests.conftest import KafkaCluster
from tests.integration.worker_support import FAST_WORKER, Ledger, WorkerThread, read_topic
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    emitter_env,
    ensure_topics,
    threaded_emitter,
    wait_until,
)
from tests.support.timers import ExecLog, now_ms, timer_record

DEFAULT_LIMIT = 1_048_588


def _settings(kafka: KafkaCluster, prefix: str, queues: Any = "default:2,other:2") -> Settings:
    s = kafka.settings(
        prefix, queues=queues, wheel=SMALL_WHEEL, emitter=FAST_EMITTER, worker=FAST_WORKER
    )
    ensure_topics(s)
    return s


def set_topic_config(settings: Settings, topic: str, key: str, value: str) -> None:
    """Change one topic config and wait until the broker reports it."""
    admin = make_admin(settings)
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (fut,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        if fut.result()[key].value == value:
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} {key} did not become {value}")


def quarantined(settings: Settings, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    records = read_topic(
        settings,
        names(settings).quarantine,
        until=lambda got: len(got) >= count,
        timeout=timeout_s,
    )
    return [codec.decode("quarantined", r.value or b"") for r in records]


# ------------------------------------------------------------------ the door


@pytest.mark.timeout(120)
def test_a_payload_whose_records_would_not_fit_is_refused_by_the_sdk_and_the_cli(
    kafka: KafkaCluster,
    prefix: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings(kafka, prefix)
    exec_topic = names(settings).exec("default")
    with Scheduler(settings) as s:
        with pytest.raises(RecordTooLarge) as refused:
            s.schedule("t", b"B" * 1_048_000)
        text = str(refused.value)
        assert text.startswith("payload: got 1048000 bytes: the exec record would be ")
        assert f"bytes, over max.message.bytes {DEFAULT_LIMIT} of {exec_topic};" in text
        fits = refused.value.max_payload
        assert text.endswith(f"; accepted: at most {fits} bytes of payload")
        assert 1_040_000 < fits < 1_048_000
        # what it says fits, fits; a byte more does not (job ids as long as the one drawn)
        most = "m" * 32
        assert s.schedule("t", b"B" * fits, job_id=most).job_id == most
        with pytest.raises(RecordTooLarge):
            s.schedule("t", b"B" * (fits + 1), job_id="n" * 32)
        result = s.schedule_many(
            [JobRequest("t", b"B" * 1_048_000, job_id="big"), JobRequest("t", b"s", job_id="ok")]
        )
        assert result.scheduled == 1
        assert [e.index for e in result.errors] == [0]
        assert isinstance(result.errors[0].error, RecordTooLarge)
        # one describe_configs per queue, kept
        assert s.planner.budget_of("default") is s.planner.budget_of("default")

    async def scheduled_async() -> None:
        async with AsyncScheduler(settings) as a:
            with pytest.raises(RecordTooLarge, match="payload: got 1048000 bytes: the exec record"):
                await a.schedule("t", b"B" * 1_048_000, queue="other")

    asyncio.run(scheduled_async())

    payload = tmp_path / "big.json"
    payload.write_text('"' + "B" * 1_047_998 + '"')  # 1,048,000 bytes of JSON
    for key, value in emitter_env(settings).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(["schedule", "t", "--payload", f"@{payload}"])
    _out, err = capsys.readouterr()
    assert code == 2
    assert "payload: got 1048000 bytes: the exec record would be" in err
    assert f"of {exec_topic}; accepted: at most" in err

    keys = [r.key or b"" for r in read_topic(settings, names(settings).timers)]
    assert sorted(keys) == [b"m" * 32, b"ok"]  # nothing else was written


# ------------------------------------------------------------------ the emitter


def _big_timer(settings: Settings, key: str, due_ms: int) -> tuple[int, Any]:
    """Partition and headers of a timer for ``key`` (its value is the test's)."""
    part, _, _, headers = timer_record(settings, key, due_ms=due_ms, at_ms=now_ms())
    return part, headers


def _plain_producer(settings: Settings) -> Producer:
    return Producer(
        settings.client_config(**{"message.max.bytes": 8_000_000, "enable.idempotence": True})
    )


@pytest.mark.timeout(120)
def test_a_timer_too_large_to_fire_is_quarantined_and_the_jobs_behind_it_fire_on_time(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings = _settings(kafka, prefix)
    n = names(settings)
    # Another client may write a timer the timer topic takes but no exec topic would.
    set_topic_config(settings, n.timers, "max.message.bytes", "3000000")
    producer = _plain_producer(settings)
    log = ExecLog(settings, queues=("default", "other")).start()
    try:
        with threaded_emitter(settings) as em:
            em.wait_active()
            due = now_ms() + 1_000
            big_part, headers = _big_timer(settings, "big", due)
            producer.produce(n.timers, os.urandom(1_500_000), b"big", big_part, headers=headers)
            good: dict[str, int] = {}
            for i in range(40):  # behind it: in its partition, in the others, in two queues
                key, queue = f"good-{i}", ("default", "other")[i % 2]
                part, key_b, value, h = timer_record(
                    settings, key, due_ms=due + 10 * i, at_ms=now_ms(), queue=queue
                )
                producer.produce(n.timers, value, key_b, part, headers=list(h))
                good[key] = due + 10 * i
            assert producer.flush(30) == 0
            same = [k for k in good if zlib.crc32(k.encode()) % 2 == zlib.crc32(b"big") % 2]
            assert same, "some good timers share the big one's partition"
            log.wait_for(len(good), timeout_s=30)
            q = quarantined(settings, 1)
            assert (
                em.metric(
                    "dueflow_quarantined_total",
                    {"component": "emitter", "reason": "record too large"},
                )
                == 1
            )
            assert em.metric("dueflow_emitter_transactions_total", {"result": "aborted"}) == 0
        fired = {r.job_id: r for r in log.records}
        assert set(fired) == set(good)
        late = {k: fired[k].fired_ms - d for k, d in good.items()}
        assert all(-AHEAD_MS <= ms < 3_000 for ms in late.values()), late  # not stuck
        (record,) = q
        assert (record["component"], record["source_topic"]) == ("emitter", n.timers)
        assert record["key"] == b"big"
        reason = record["reason"]
        assert reason.startswith("record too large: the exec record would be 1500")
        assert f"over max.message.bytes {DEFAULT_LIMIT} of {n.exec('default')}" in reason
        # 1.5 MB does not fit the quarantine topic either: its start is kept, and said so
        assert "value truncated from 1500000 bytes" in reason
        assert 1_000_000 < len(record["value"]) < 1_500_000
    finally:
        log.close()


@pytest.mark.timeout(150)
def test_a_limit_lowered_after_the_emitter_started_quarantines_the_refused_record(
    kafka: KafkaCluster, prefix: str
) -> None:
    """The hot path compares with the limit it read; the broker refuses the record;
    the emitter reads the limits again and quarantines it on the retry, and goes on."""
    settings = _settings(kafka, prefix)
    n = names(settings)
    producer = _plain_producer(settings)
    log = ExecLog(settings).start()

    def write(key: str, due: int, value: bytes | None = None) -> None:
        part, key_b, job, headers = timer_record(settings, key, due_ms=due, at_ms=now_ms())
        out: Any = headers
        producer.produce(n.timers, job if value is None else value, key_b, part, headers=out)
        assert producer.flush(30) == 0

    try:
        with threaded_emitter(settings) as em:
            em.wait_active()
            write("first", now_ms() + 300)
            log.wait_for(1, timeout_s=20)  # the exec topic's limit is known now
            set_topic_config(settings, n.exec("default"), "max.message.bytes", "200000")
            due = now_ms() + 500
            write("refused", due, os.urandom(500_000))
            for i in range(10):
                write(f"after-{i}", due + 20 * i)
            expected = ["first", *(f"after-{i}" for i in range(10))]
            # (the records refused with the big one are fired again after the restart)
            log.wait_for_jobs(expected, timeout_s=40)
            q = quarantined(settings, 1)
            # the broker refused the write the hot path let through: the shard started over
            reason = "transaction aborted" if settings.emitter.transactional else "error"
            assert em.metric("dueflow_emitter_restarts_total", {"reason": reason}) >= 1
            assert em.process is not None
            assert em.process.session is not None  # still active
        fired = [r.job_id for r in log.records]
        if settings.emitter.transactional:
            assert sorted(fired) == sorted(expected)
        else:  # starting over fires again what its uncommitted slots held: workers skip copies
            assert set(fired) == set(expected)
        (record,) = q
        assert record["key"] == b"refused"
        assert record["reason"].startswith("record too large: the exec record would be 500")
        assert f"over max.message.bytes 200000 of {n.exec('default')}" in record["reason"]
    finally:
        log.close()


# ------------------------------------------------------------------ the worker


class Deep:
    """A task that fails with a deep traceback until ``heal`` is set."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.heal = threading.Event()

    def registry(self) -> TaskRegistry:
        @task("deep", queue="jobs")
        def deep(_payload: object, ctx: TaskContext) -> None:
            self.ledger.run(ctx.idempotency_key, ctx.attempt)
            if not self.heal.is_set():
                descend(400)
            self.ledger.effect(ctx.idempotency_key)

        return TaskRegistry([deep])


def descend(n: int) -> None:
    """Fails ``n`` frames down, through two functions by turns (so that Python does
    not fold the frames of its traceback into one line)."""
    if n == 0:
        raise ValueError("the card was declined " + "and the reason is long " * 50)
    descend_again(n - 1)


def descend_again(n: int) -> None:
    descend(n)


def _dead_letters(settings: Settings, count: int) -> list[Any]:
    return read_topic(
        settings,
        names(settings).dlq("jobs"),
        until=lambda got: len(got) >= count,
        timeout=60,
    )


JOBS = [{"name": "jobs", "partitions": 2, "retry_tiers_ms": [200]}]


@pytest.mark.timeout(180)
def test_a_near_limit_job_that_always_fails_is_dead_lettered_trimmed_and_redriven(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    settings = _settings(kafka, prefix, queues=JOBS)
    n = names(settings)
    # A cluster whose DLQ has no headroom over the exec topic (made before
    # `topics ensure` gave it some): the dead letter must be trimmed to fit.
    set_topic_config(settings, n.dlq("jobs"), "max.message.bytes", str(DEFAULT_LIMIT))
    deep = Deep(Ledger(tmp_path / "ledger.db"))
    with Scheduler(settings) as s:
        with pytest.raises(RecordTooLarge) as refused:
            s.schedule("deep", b"x" * 1_048_000, queue="jobs")
        fits = refused.value.max_payload
        assert "dead-letter record" in str(refused.value)  # the DLQ is the tightest hop
        s.schedule("deep", b"x" * fits, queue="jobs", job_id="near", max_attempts=1)
    with threaded_emitter(settings), WorkerThread(settings, deep.registry(), queues=["jobs"]):
        (dlq,) = _dead_letters(settings, 1)
        assert record_size(dlq.key, dlq.value, list(dlq.headers.items())) <= DEFAULT_LIMIT
        dead = codec.decode("dead_letter", dlq.value or b"")
        assert (dead["job_id"], dead["reason"]) == ("near", "exhausted")
        assert codec.decode("job", dead["job_value"])["payload"] == b"x" * fits  # whole
        tb = dead["traceback"]
        assert tb.startswith("[... ")
        assert f"cut to fit {n.dlq('jobs')} ...]" in tb
        assert tb.rstrip().endswith("and the reason is long")  # the end is kept
        assert "in descend_again" in tb
        assert len(tb) < 16_000  # less than the whole (a failure keeps at most 16,000)
        deep.heal.set()
        report = Redriver(settings, by="test").run("jobs", DlqFilter(job_ids=frozenset({"near"})))
        assert (report.redriven, report.error) == (1, None)
        wait_until(lambda: deep.ledger.effects().get("near") == 1, 60, "the redriven job to run")


@pytest.mark.timeout(180)
def test_a_dead_letter_that_keeps_the_value_by_reference_is_redriven_from_it(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    settings = _settings(kafka, prefix, queues=JOBS)
    n = names(settings)
    deep = Deep(Ledger(tmp_path / "ledger.db"))
    with Scheduler(settings) as s:
        for job_id in ("by-ref", "gone"):
            s.schedule("deep", b"x" * 600_000, queue="jobs", job_id=job_id, max_attempts=1)
    # lowered after the jobs were accepted: their dead letters cannot hold them
    set_topic_config(settings, n.dlq("jobs"), "max.message.bytes", "300000")
    with threaded_emitter(settings), WorkerThread(settings, deep.registry(), queues=["jobs"]):
        dead = {}
        for r in _dead_letters(settings, 2):
            d = codec.decode("dead_letter", r.value or b"")
            dead[d["job_id"]] = (r, d)
        for r, d in dead.values():
            assert record_size(r.key, r.value, list(r.headers.items())) <= 300_000
            assert d["job_value"] == b""
            ref = d["job_headers"][VALUE_REF].decode()
            assert ref.startswith(n.exec("jobs") + ":")
            assert r.headers[VALUE_REF].decode() == ref
        # the record the second one refers to is deleted (retention, or by hand)
        topic, part, off = dead["gone"][1]["job_headers"][VALUE_REF].decode().rsplit(":", 2)
        admin = make_admin(settings)
        for fut in admin.delete_records([TopicPartition(topic, int(part), int(off) + 1)]).values():
            fut.result()
        deep.heal.set()
        report = Redriver(settings, by="test").run("jobs", DlqFilter())
        assert report.error is None
        why = {i.entry.job_id: (i.redriven, i.why) for i in report.items}
        assert why["by-ref"] == (True, "")
        redriven, reason = why["gone"]
        assert not redriven
        assert f"kept by reference to {topic}:{part}:{off}, which is gone" in reason
        wait_until(lambda: deep.ledger.effects().get("by-ref") == 1, 60, "by-ref to run again")
    assert "gone" not in deep.ledger.effects()
