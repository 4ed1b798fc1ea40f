"""The chaos suite's evidence readers (tests/chaos/evidence.py) against a real broker.

First: records written in transactions with the project's own codecs, one
transaction aborted between two committed ones: the readers return exactly
the committed records, with the fields the judge needs. Then: a worker runs
the chaos handlers on a few jobs, and what the readers find is a run the judge
passes (every flaky job on its attempt, every always-fail job dead once).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.kafka.clients import make_transactional_producer
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.records.worker_codec import OUTCOME_V1, encode_outcome
from tests.chaos import evidence, handlers
from tests.chaos.facts import DeadLetter, Fire, Outcome
from tests.chaos.ledger import Ledger
from tests.chaos.verdict import broken, judge
from tests.chaos.workload import Accepted, Workload
from tests.conftest import KafkaCluster
from tests.integration.records import settle
from tests.integration.worker_support import WorkerThread, ensure_topics, wait_for

QUEUE = handlers.QUEUE
T = 1_700_000_000_000


def chaos_settings(kafka: KafkaCluster, prefix: str) -> Settings:
    return kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 2, "retry_tiers_ms": [500, 2000]}],
        worker={"commit_interval_ms": 50, "session_timeout_ms": 6000},
    )


def outcome(key: str, state: str, attempt: int, worker: str | None) -> bytes:
    return encode_outcome(
        job_id=key,
        queue=QUEUE,
        task="chaos-ok",
        idempotency_key=key,
        state=state,
        attempt=attempt,
        at_ms=T,
        worker=worker,
    )


def dead_letter(key: str, reason: str, attempts: int, job_headers: dict[str, bytes]) -> bytes:
    return codec.encode(
        "dead_letter",
        {
            "job_id": key,
            "queue": QUEUE,
            "task": "chaos-doomed",
            "idempotency_key": key,
            "reason": reason,
            "error_type": "JobError",
            "error_message": "on purpose",
            "attempts": attempts,
            "first_failure_ms": T,
            "last_failure_ms": T,
            "dead_ms": T,
            "original_topic": "x",
            "original_partition": 0,
            "original_offset": 0,
            "trace_id": None,
            "job_value": b"",
            "job_headers": job_headers,
        },
    )


def write(settings: Settings, key: str, *, dead: bool, abort: bool, **extra: Any) -> None:
    """One transaction: an outcome, a dead letter (``dead``) and an exec record of ``key``."""
    n = names(settings)
    producer = make_transactional_producer(settings, f"evidence-{uuid.uuid4().hex}")
    producer.init_transactions(30)
    producer.begin_transaction()
    state = "dead" if dead else "succeeded"
    producer.produce(
        n.outcomes,
        outcome(key, state, extra.get("attempt", 1), extra.get("worker")),
        key.encode(),
        headers=[(hdr.SCHEMA, OUTCOME_V1)],
        timestamp=extra.get("ts", T),
    )
    if dead:
        producer.produce(
            n.dlq(QUEUE),
            dead_letter(key, "exhausted", 3, extra.get("job_headers", {})),
            key.encode(),
            partition=0,
            headers=[(hdr.SCHEMA, codec.schema_header("dead_letter"))],
        )
    job = make_job("chaos-ok", {}, queue=QUEUE, key=key, job_id=key)
    headers: list[tuple[str, str | bytes | None]] = [
        *exec_headers(job),
        *hdr.encode(extra.get("exec_headers", [])),
    ]
    producer.produce(
        n.exec(QUEUE),
        codec.encode("job", job.to_record()),
        key.encode(),
        partition=0,
        headers=headers,
    )
    # On the log before the abort (an abort purges what was not sent yet): the
    # aborted records are there, with their abort marker, for a reader to skip.
    assert producer.flush(30) == 0
    if abort:
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)


def test_the_readers_return_committed_records_and_never_aborted_ones(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings = chaos_settings(kafka, prefix)
    ensure_topics(settings)
    write(settings, "ok-1", dead=False, abort=False, worker="host-a:4242", ts=T + 5)
    write(settings, "ghost", dead=True, abort=True, worker="host-a:4242")
    write(
        settings,
        "dead-1",
        dead=True,
        abort=False,
        attempt=3,
        job_headers={hdr.REDRIVEN_AT: b"123"},
        exec_headers=[(hdr.REDRIVEN_AT, 123)],
    )
    write(settings, "ok-2", dead=False, abort=False, exec_headers=[(hdr.REPLAYED_FROM, "x:0:1")])
    # The last commit's markers are written after the commit returns (CI read its
    # outcome's end before them once and missed ok-2).
    n = names(settings)
    assert settle(settings, [n.outcomes, n.dlq(QUEUE), n.exec(QUEUE)])

    outcomes = sorted(evidence.read_outcomes(settings), key=lambda o: o.key)
    assert [replace(o, offset=-1) for o in outcomes] == [
        Outcome("dead-1", "dead-1", "dead", 3, T, None),
        Outcome("ok-1", "ok-1", "succeeded", 1, T + 5, 4242),
        Outcome("ok-2", "ok-2", "succeeded", 1, T, None),
    ]
    # each at its offset: the aborted "ghost" outcome and the markers take offsets too
    assert all(o.offset >= 0 for o in outcomes)
    assert evidence.read_dead_letters(settings, QUEUE) == [
        DeadLetter("dead-1", "dead-1", "exhausted", 3, redriven=True)
    ]
    assert sorted(evidence.read_fires(settings, QUEUE), key=lambda f: f.key) == [
        Fire("dead-1", "dead-1", resent=True),
        Fire("ok-1", "ok-1", resent=False),
        Fire("ok-2", "ok-2", resent=True),
    ]


def test_a_worker_run_of_the_chaos_handlers_reads_back_as_a_passing_run(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = chaos_settings(kafka, prefix)
    ensure_topics(settings)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    monkeypatch.setattr(handlers, "_LEDGER", ledger)
    kinds = {
        "j-ok": ("ok", "chaos-ok", {}),
        "j-flaky": ("flaky", "chaos-flaky", {"fail_times": 2}),
        "j-doomed": ("doomed", "chaos-doomed", {}),
        "j-permanent": ("permanent", "chaos-permanent", {}),
    }
    jobs = [
        make_job(task, payload, queue=QUEUE, job_id=key)
        for key, (_k, task, payload) in kinds.items()
    ]
    workload = Workload(settings, [], 0.0)
    workload.accepted.extend(
        Accepted(j.job_id, kinds[j.job_id][0], j.due_ms, j.due_ms, j.task, fail_times=2)
        for j in jobs
    )
    writer = ExecWriter(settings)
    writer.write(jobs)
    writer.flush()

    def terminal() -> set[str]:
        ends = {"succeeded", "dead"}
        return {o.key for o in evidence.read_outcomes(settings) if o.state in ends}

    with WorkerThread(settings, TaskRegistry(list(evidence.TASKS)), queues=[QUEUE]):
        wait_for("every job at its end", lambda: terminal() == set(kinds), 90)
        ev = evidence.gather(
            settings, ledger, workload, queue=QUEUE, emitter_pids=[], faults=[], skews={}
        )
    report = judge(ev)
    assert broken(report) == [], report
    assert (report["flaky_ok"], report["dlq_expected"], report["dlq_expected_of"]) == (1, 2, 2)
    assert report["runs"] == 1 + 3 + 3 + 1
    pid = f"{socket.gethostname()}:{os.getpid()}"
    assert {o.pid for o in ev.outcomes} == {evidence.worker_pid(pid)}
    assert {f.key for f in ev.fires} == set(kinds)
    assert ev.plans["chaos-flaky"].delay_after(1) == handlers.RETRY_BACKOFF_MS
    assert ev.plans["chaos-doomed"].max_attempts == handlers.DOOMED_MAX_ATTEMPTS
