"""Exec records out of range, against the real broker and a CLI worker: refused at once.

The three findings of probing the worker from the outside with a plain Kafka
producer, each with good jobs written behind the bad records on the same
partition, which must all run:

- ``df-attempt`` >= 2**64: the job took a concurrency slot, then the JSON log
  line of its start raised (orjson: integer exceeds 64-bit range); with 40 of
  them the worker's 8 slots were gone and nothing of the queue ran again;
- ``df-due`` in the year 3000 on an exec record: its partition was held until
  then;
- a negative ``timeout_ms``: every attempt ran and timed out at once (the
  side effects repeated) and the job ended in the DLQ as ``timeout``.

Each bad record is now dead-lettered at once with reason ``out_of_range`` and
a message that names the field, never run; a redrive (attempt 1, due now)
runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.model import Job
from dueflow.reasons import OUT_OF_RANGE
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.worker_support import Ledger, ensure_topics, wait_for
from tests.support.worker_process import WorkerProcess, dead_by_key

QUEUE = "jobs"  # the queue of tests/integration/worker_app.py
TASK = "ledger-effect"  # no timeout of its own: the job's timeout_ms counts
YEAR_3000_MS = 32_503_680_000_000
GOOD = 12


def _settings(kafka: KafkaCluster, prefix: str) -> Settings:
    # one partition: every record, bad or good, is on it (the default retry tiers: the
    # worker process gets its queues as NAME:PARTITIONS)
    s = kafka.settings(prefix, queues=f"{QUEUE}:1")
    ensure_topics(s)
    return s


def _write(s: Settings, records: list[tuple[Job, list[tuple[str, bytes]]]]) -> None:
    writer = ExecWriter(s)
    for job, extra in records:
        headers = hdr.replace(exec_headers(job), extra)
        value = codec.encode("job", job.to_record())
        writer.write_raw(QUEUE, job.idempotency_key.encode(), value, headers, partition=0)
    writer.flush()


def _run(
    kafka: KafkaCluster,
    prefix: str,
    tmp_path: Path,
    bad: list[tuple[Job, list[tuple[str, bytes]]]],
    field: str,
    *,
    redrive: Callable[[], None] | None = None,
) -> None:
    """Write ``bad``, then good jobs, to one partition; the good ones all run once, the
    bad ones are in the DLQ as ``out_of_range`` naming ``field`` and never ran.
    ``redrive``: then redrive the DLQ; every bad one runs once."""
    s = _settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    good = [make_job(TASK, {}, queue=QUEUE, key=f"good-{i}") for i in range(GOOD)]
    worker = WorkerProcess(
        s,
        tmp_path / "worker.log",
        app="tests.integration.worker_app",
        queues=QUEUE,
        env={"DUEFLOW_WORKER_CONCURRENCY": "8", "DUEFLOW_TEST_LEDGER": str(ledger.path)},
    )
    try:
        _write(s, [*bad, *((job, []) for job in good)])
        wanted = {job.idempotency_key: 1 for job in good}
        wait_for(
            "the good jobs behind the bad records",
            lambda: {k: n for k, n in ledger.effects().items() if k in wanted} == wanted,
            90,
        )
        bad_keys = {job.idempotency_key for job, _ in bad}
        dead: dict[str, dict[str, Any]] = {}

        def all_dead() -> bool:
            dead.update(dead_by_key(s, QUEUE))
            return bad_keys <= set(dead)

        wait_for("the bad records in the DLQ", all_dead, 60)
        for key in bad_keys:
            assert dead[key]["reason"] == OUT_OF_RANGE, dead[key]
            assert dead[key]["error_type"] == "FieldOutOfRange"
            assert dead[key]["error_message"].startswith(f"{field}: "), dead[key]
            assert "accepted: " in dead[key]["error_message"]
            assert dead[key]["attempts"] == 0
        assert not any(k in bad_keys for k, *_ in ledger.runs())  # never ran
        assert ledger.effects() == wanted  # the good ones exactly once
        if redrive is not None:  # attempt 1, df-due now: an operator's way out
            redrive()
            wanted.update(dict.fromkeys(bad_keys, 1))
            wait_for("the redriven jobs", lambda: ledger.effects() == wanted, 90)
        assert worker.alive()
        assert "Traceback" not in worker.text()
    finally:
        worker.stop()


def _redrive_all(kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    options = [*kafka.cli_options(prefix), "--queues", f"{QUEUE}:1"]
    code = main(["dlq", "redrive", "--queue", QUEUE, "--all", "--json", *options])
    doc = orjson.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["redriven"] == 40, doc


@pytest.mark.timeout(240)
def test_records_with_an_attempt_past_64_bits_take_no_slot_and_the_queue_runs_on(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = [
        (make_job(TASK, {}, queue=QUEUE, key=f"huge-attempt-{i}"), [(hdr.ATTEMPT, b"%d" % 2**64)])
        for i in range(40)  # five times the worker's 8 slots
    ]
    _run(
        kafka,
        prefix,
        tmp_path,
        bad,
        hdr.ATTEMPT,
        redrive=lambda: _redrive_all(kafka, prefix, capsys),
    )


@pytest.mark.timeout(240)
def test_an_exec_record_due_in_the_year_3000_does_not_hold_its_partition(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    far = make_job(TASK, {}, queue=QUEUE, key="year-3000", due_ms=YEAR_3000_MS)
    _run(kafka, prefix, tmp_path, [(far, [])], hdr.DUE)


@pytest.mark.timeout(240)
def test_a_negative_timeout_from_the_wire_is_refused_and_never_run(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    negative = make_job(TASK, {}, queue=QUEUE, key="negative-timeout", timeout_ms=-5_000)
    _run(kafka, prefix, tmp_path, [(negative, [])], "timeout_ms")
