"""The DLQ commands against a real broker and a running worker: list, show, redrive, purge.

Jobs of a task that fails until the test lets it succeed end in the DLQ;
the test redrives them through the CLI (once, twice, from two processes at
the same time) and checks in its ledger that each ran exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.errors import PermanentJobError
from dueflow.kafka.topics import names
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    Ledger,
    WorkerThread,
    outcomes_of,
    read_topic,
    wait_for,
    worker_settings,
)

QUEUE = "jobs"
ROOT = Path(__file__).resolve().parents[2]


class Fragile:
    """A task that fails permanently while ``broken`` holds its key."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.broken: set[str] = set()
        self.lock = threading.Lock()

    def registry(self) -> TaskRegistry:
        @task("fragile", queue=QUEUE)
        def fragile(_payload: object, ctx: TaskContext) -> None:
            self.ledger.run(ctx.idempotency_key, ctx.attempt)
            with self.lock:
                if ctx.idempotency_key in self.broken:
                    raise PermanentJobError(f"{ctx.idempotency_key} is broken")
            self.ledger.effect(ctx.idempotency_key)

        return TaskRegistry([fragile])


def settings_for(kafka: KafkaCluster, prefix: str) -> Settings:
    return worker_settings(
        kafka, prefix, queues=[{"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200]}]
    )


def cli(kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    code = main(
        [
            "dlq",
            *args,
            "--queue",
            QUEUE,
            "--json",
            *kafka.cli_options(prefix),
            "--queues",
            f"{QUEUE}:3",
        ]
    )
    out = capsys.readouterr().out
    return code, orjson.loads(out)


def dead_letters(kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]) -> Any:
    code, doc = cli(kafka, prefix, capsys, "list", "--limit", "0")
    assert code == 0
    return doc["entries"]


@pytest.mark.timeout(240)
def test_list_show_redrive_once_even_twice_and_from_two_processes_then_purge(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    fragile = Fragile(ledger)
    keys = [f"k{i}" for i in range(4)]
    fragile.broken.update(keys)
    writer = ExecWriter(settings)
    writer.write(make_job("fragile", {"i": i}, queue=QUEUE, key=k) for i, k in enumerate(keys))
    writer.flush()
    with WorkerThread(settings, fragile.registry(), queues=[QUEUE]):
        wait_for("4 dead letters", lambda: len(dead_letters(kafka, prefix, capsys)) == 4, 60)
        entries = {e["idempotency_key"]: e for e in dead_letters(kafka, prefix, capsys)}
        assert {e["reason"] for e in entries.values()} == {"permanent_error"}
        code, filtered = cli(kafka, prefix, capsys, "list", "--task", "other")
        assert filtered["matched"] == 0
        code, shown = cli(kafka, prefix, capsys, "show", entries["k0"]["ref"])
        assert shown["error_type"].endswith("PermanentJobError")
        assert "k0 is broken" in shown["traceback"] or "k0 is broken" in shown["error_message"]
        assert shown["job"]["idempotency_key"] == "k0"

        fragile.broken.clear()
        # Dry run: says what would go, writes nothing.
        code, dry = cli(
            kafka, prefix, capsys, "redrive", "--ref", entries["k0"]["ref"], "--dry-run"
        )
        assert (code, dry["redriven"], dry["items"][0]["why"]) == (0, 0, "dry run: would redrive")
        # Twice in a row: the second finds the key's death cleared.
        code, first = cli(kafka, prefix, capsys, "redrive", "--ref", entries["k0"]["ref"])
        assert (code, first["redriven"]) == (0, 1)
        code, second = cli(kafka, prefix, capsys, "redrive", "--ref", entries["k0"]["ref"])
        assert second["redriven"] == 0
        assert second["items"][0]["why"].startswith("already redriven")
        wait_for("k0 to run again", lambda: ledger.effects().get("k0") == 1, 60)

        # Two processes at once, on the same two records.
        refs = [entries["k1"]["ref"], entries["k2"]["ref"]]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "dueflow", "dlq", "redrive", "--queue", QUEUE, "--json"]
        for ref in refs:
            args += ["--ref", ref]
        args += ["--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--queues", f"{QUEUE}:3"]
        procs = [
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        wait_for("k1 and k2", lambda: {"k1", "k2"} <= set(ledger.effects()), 60)
        redriven = 0
        for proc, (out, err) in zip(procs, outs, strict=True):
            if proc.returncode == 0:
                redriven += orjson.loads(out)["redriven"]
            else:  # fenced by the other run, or found nothing left to do
                assert b"took over" in err or b"redrive" in out + err, (out, err)
        assert redriven == 2

        # After it ran: "already ... done".
        code, after = cli(kafka, prefix, capsys, "redrive", "--ref", entries["k1"]["ref"])
        assert after["items"][0]["why"] == "already redriven and done"

        # Died again after a redrive: only the newer DLQ record may be redriven.
        fragile.broken.add("k3")
        code, again = cli(kafka, prefix, capsys, "redrive", "--job-id", entries["k3"]["job_id"])
        assert again["redriven"] == 1
        wait_for("k3's second death", lambda: len(dead_letters(kafka, prefix, capsys)) == 5, 60)
        fragile.broken.clear()
        code, stale = cli(kafka, prefix, capsys, "redrive", "--ref", entries["k3"]["ref"])
        assert "died again" in stale["items"][0]["why"]
        code, newer = cli(kafka, prefix, capsys, "redrive", "--job-id", entries["k3"]["job_id"])
        assert newer["redriven"] == 1
        wait_for("k3", lambda: ledger.effects().get("k3") == 1, 60)

    # Every job ran exactly once more than its failures; effects once each.
    assert ledger.effects() == dict.fromkeys(keys, 1)
    runs = Counter(k for k, *_ in ledger.runs())
    assert runs == {"k0": 2, "k1": 2, "k2": 2, "k3": 3}
    n = names(settings)
    redriven_records = [
        r for r in read_topic(settings, n.exec(QUEUE)) if hdr.REDRIVEN_BY in r.headers
    ]
    assert len(redriven_records) == 5
    for r in redriven_records:
        assert r.headers[hdr.ATTEMPT] == b"1"
        assert r.headers[hdr.REDRIVEN_FROM].startswith(n.dlq(QUEUE).encode() + b":")
        assert r.partition == int(r.headers[hdr.REDRIVEN_FROM].split(b":")[1])
    succeeded = Counter(
        o["idempotency_key"]
        for o in outcomes_of(read_topic(settings, n.outcomes))
        if o["state"] == "succeeded"
    )
    assert succeeded == dict.fromkeys(keys, 1)

    # Purge: shown without --yes, then done.
    code, plan = cli(kafka, prefix, capsys, "purge", "--all")
    assert (code, plan["deleted"], plan["records"]) == (1, False, 5)
    assert len(dead_letters(kafka, prefix, capsys)) == 5
    code, done = cli(kafka, prefix, capsys, "purge", "--all", "--yes")
    assert (code, done["deleted"], done["records"]) == (0, True, 5)
    assert dead_letters(kafka, prefix, capsys) == []
