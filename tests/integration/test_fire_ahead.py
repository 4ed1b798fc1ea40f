"""An emitter that fires ahead of the due time (``emitter.fire_ahead_ms``), on the
real broker: the worker starts each job at its due time, not before; the records
behind one fired ahead do not wait for it; and a job cancelled after its record
was written, before it is due, does not run, even when the worker was stopped
across the due time and reads the cancel after it (the lead fence).

The emitter fires 1 s ahead (the most it allows). Jobs ``ahead-*`` are due about
3 s after they are scheduled; once their exec records are written (a second
before they are due), the test cancels ``cancel-me`` (its record written too)
with a command as the SDK writes it, and schedules jobs due at once, which land
behind the records fired ahead in the same partitions. Every run is recorded
by the handler with its time.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.producers import JobRequest, Scheduler
from dueflow.producers.steering_commands import command_records
from dueflow.steering_model import Command
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, Proc, wait_for
from tests.integration.steering_support import finalize_when_workers_joined
from tests.integration.worker_support import (
    Ledger,
    Record,
    outcomes_of,
    read_topic,
    record_of,
)

AHEAD_MS = 1_000
AHEAD_JOBS = 12
NOW_JOBS = 9
APP = "tests.integration.worker_app"


@dataclass
class AheadRun:
    """An emitter firing 1 s ahead and a worker on the real broker, the queue
    finalized (its worker applies commands), and a producer for the commands."""

    pipeline: Pipeline
    exec_topic: str
    ledger: Ledger
    payload: dict[str, str]
    worker: Proc
    commands: Any


@contextmanager
def fired_ahead(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[AheadRun]:
    pipeline = Pipeline(kafka.bootstrap, prefix, tmp_path)
    exec_topic = names(pipeline.settings).exec(QUEUE)
    ledger = Ledger(tmp_path / "ledger.db")
    env = {"DUEFLOW_TEST_LEDGER": str(ledger.path), "DUEFLOW_EMITTER_FIRE_AHEAD_MS": str(AHEAD_MS)}
    try:
        pipeline.start("emitter", "emitter", env=env)
        worker = pipeline.start("worker", "worker", "--app", APP, "--queues", QUEUE, env=env)
        wait_for(
            "the worker and the emitter started",
            lambda: all("started" in p.log() for p in pipeline.procs),
            90,
        )
        finalize_when_workers_joined(pipeline.settings, QUEUE)  # cancels by command
        commands = make_producer(pipeline.settings, **{"linger.ms": 0})
        commands.list_topics(exec_topic, timeout=30)  # its metadata known before the race
        yield AheadRun(pipeline, exec_topic, ledger, {"ledger": str(ledger.path)}, worker, commands)
    finally:
        pipeline.stop_all()


def command_verdicts(pipeline: Pipeline, sent: dict[str, str]) -> dict[str, str]:
    """The state of each command's verdict outcome, by the key it was sent for."""
    outs = outcomes_of(read_topic(pipeline.settings, names(pipeline.settings).outcomes))
    by_command = {cid: key for key, cid in sent.items()}
    return {
        by_command[str(o["command_id"])]: str(o["state"])
        for o in outs
        if o.get("command_id") in by_command
    }


def send_cancels(
    pipeline: Pipeline, producer: Any, jobs: dict[str, tuple[str, int]]
) -> dict[str, str]:
    """A cancel command for each job (key -> job id, due), written as the SDK writes
    it; the command ids by key, once every one is acknowledged."""
    settings = pipeline.settings
    partitions = settings.queue(QUEUE).partitions
    sent: dict[str, str] = {}
    for key, (job_id, due_ms) in jobs.items():
        cancel = Command(
            command_id=uuid.uuid4().hex,
            op="cancel",
            job_id=job_id,
            idempotency_key=key,
            queue=QUEUE,
            at_ms=int(time.time() * 1000),
            known_due_ms=due_ms,
            due_ms=None,
        )
        for rec in command_records(names(settings), cancel, partitions=partitions):
            producer.produce(rec.topic, rec.value, rec.key, rec.partition, headers=rec.headers)
        sent[key] = cancel.command_id
    assert producer.flush(30) == 0
    return sent


def read_exec_until(pipeline: Pipeline, topic: str, keys: set[str]) -> list[Record]:
    """The records of ``topic`` read as they arrive, until one of each key is read."""
    consumer = Consumer(
        pipeline.settings.client_config(
            **{"group.id": f"reader-{uuid.uuid4().hex}", "enable.auto.commit": False}
        )
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Record] = []
        deadline = time.monotonic() + 60
        while {r.key.decode() for r in out if r.key} < keys:
            assert time.monotonic() < deadline, f"read {len(out)} records, not every key"
            for m in consumer.consume(100, 0.02):
                if m.error() is None:
                    out.append(record_of(m))
        return out
    finally:
        consumer.close()


