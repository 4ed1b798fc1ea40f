"""``dueflow replay`` against a real broker and a running worker.

The incident replayed here: a queue's consumer offsets were moved past jobs
that never ran. A replay of the time range runs exactly those; the jobs that
were done are skipped by idempotency. A retry record replayed early still
waits for its ``df-due``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.consumers import TaskRegistry
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.producers.steering_commands import command_records
from dueflow.records import codec
from dueflow.steering_model import Command
from dueflow.timeutil import format_utc
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    Ledger,
    WorkerThread,
    ledger_registry,
    outcomes_of,
    read_topic,
    wait_for,
    worker_settings,
)

QUEUE = "jobs"


def _registry(ledger: Ledger) -> TaskRegistry:
    return ledger_registry(ledger, name="note", queue=QUEUE)


def _skip_to_end(settings: Settings) -> None:
    """The incident: the worker group's offsets moved to the end, past unread jobs."""
    n = names(settings)
    consumer = Consumer(
        settings.client_config(**{"group.id": n.worker_group(QUEUE), "enable.auto.commit": False})
    )
    try:
        tps = []
        for p in range(settings.queue(QUEUE).partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(n.exec(QUEUE), p), 10)
            tps.append(TopicPartition(n.exec(QUEUE), p, high))
        consumer.commit(offsets=tps, asynchronous=False)
    finally:
        consumer.close()


def _replay(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str], *args: str
) -> Any:
    capsys.readouterr()
    code = main(
        [
            "replay",
            *args,
            "--json",
            *kafka.cli_options(prefix),
            "--queues",
            f"{QUEUE}:3",
        ]
    )
    assert code == 0
    return orjson.loads(capsys.readouterr().out)


@pytest.mark.timeout(180)
def test_replay_runs_what_never_ran_and_skips_what_is_done(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = worker_settings(kafka, prefix, queues=[{"name": QUEUE, "partitions": 3}])
    n = names(settings)
    ledger = Ledger(tmp_path / "ledger.db")
    started = time.time_ns() // 1_000_000
    writer = ExecWriter(settings)
    writer.write(make_job("note", {}, queue=QUEUE, key=f"done-{i}") for i in range(6))
    writer.flush()
    with WorkerThread(settings, _registry(ledger), queues=[QUEUE]):
        wait_for("the first jobs", lambda: len(ledger.effects()) == 6, 60)
    writer.write(make_job("note", {}, queue=QUEUE, key=f"lost-{i}") for i in range(4))
    # a command in the range: applied when first read, never replayed
    cmd = Command(uuid.uuid4().hex, "cancel", "other-job", "other-key", QUEUE, started)
    (rec,) = command_records(n, cmd, partitions=3)
    writer.write_raw(QUEUE, rec.key, rec.value, rec.headers, partition=rec.partition or 0)
    writer.flush()
    _skip_to_end(settings)  # the lost jobs will never be read

    topic = n.exec(QUEUE)
    dry = _replay(kafka, prefix, capsys, "--topic", topic, "--from", "5m", "--dry-run")
    assert (dry["records"], dry["commands_skipped"]) == (10, 1)
    assert dry["replayed"] == 0
    assert len(read_topic(settings, topic)) == 11  # nothing written

    with WorkerThread(settings, _registry(ledger), queues=[QUEUE]):
        done = _replay(
            kafka, prefix, capsys, "--topic", topic, "--from", format_utc(started - 1000)
        )
        assert done["replayed"] == 10
        wait_for("the lost jobs", lambda: len(ledger.effects()) == 10, 60)
    assert set(ledger.effects().values()) == {1}
    assert Counter(k for k, *_ in ledger.runs()) == {
        **{f"done-{i}": 1 for i in range(6)},
        **{f"lost-{i}": 1 for i in range(4)},
    }
    records = [
        r for r in read_topic(settings, topic) if not hdr.is_command(list(r.headers.items()))
    ]
    originals = {(r.partition, r.offset): r for r in records if hdr.REPLAYED_FROM not in r.headers}
    copies = [r for r in records if hdr.REPLAYED_FROM in r.headers]
    assert len(copies) == 10
    for c in copies:
        t, p, o = c.headers[hdr.REPLAYED_FROM].decode().rsplit(":", 2)
        original = originals[(int(p), int(o))]
        assert (t, c.partition, c.key, c.value) == (
            topic,
            original.partition,
            original.key,
            original.value,
        )
        assert c.headers[hdr.DUE] == original.headers[hdr.DUE]


@pytest.mark.timeout(120)
def test_a_replayed_retry_record_keeps_its_due_time(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = worker_settings(kafka, prefix, queues=[{"name": QUEUE, "partitions": 1}])
    n = names(settings)
    ledger = Ledger(tmp_path / "ledger.db")
    key = f"retry-{uuid.uuid4().hex[:6]}"
    job = make_job("note", {}, queue=QUEUE, key=key)
    due = time.time_ns() // 1_000_000 + 4_000
    headers = hdr.replace(exec_headers(job), [(hdr.ATTEMPT, 2), (hdr.DUE, due)])
    retry_topic = n.retry(QUEUE, 1000)
    producer = make_producer(settings)
    produce: Callable[..., None] = producer.produce
    produce(retry_topic, codec.encode("job", job.to_record()), key.encode(), 0, headers=headers)
    producer.flush(30)
    out = _replay(kafka, prefix, capsys, "--topic", retry_topic, "--from", "0")
    assert out["replayed"] == 1
    with WorkerThread(settings, _registry(ledger), queues=[QUEUE]):
        wait_for("the retry", lambda: key in ledger.effects(), 30)
        read_topic(  # the copy is skipped: outcome "duplicate"
            settings,
            n.outcomes,
            until=lambda rs: any(o["state"] == "duplicate" for o in outcomes_of(rs)),
        )
    (run,) = ledger.runs()  # the copy was skipped: the key was done
    assert run[1] == 2
    assert run[2] * 1000 >= due
