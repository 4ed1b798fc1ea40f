"""Pausing and resuming a queue: workers stop taking work, keep their group, resume.

The commands are run through the CLI (`dueflow queue pause|resume|list`);
the worker runs on a thread with handlers that write a ledger the test owns.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from dueflow.apps.cli.main import main
from dueflow.consumers import TaskRegistry
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.cluster_view import compute_view
from dueflow.kafka.topics import names
from dueflow.streams.status.cluster_reader import ClusterReader
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    Ledger,
    WorkerThread,
    ledger_registry,
    wait_for,
    worker_settings,
)

QUEUE = "jobs"
# How long "nothing happens" is watched: a paused worker would have run the
# jobs within a fraction of this.
QUIET_S = 3.0


def _registry(ledger: Ledger) -> TaskRegistry:
    return ledger_registry(ledger, name="note", queue=QUEUE)


def _cli(kafka: KafkaCluster, prefix: str, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = main(
        [*args, "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--queues", f"{QUEUE}:3"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _members(kafka: KafkaCluster, prefix: str) -> int:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    group = names(kafka.settings(prefix)).worker_group(QUEUE)
    desc = admin.describe_consumer_groups([group])[group].result(10)
    return sum(1 for m in desc.members if m.assignment and m.assignment.topic_partitions)


@pytest.mark.timeout(180)
def test_a_paused_queue_runs_nothing_until_resumed_and_its_worker_stays_in_the_group(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = worker_settings(kafka, prefix, queues=[{"name": QUEUE, "partitions": 3}])
    ledger = Ledger(tmp_path / "ledger.db")
    # Paused before the worker starts: it must not start a single job.
    out = _cli(kafka, prefix, "queue", "pause", QUEUE, "--reason", "maintenance", capsys=capsys)
    assert f"queue {QUEUE} paused" in out
    writer = ExecWriter(settings)
    writer.write(make_job("note", {}, queue=QUEUE, key=f"early-{i}") for i in range(10))
    writer.flush()
    with WorkerThread(settings, _registry(ledger), queues=[QUEUE]) as worker:
        (runtime,) = worker.worker.runtimes

        def paused() -> bool:
            return runtime.paused

        assert paused()
        wait_for("the worker to own its partitions", lambda: worker.assigned() > 0)
        time.sleep(QUIET_S)
        assert ledger.effects() == {}
        assert _members(kafka, prefix) == 1  # still a member, with partitions

        listed = orjson.loads(_cli(kafka, prefix, "queue", "list", "--json", capsys=capsys))
        (entry,) = listed["queues"]
        assert entry["paused"] is True
        assert entry["control"]["reason"] == "maintenance"
        with ClusterReader(settings) as reader:
            view = compute_view(reader.read(), settings)
        assert view.paused[QUEUE]["reason"] == "maintenance"

        _cli(kafka, prefix, "queue", "resume", QUEUE, capsys=capsys)
        wait_for("the early jobs", lambda: len(ledger.effects()) == 10, 60)
        assert not paused()

        # Paused while running: the jobs written now wait, then run once each.
        _cli(kafka, prefix, "queue", "pause", QUEUE, capsys=capsys)
        wait_for("the worker to see the pause", paused, 30)
        writer.write(make_job("note", {}, queue=QUEUE, key=f"late-{i}") for i in range(10))
        writer.flush()
        time.sleep(QUIET_S)
        assert len(ledger.effects()) == 10
        _cli(kafka, prefix, "queue", "resume", QUEUE, capsys=capsys)
        wait_for("the late jobs", lambda: len(ledger.effects()) == 20, 60)
    assert set(ledger.effects().values()) == {1}
    listed = orjson.loads(_cli(kafka, prefix, "queue", "list", "--json", capsys=capsys))
    assert listed["queues"][0]["paused"] is False


def test_pause_names_an_unknown_queue_and_writes_nothing(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["queue", "pause", "nope", "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix]
    )
    assert code == 2
    assert "nope" in capsys.readouterr().err