@pytest.mark.timeout(240)
def test_jobs_fired_ahead_start_when_due_and_hold_nothing_back(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    with fired_ahead(kafka, prefix, tmp_path) as run:
        pipeline, exec_topic, ledger = run.pipeline, run.exec_topic, run.ledger
        payload = run.payload
        with Scheduler(pipeline.settings) as s:
            start = time.time()
            due: dict[str, int] = {}
            for i in range(AHEAD_JOBS):
                run_at = datetime.fromtimestamp(start + 3.0 + 0.2 * i / AHEAD_JOBS, tz=UTC)
                key = f"ahead-{i}"
                due[key] = s.schedule(
                    "ledger-effect", payload, run_at=run_at, queue=QUEUE, idempotency_key=key
                ).due_ms
            doomed = s.schedule(
                "ledger-effect",
                payload,
                run_at=datetime.fromtimestamp(start + 3.1, tz=UTC),
                queue=QUEUE,
                idempotency_key="cancel-me",
            )

            written = read_exec_until(pipeline, exec_topic, {*due, "cancel-me"})
            seen_ms = int(time.time() * 1000)
            first_due = min(due.values())
            assert seen_ms < first_due - 200, (
                f"the jobs' records were read {seen_ms - first_due} ms after the first was "
                "due: the emitter did not fire ahead"
            )
            # The cancel command, written as the SDK writes it (without the SDK's
            # lookup of the job on the way: the test has the lead, 1 s, to act in),
            # then the jobs due at once in one call.
            cancel = {"cancel-me": (doomed.job_id, doomed.due_ms)}
            sent = send_cancels(pipeline, run.commands, cancel)
            now_keys = [f"now-{i}" for i in range(NOW_JOBS)]
            result = s.schedule_many(
                [
                    JobRequest("ledger-effect", payload, queue=QUEUE, idempotency_key=key)
                    for key in now_keys
                ]
            )
            assert result.ok, result.to_json()
            now_due = {k: d for k, d in zip(now_keys, result.due_ms, strict=True) if d is not None}
        expected = set(due) | set(now_due)
        # (cancel-me was due before the last ahead-* job: it was decided by then)
        wait_for("every job's effect", lambda: set(ledger.effects()) == expected, 60)
        effects = ledger.effects()
        runs = ledger.runs()
        # the command's verdict: the job cancelled by it
        wait_for("the cancel's verdict", lambda: bool(command_verdicts(pipeline, sent)), 60)
        verdicts = command_verdicts(pipeline, sent)
    assert verdicts == {"cancel-me": "cancelled"}, verdicts

    ahead_partitions = {r.partition for r in written if r.key and r.key.startswith(b"ahead-")}
    stamps = {
        r.key.decode(): int(r.headers[hdr.FIRED])
        for r in written
        if r.key and hdr.FIRED in r.headers
    }
    for key, due_ms in due.items():
        assert due_ms - AHEAD_MS <= stamps[key] < due_ms, f"{key} written {stamps[key] - due_ms}"
    assert effects == dict.fromkeys(expected, 1), effects  # each once, the cancelled one never
    started = {key: at for key, _, at, _ in runs}
    early = {k: round(started[k] * 1000 - d) for k, d in due.items() if started[k] * 1000 < d}
    assert early == {}, f"started before due (ms): {early}"
    # The jobs due at once landed behind records fired ahead (every partition holds
    # one) and ran before those came due.
    assert len(ahead_partitions) == 3, ahead_partitions
    late_now = {
        k: round(started[k] * 1000 - first_due) for k in now_due if started[k] * 1000 >= first_due
    }
    assert late_now == {}, f"due-at-once jobs held back behind jobs fired ahead: {late_now}"


@pytest.mark.timeout(240)
def test_a_worker_stopped_across_the_due_time_applies_the_cancels_sent_before_it_first(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    """Jobs fired 1 s ahead; the worker is stopped (SIGSTOP) once their records are
    written; half of them are cancelled by commands acknowledged before they are due,
    behind them in the log; the worker goes on 1.5 s after they were due. The jobs
    it holds are due at once and the cancels not read yet: it reads and handles the
    partition up to its end as of the due time first, so the cancelled jobs never
    run and the others run once, not early."""
    with fired_ahead(kafka, prefix, tmp_path) as run:
        pipeline, exec_topic, ledger = run.pipeline, run.exec_topic, run.ledger
        payload = run.payload
        with Scheduler(pipeline.settings) as s:
            start = time.time()
            jobs: dict[str, tuple[str, int]] = {}
            for i in range(AHEAD_JOBS):
                key = f"stopped-{i}"
                run_at = datetime.fromtimestamp(start + 3.0 + 0.1 * i / AHEAD_JOBS, tz=UTC)
                job = s.schedule(
                    "ledger-effect", payload, run_at=run_at, queue=QUEUE, idempotency_key=key
                )
                jobs[key] = (job.job_id, job.due_ms)
        read_exec_until(pipeline, exec_topic, set(jobs))
        first_due = min(due for _, due in jobs.values())
        last_due = max(due for _, due in jobs.values())
        doomed = {k: v for i, (k, v) in enumerate(sorted(jobs.items())) if i % 2}
        os.kill(run.worker.pid, signal.SIGSTOP)
        try:
            sent = send_cancels(pipeline, run.commands, doomed)
            acked_ms = int(time.time() * 1000)
            assert acked_ms < first_due - 100, f"cancels acknowledged {acked_ms - first_due} ms"
            # the scenario: the worker stays stopped until well after the due times
            time.sleep(max(0.0, (last_due + 1_500) / 1000 - time.time()))
        finally:
            os.kill(run.worker.pid, signal.SIGCONT)
        kept = set(jobs) - set(doomed)

        wait_for("the kept jobs' effects", lambda: set(ledger.effects()) >= kept, 90)
        wait_for(
            "every cancel's verdict",
            lambda: set(command_verdicts(pipeline, sent)) == set(doomed),
            60,
        )
        answered = command_verdicts(pipeline, sent)
        effects = ledger.effects()
        runs = ledger.runs()
    assert answered == dict.fromkeys(doomed, "cancelled"), answered
    assert effects == dict.fromkeys(kept, 1), effects  # the cancelled ones never ran
    started = {key: at for key, _, at, _ in runs}
    early = {
        k: round(started[k] * 1000 - jobs[k][1]) for k in kept if started[k] * 1000 < jobs[k][1]
    }
    assert early == {}, f"started before due (ms): {early}"
