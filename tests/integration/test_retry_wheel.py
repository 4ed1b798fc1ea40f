"""Retries longer than the top retry tier go back through the timer wheel.

A real worker and a real emitter (both on threads of this process). Job A's
second backoff (10 s) is far longer than the top tier (500 ms); job B, in the
same exec partition, fails afterwards with a 500 ms backoff. Before, A's
retry waited at the head of the top tier's partition and B's retry waited
behind it for A's full delay; now A's retry is a timer in the wheel, fired
into A's own exec partition at its due time, and B runs after its 500 ms.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.rules.partitioning import partition_for_key
from tests.conftest import KafkaCluster
from tests.integration.worker_support import Ledger, WorkerThread, read_topic, wait_for
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    ensure_topics,
    threaded_emitter,
)

QUEUE = "jobs"
PARTITIONS = 3
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
LONG_S = 10.0  # A's second backoff: 20x the top tier
SHORT_S = 0.5  # B's backoff: the top tier itself


def _settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": PARTITIONS, "retry_tiers_ms": [200, 500]}],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker={
            "session_timeout_ms": 3000,
            "transaction_timeout_ms": 5000,
            "commit_interval_ms": 50,
            "concurrency": 8,
        },
    )
    ensure_topics(s)
    return s


def _write(s: Settings, job: Job, partition: int) -> None:
    writer = ExecWriter(s)
    headers = [*exec_headers(job), ("traceparent", TRACEPARENT)]
    writer.write_raw(
        job.queue,
        job.idempotency_key.encode(),
        codec.encode("job", job.to_record()),
        headers,
        partition=partition,
    )
    writer.flush()


@pytest.mark.timeout(120)
def test_a_retry_longer_than_the_top_tier_holds_no_shorter_retry_and_never_runs_early(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = _settings(kafka, prefix)
    n = names(s)
    # Both jobs in one exec partition, one that is not the long job's key partition
    # (as after a redrive onto its old partition): the retry must come back to it.
    p = (partition_for_key(b"k-long", PARTITIONS) + 1) % PARTITIONS
    ledger = Ledger(tmp_path / "ledger.db")
    failed_at: dict[tuple[str, int], float] = {}
    started_at: dict[tuple[str, int], float] = {}

    @task("flaky", queue=QUEUE)
    def flaky(payload: Any, ctx: TaskContext) -> None:
        started_at[ctx.idempotency_key, ctx.attempt] = time.time()
        ledger.run(ctx.idempotency_key, ctx.attempt)
        if ctx.attempt < payload["succeed_at"]:
            failed_at[ctx.idempotency_key, ctx.attempt] = time.time()
            raise ValueError(f"attempt {ctx.attempt} fails")
        ledger.effect(ctx.idempotency_key)

    metrics = Metrics()
    # A: 0.5 s then 10 s (exponential, x20, no jitter); B: 0.5 s (fixed, no jitter).
    long_job = make_job(
        "flaky",
        {"succeed_at": 3},
        queue=QUEUE,
        key="k-long",
        backoff=Backoff(
            BackoffKind.EXPONENTIAL, base_ms=500, max_ms=60_000, multiplier=20.0, jitter=False
        ),
    )
    with threaded_emitter(s) as em, WorkerThread(s, TaskRegistry([flaky]), metrics=metrics):
        em.wait_active()
        _write(s, long_job, p)
        wait_for("A's second failure", lambda: ("k-long", 2) in failed_at, timeout=30)
        short_job = make_job(
            "flaky",
            {"succeed_at": 2},
            queue=QUEUE,
            key="k-short",
            backoff=Backoff(BackoffKind.FIXED, base_ms=500, max_ms=500, jitter=False),
        )
        _write(s, short_job, p)
        wait_for("B's retry", lambda: ledger.effects().get("k-short") == 1, timeout=30)
        wait_for("A's last attempt", lambda: ledger.effects().get("k-long") == 1, timeout=40)
        wheel_retries = metrics.registry.get_sample_value(
            "dueflow_retries_total", {"queue": QUEUE, "tier": "wheel"}
        )

    # B's retry ran after its own 500 ms, not after A's 10 s.
    b_wait = started_at["k-short", 2] - failed_at["k-short", 1]
    assert SHORT_S <= b_wait < LONG_S / 2, b_wait
    assert started_at["k-short", 2] < failed_at["k-long", 2] + LONG_S
    # A's last attempt never ran early, and every attempt ran once.
    assert started_at["k-long", 3] >= failed_at["k-long", 2] + LONG_S
    assert [a for _, a, _, _ in ledger.runs("k-long")] == [1, 2, 3]
    assert [a for _, a, _, _ in ledger.runs("k-short")] == [1, 2]
    assert wheel_retries == 1

    # A's second retry is not a record of the top tier ...
    tier = [(r.key, r.headers[hdr.ATTEMPT]) for r in read_topic(s, n.retry(QUEUE, 500))]
    assert sorted(tier) == [(b"k-long", b"2"), (b"k-short", b"2")]
    # ... but a job timer the emitter fired (df-src: the timer topic; the emitter
    # deletes fired slot records, so they are read here, on the exec record) into A's
    # own exec partition with its attempt, not-before, trace and value unchanged.
    (third,) = [
        r
        for r in read_topic(s, n.exec(QUEUE))
        if r.key == b"k-long" and r.headers.get(hdr.ATTEMPT) == b"3"
    ]
    assert third.partition == p
    assert third.headers[hdr.SOURCE].startswith(f"{n.timers}:".encode())
    assert third.headers[hdr.PARTITION] == str(p).encode()
    assert third.headers[hdr.KIND] == b"job"
    due = int(third.headers[hdr.DUE])
    assert due == int(third.headers[hdr.LAST_FAILURE]) + int(LONG_S * 1000)
    assert int(third.headers[hdr.FIRED]) >= due - AHEAD_MS
    assert third.headers["traceparent"] == TRACEPARENT
    assert third.value == codec.encode("job", long_job.to_record())
