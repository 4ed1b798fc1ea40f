"""Rebalances against a real broker: nothing stalls, nothing runs twice.

A partition a worker had paused (its head retry record was not due yet) when
a rebalance took it away, and that comes back to the same member, must be
fetched again: librdkafka keeps an application's pause across
revoke/assign, so a worker that forgets its pause state without resuming
the partition never reads it again (retries and dead letters vanish).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.testing import ExecWriter, make_job
from tests.conftest import KafkaCluster
from tests.integration.test_worker_jobs import QUEUE, outcomes, queue_settings, states_of
from tests.integration.worker_support import Ledger, WorkerThread, wait_for

RETRY_MS = 6_000  # the only retry tier: long enough to hold paused retry partitions
PARTITIONS = 4
# A retry runs within this long after its due time ("not before"), rebalances included.
RETRY_BOUND_S = 4.0


def test_a_paused_retry_partition_given_back_to_its_owner_is_fetched_again(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix, partitions=PARTITIONS, tiers=(RETRY_MS,))
    ledger = Ledger(tmp_path / "ledger.db")
    failed_at: dict[str, float] = {}

    @task("fails-once", queue=QUEUE, max_attempts=2)
    def fails_once(payload: Any, ctx: TaskContext) -> None:
        ledger.run(ctx.idempotency_key, ctx.attempt)
        if ctx.attempt == 1:
            failed_at[ctx.idempotency_key] = time.time()
            raise RuntimeError("the first attempt fails")
        ledger.effect(ctx.idempotency_key)

    registry = TaskRegistry([fails_once])
    keys = [f"k-paused-{i}" for i in range(24)]  # every partition gets some (murmur2)
    with WorkerThread(s, registry) as first:
        writer = ExecWriter(s)
        writer.write(make_job("fails-once", {}, queue=QUEUE, key=k) for k in keys)
        writer.flush()
        wait_for("every first attempt failed", lambda: len(failed_at) == len(keys))
        # Every retry partition now holds a record due in RETRY_MS: paused.
        second = WorkerThread(s, registry).start()
        try:
            wait_for("the group split", lambda: second.assigned() > 0, timeout=60)
        finally:
            second.stop()  # its partitions go back to the first worker
        wait_for("the first worker owns everything again", lambda: first.assigned() > 0)
        latest_due = max(failed_at.values()) + RETRY_MS / 1000
        wait_for(
            "every retry ran",
            lambda: len(ledger.effects()) == len(keys),
            timeout=max(1.0, latest_due - time.time()) + RETRY_BOUND_S + 30,
        )
        outs = outcomes(
            s,
            until=lambda o: all(("succeeded", 2) in states_of(o, k) for k in keys),
        )

    assert ledger.effects() == dict.fromkeys(keys, 1)
    for key in keys:
        runs = ledger.runs(key)
        assert [attempt for _, attempt, _, _ in runs] == [1, 2], (key, runs)
        due = failed_at[key] + RETRY_MS / 1000
        started = runs[1][2]
        assert started >= due - 0.002, (key, started - due)  # never early
        assert started <= due + RETRY_BOUND_S, (key, started - due)  # never stalled
        assert states_of(outs, key) == [("retrying", 1), ("succeeded", 2)]
