"""Worker behaviour against a real broker: retries, DLQ, timeouts, limits, idempotency.

Each test writes exec records as the emitter does (``ExecWriter``), runs a
worker on a thread, and checks what ran (a ledger the test owns) and what
was committed to Kafka (outcomes, retry tiers, DLQ, idempotency topic).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.outputs import KEY_HEADERS
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.errors import PermanentJobError
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.worker_codec import decode_key_state, encode_key_state
from dueflow.wall_clock import wall_ms
from tests.conftest import KafkaCluster
from tests.integration import worker_app
from tests.integration.worker_support import (
    Ledger,
    OpenTransaction,
    WorkerThread,
    commit_offset,
    ensure_topics,
    logged,
    outcomes_of,
    read_topic,
    wait_for,
    waits_for_transaction,
)

QUEUE = "jobs"
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def queue_settings(
    kafka: KafkaCluster,
    prefix: str,
    *,
    partitions: int = 3,
    tiers: tuple[int, ...] = (200, 500),
    rate: float | None = None,
    **worker: Any,
) -> Settings:
    q: dict[str, Any] = {"name": QUEUE, "partitions": partitions, "retry_tiers_ms": list(tiers)}
    if rate is not None:
        q["rate_limit_per_s"] = rate
    settings = kafka.settings(
        prefix,
        queues=[q],
        worker={
            "session_timeout_ms": 3000,
            "transaction_timeout_ms": 5000,
            "commit_interval_ms": 50,
            "concurrency": 8,
            **worker,
        },
    )
    ensure_topics(settings)
    return settings


def write(settings: Settings, *jobs: Any) -> None:
    writer = ExecWriter(settings)
    writer.write(jobs)
    writer.flush()


def outcomes(settings: Settings, until: Any = None, timeout: float = 30) -> list[dict[str, Any]]:
    records = read_topic(
        settings,
        names(settings).outcomes,
        until=(lambda r: until(outcomes_of(r))) if until else None,
        timeout=timeout,
    )
    return outcomes_of(records)


def gauge(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def states_of(outs: list[dict[str, Any]], key: str) -> list[tuple[str, int]]:
    """The key's outcomes by time; ``started`` left out (a worker's report that an
    attempt runs long, not a decision)."""
    rows = [o for o in outs if o["idempotency_key"] == key and o["state"] != "started"]
    rows.sort(key=lambda o: (o["at_ms"], o["attempt"]))
    return [(o["state"], o["attempt"]) for o in rows]


# --------------------------------------------------------------------------- retries


def test_a_job_failing_twice_runs_three_times_never_early_with_one_effect(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    failed_at: dict[int, float] = {}

    @task("flaky", queue=QUEUE)
    def flaky(payload: Any, ctx: TaskContext) -> None:
        ledger.run(ctx.idempotency_key, ctx.attempt)
        if ctx.attempt <= 2:
            failed_at[ctx.attempt] = time.time()
            raise ValueError(f"attempt {ctx.attempt} fails")
        ledger.effect(ctx.idempotency_key)

    with WorkerThread(s, TaskRegistry([flaky])):
        write(s, make_job("flaky", {"n": 1}, queue=QUEUE, key="k-flaky"))
        wait_for("the effect", lambda: ledger.effects().get("k-flaky") == 1)
        outs = outcomes(s, until=lambda o: ("succeeded", 3) in states_of(o, "k-flaky"))

    runs = ledger.runs("k-flaky")
    assert [attempt for _, attempt, _, _ in runs] == [1, 2, 3]
    # Retry n waits in tier n (200 ms, then 500 ms) and never starts before it is due.
    slack = 0.002  # the worker's clock reads whole milliseconds
    assert runs[1][2] >= failed_at[1] + 0.200 - slack
    assert runs[2][2] >= failed_at[2] + 0.500 - slack
    assert ledger.effects() == {"k-flaky": 1}
    assert states_of(outs, "k-flaky") == [("retrying", 1), ("retrying", 2), ("succeeded", 3)]
    n = names(s)
    for tier, attempt in ((200, 2), (500, 3)):
        (rec,) = read_topic(s, n.retry(QUEUE, tier))
        assert rec.key == b"k-flaky"
        assert int(rec.headers[hdr.ATTEMPT]) == attempt
        assert int(rec.headers[hdr.DUE]) == int(rec.headers[hdr.LAST_FAILURE]) + tier
        assert rec.headers[hdr.ERROR] == f"ValueError: attempt {attempt - 1} fails".encode()


@task("always-fails", queue=QUEUE, max_attempts=3)
def always_fails(payload: Any, ctx: TaskContext) -> None:
    Ledger(Path(payload["ledger"])).run(ctx.idempotency_key, ctx.attempt)
    raise RuntimeError("always fails")


def test_an_always_failing_job_lands_in_the_dlq_with_the_full_record(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    job = make_job("always-fails", {"ledger": str(ledger.path)}, queue=QUEUE, key="k-dead")
    value = codec.encode("job", job.to_record())
    n = names(s)
    with WorkerThread(s, TaskRegistry([always_fails])):
        writer = ExecWriter(s)
        writer.write_raw(
            QUEUE, b"k-dead", value, [*exec_headers(job), (hdr.TRACEPARENT, TRACEPARENT)]
        )
        writer.flush()
        (dead,) = read_topic(s, n.dlq(QUEUE), until=lambda r: len(r) == 1)
    (exec_rec,) = read_topic(s, n.exec(QUEUE))
    dl = codec.decode("dead_letter", dead.value or b"")
    assert dl["reason"] == "exhausted"
    assert dl["attempts"] == 3
    assert dl["error_type"] == "RuntimeError"
    assert dl["error_message"] == "always fails"
    assert "Traceback" in dl["traceback"]
    assert "always_fails" in dl["traceback"]
    assert dl["first_failure_ms"] < dl["last_failure_ms"] <= dl["dead_ms"]
    assert (dl["original_topic"], dl["original_partition"], dl["original_offset"]) == (
        n.exec(QUEUE),
        exec_rec.partition,
        exec_rec.offset,
    )
    assert dl["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert dl["job_value"] == value  # unchanged bytes: ready for redrive
    assert dl["job_headers"][hdr.JOB_ID] == job.job_id.encode()
    assert (dl["job_id"], dl["task"], dl["idempotency_key"]) == (
        job.job_id,
        "always-fails",
        "k-dead",
    )
    assert dead.key == b"k-dead"
    assert dead.partition == exec_rec.partition  # co-partitioned, never re-hashed
    assert [a for _, a, _, _ in ledger.runs("k-dead")] == [1, 2, 3]
    keys = read_topic(s, n.idempotency(QUEUE))
    assert {(k.key, k.partition) for k in keys} == {(b"k-dead", exec_rec.partition)}
    states = [decode_key_state(k.value or b"", k.headers.get(hdr.SCHEMA))[::2] for k in keys]
    # each failed attempt handed on, then dead
    assert states == [("retrying", 1), ("retrying", 2), ("dead", 3)]
    outs = outcomes(s, until=lambda o: ("dead", 3) in states_of(o, "k-dead"))
    assert states_of(outs, "k-dead") == [("retrying", 1), ("retrying", 2), ("dead", 3)]


def test_unknown_task_and_undecodable_records_go_straight_to_the_dlq(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ran: list[str] = []

    @task("known", queue=QUEUE)
    def known(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)

    permanent_job = make_job("permanent", {}, queue=QUEUE, key="k-permanent")

    @task("permanent", queue=QUEUE)
    def permanent(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)
        raise PermanentJobError("card declined")

    n = names(s)
    with WorkerThread(s, TaskRegistry([known, permanent])):
        writer = ExecWriter(s)
        writer.write([make_job("no-such-task", {}, queue=QUEUE, key="k-unknown"), permanent_job])
        writer.write([make_job("known", queue=QUEUE, key="k-badjson", raw_payload=b"{not json")])
        writer.write_raw(
            QUEUE,
            b"k-garbage",
            b"\xff\x00 definitely not avro",
            [(hdr.JOB_ID, b"j-garbage"), (hdr.TASK, b"known")],
        )
        writer.flush()
        dead = read_topic(s, n.dlq(QUEUE), until=lambda r: len(r) == 4)
    by_key = {r.key: codec.decode("dead_letter", r.value or b"") for r in dead}
    assert by_key[b"k-unknown"]["reason"] == "unknown_task"
    assert "no-such-task" in by_key[b"k-unknown"]["error_message"]
    assert by_key[b"k-badjson"]["reason"] == "undecodable"
    assert by_key[b"k-garbage"]["reason"] == "undecodable"
    assert by_key[b"k-garbage"]["job_id"] == "j-garbage"
    assert by_key[b"k-garbage"]["job_value"] == b"\xff\x00 definitely not avro"
    assert by_key[b"k-permanent"]["reason"] == "permanent_error"
    assert by_key[b"k-permanent"]["error_type"] == "dueflow.errors.PermanentJobError"
    assert by_key[b"k-permanent"]["attempts"] == 1
    for key in (b"k-unknown", b"k-badjson", b"k-garbage"):
        assert by_key[key]["attempts"] == 0  # no handler ran
    assert ran == ["k-permanent"]  # run once: a permanent error skips the retries
    for tier in (200, 500):
        assert read_topic(s, n.retry(QUEUE, tier)) == []


# --------------------------------------------------------------------------- timeouts


def test_timed_out_jobs_fail_free_their_slot_and_are_retried(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix, concurrency=1)
    metrics = Metrics()
    started: list[tuple[str, int, float]] = []
    orphan_returned = threading.Event()

    @task("slow-sync", queue=QUEUE, timeout=0.5)
    def slow_sync(payload: Any, ctx: TaskContext) -> None:
        started.append((ctx.idempotency_key, ctx.attempt, time.time()))
        if ctx.attempt == 1:
            time.sleep(3)
            orphan_returned.set()

    @task("slow-async", queue=QUEUE, timeout=0.5)
    async def slow_async(payload: Any, ctx: TaskContext) -> None:
        started.append((ctx.idempotency_key, ctx.attempt, time.time()))
        if ctx.attempt == 1:
            await asyncio.sleep(30)

    with WorkerThread(s, TaskRegistry([slow_sync, slow_async]), metrics=metrics):
        write(s, make_job("slow-sync", queue=QUEUE, key="k-sync"))
        wait_for(
            "the retry of the sync job", lambda: ("k-sync", 2) in [(k, a) for k, a, _ in started]
        )
        # concurrency 1: the retry ran while the timed-out thread still sleeps
        assert not orphan_returned.is_set()
        assert gauge(metrics, "dueflow_worker_orphaned_threads") == 1
        write(s, make_job("slow-async", queue=QUEUE, key="k-async"))
        outs = outcomes(
            s,
            until=lambda o: (
                ("succeeded", 2) in states_of(o, "k-sync")
                and ("succeeded", 2) in states_of(o, "k-async")
            ),
        )
        assert orphan_returned.wait(10)
        wait_for(
            "the orphan gauge to drop",
            lambda: gauge(metrics, "dueflow_worker_orphaned_threads") == 0,
        )
    for key in ("k-sync", "k-async"):
        assert states_of(outs, key) == [("retrying", 1), ("succeeded", 2)]
        (failed,) = [o for o in outs if o["idempotency_key"] == key and o["state"] == "retrying"]
        assert failed["error_type"] == "dueflow.consumers.failures.JobTimeout"
    times = {(k, a): t for k, a, t in started}
    # timeout (0.5 s) then the first tier (0.2 s); a little slack for thread start-up
    assert times[("k-sync", 2)] - times[("k-sync", 1)] >= 0.6


def test_an_isolated_handler_that_overruns_is_killed(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    with WorkerThread(s, TaskRegistry([worker_app.hang_first])):
        write(s, make_job("hang-first", {"ledger": str(ledger.path)}, queue=QUEUE, key="k-hang"))
        wait_for("the effect of attempt 2", lambda: ledger.effects().get("k-hang") == 1, 60)
        outs = outcomes(s, until=lambda o: ("succeeded", 2) in states_of(o, "k-hang"))
    assert states_of(outs, "k-hang") == [("retrying", 1), ("succeeded", 2)]
    runs = ledger.runs("k-hang")
    assert [a for _, a, _, _ in runs] == [1, 2]
    first_pid = runs[0][3]
    with pytest.raises(ProcessLookupError):  # the hung child was killed, not left behind
        os.kill(first_pid, 0)


# --------------------------------------------------------------------------- limits


def test_concurrency_never_exceeds_the_bound(kafka: KafkaCluster, prefix: str) -> None:
    s = queue_settings(kafka, prefix, concurrency=4)
    lock = threading.Lock()
    active = [0]
    peak = [0]
    done: list[str] = []

    def enter() -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])

    def leave(key: str) -> None:
        with lock:
            active[0] -= 1
            done.append(key)

    @task("sync-sleep", queue=QUEUE)
    def sync_sleep(payload: Any, ctx: TaskContext) -> None:
        enter()
        time.sleep(0.05)
        leave(ctx.idempotency_key)

    @task("async-sleep", queue=QUEUE)
    async def async_sleep(payload: Any, ctx: TaskContext) -> None:
        enter()
        await asyncio.sleep(0.05)
        leave(ctx.idempotency_key)

    jobs = [make_job("sync-sleep", queue=QUEUE) for _ in range(30)]
    jobs += [make_job("async-sleep", queue=QUEUE) for _ in range(30)]
    with WorkerThread(s, TaskRegistry([sync_sleep, async_sleep])):
        write(s, *jobs)
        wait_for("all jobs", lambda: len(done) == 60)
    assert peak[0] == 4


# --------------------------------------------------------------------------- idempotency


def test_replays_of_a_key_never_run_twice_nor_concurrently(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    metrics = Metrics()

    @task("slow-effect", queue=QUEUE)
    def slow_effect(payload: Any, ctx: TaskContext) -> None:
        ledger.run(ctx.idempotency_key, ctx.attempt)
        time.sleep(0.5)
        ledger.effect(ctx.idempotency_key)

    job = make_job("slow-effect", queue=QUEUE, key="k-replayed")
    with WorkerThread(s, TaskRegistry([slow_effect]), metrics=metrics):
        write(s, job, job)  # the same record twice, in flight together
        outs = outcomes(s, until=lambda o: len(states_of(o, "k-replayed")) == 2)
        write(s, job)  # and once more after it committed
        outs = outcomes(s, until=lambda o: len(states_of(o, "k-replayed")) == 3)
    assert ledger.effects() == {"k-replayed": 1}
    assert len(ledger.runs("k-replayed")) == 1
    assert sorted(st for st, _ in states_of(outs, "k-replayed")) == [
        "duplicate",
        "duplicate",
        "succeeded",
    ]
    assert gauge(metrics, "dueflow_duplicates_skipped_total", queue=QUEUE) == 2


def cancel(settings: Settings, key: str) -> None:
    """What the SDK's cancel() writes (its own record builder), produced the same way:
    the idempotency record without an explicit partition (murmur2 = the exec partition)."""
    from dueflow.producers.cancel import cancel_records

    idem, _outcome = cancel_records(
        names=names(settings),
        job_id=key,
        queue=QUEUE,
        idempotency_key=key,
        at_ms=int(time.time() * 1000),
    )
    producer = make_producer(settings)
    producer.produce(idem.topic, idem.value, idem.key, headers=list(idem.headers))
    assert producer.flush(10) == 0


def test_cancelled_keys_are_skipped_before_and_after_the_worker_loaded_them(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = queue_settings(kafka, prefix)
    ran: list[str] = []

    @task("effect", queue=QUEUE)
    def effect(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)

    cancel(s, "k-cancelled-early")
    with WorkerThread(s, TaskRegistry([effect])):
        # Warm up: once jobs ran in every partition, every key store is loaded,
        # so the second cancel below arrives while the worker tails the topic.
        warm = [make_job("effect", queue=QUEUE, key=f"k-warm-{i}") for i in range(30)]
        write(s, make_job("effect", queue=QUEUE, key="k-cancelled-early"), *warm)
        wait_for("the warm-up jobs", lambda: len(ran) == 30)
        due = int(time.time() * 1000) + 3000
        write(s, make_job("effect", queue=QUEUE, key="k-cancelled-late", due_ms=due))
        cancel(s, "k-cancelled-late")  # while its exec record waits for its due time
        assert time.time() * 1000 < due, "too slow to test a cancel before the due time"
        outs = outcomes(s, until=lambda o: len(states_of(o, "k-cancelled-late")) == 1)
    assert sorted(ran) == sorted(j.idempotency_key for j in warm)
    assert states_of(outs, "k-cancelled-early") == [("cancelled", 1)]
    assert states_of(outs, "k-cancelled-late") == [("cancelled", 1)]


def test_a_new_owner_waits_for_the_previous_owners_done_record_before_judging_a_copy(
    kafka: KafkaCluster, prefix: str
) -> None:
    """The previous owner ran a job and committed its key ``done`` with its offset, in one
    transaction, whose markers are written partition by partition: the offset can count
    as committed while the idempotency partition has no marker yet (its last stable
    offset is still before the record). Modelled exactly: the ``done`` record in a
    transaction kept open, the offset committed. A copy of the job behind it (the same
    key, as a client's retried schedule writes it) is skipped, not run again."""
    s = queue_settings(kafka, prefix)
    n = names(s)
    metrics = Metrics()
    ran: list[str] = []

    @task("effect", queue=QUEUE)
    def effect(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)

    # The previous owner: it made the group (and left).
    with WorkerThread(s, TaskRegistry([effect])) as previous:
        wait_for("the previous owner to own its partitions", lambda: previous.assigned() > 0)
    key = "k-done-before"
    job = make_job("effect", queue=QUEUE, key=key)
    write(s, job, job)  # the job, and a copy of it behind
    first, copy = [r for r in read_topic(s, n.exec(QUEUE)) if r.key == key.encode()]
    # The previous owner ran the first: its key done, as it writes it,
    done = encode_key_state(
        idempotency_key=key, job_id=job.job_id, state="done", at_ms=wall_ms(), attempts=1
    )
    record = (n.idempotency(QUEUE), first.partition, key.encode(), done, KEY_HEADERS)
    with OpenTransaction(s, f"{prefix}.previous-owner", [record]) as previous_txn:
        # ... and its offset: that marker is written, the other one not yet.
        commit_offset(
            s, n.worker_group(QUEUE), TopicPartition(first.topic, first.partition, copy.offset)
        )
        with (
            logged("dueflow.worker") as events,
            WorkerThread(s, TaskRegistry([effect]), metrics=metrics),
        ):
            wait_for(
                "the new owner to load the partition (it runs the copy, or waits for the "
                "transaction)",
                lambda: bool(ran) or waits_for_transaction(events, "keys"),
            )
            previous_txn.commit()
            outs = outcomes(s, until=lambda o: len(states_of(o, key)) == 1)
    assert ran == [], "the copy of a job done already ran"
    assert [state for state, _attempt in states_of(outs, key)] == ["duplicate"]
    assert gauge(metrics, "dueflow_duplicates_skipped_total", queue=QUEUE) == 1
    waited = gauge(metrics, "dueflow_store_load_wait_seconds_sum", queue=QUEUE, store="keys")
    assert waited is not None
    assert waited > 0


def test_the_disk_store_remembers_keys_across_restarts(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix, store="disk", store_dir=str(tmp_path / "keys"))
    ran: list[str] = []

    @task("effect", queue=QUEUE)
    def effect(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)

    job = make_job("effect", queue=QUEUE, key="k-once")
    with WorkerThread(s, TaskRegistry([effect])):
        write(s, job)
        outcomes(s, until=lambda o: states_of(o, "k-once") == [("succeeded", 1)])
    assert list((tmp_path / "keys").glob("*.sqlite"))
    with WorkerThread(s, TaskRegistry([effect])):
        write(s, job)
        outs = outcomes(s, until=lambda o: len(states_of(o, "k-once")) == 2)
    assert ran == ["k-once"]
    assert [st for st, _ in states_of(outs, "k-once")] == ["succeeded", "duplicate"]


# --------------------------------------------------------------------------- shutdown, rebalance


def test_shutdown_drains_in_flight_jobs_and_commits_them(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    keys = [f"k-drain-{i}" for i in range(4)]
    jobs = [
        make_job("ledger-effect", {"ledger": str(ledger.path), "sleep_s": 1.0}, queue=QUEUE, key=k)
        for k in keys
    ]
    worker = WorkerThread(s, TaskRegistry([worker_app.ledger_effect])).start()
    try:
        write(s, *jobs)
        wait_for("all four running", lambda: len(ledger.runs()) == 4)
    finally:
        worker.stop()  # waits for the drain
    assert ledger.effects() == dict.fromkeys(keys, 1)
    outs = outcomes(s)
    assert sorted(o["idempotency_key"] for o in outs if o["state"] == "succeeded") == keys
    # A new worker does not run them again: the offsets were committed.
    with WorkerThread(s, TaskRegistry([worker_app.ledger_effect])):
        write(
            s, make_job("ledger-effect", {"ledger": str(ledger.path)}, queue=QUEUE, key="k-after")
        )
        wait_for("the new job", lambda: "k-after" in ledger.effects())
    assert len(ledger.runs()) == 5


def test_a_job_abandoned_at_shutdown_is_redelivered_and_completed_once(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix, shutdown_grace_s=0.2)
    ledger = Ledger(tmp_path / "ledger.db")
    job = make_job(
        "ledger-effect",
        {"ledger": str(ledger.path), "sleep_s": 2.0},
        queue=QUEUE,
        key="k-abandoned",
    )
    worker = WorkerThread(s, TaskRegistry([worker_app.ledger_effect])).start()
    try:
        write(s, job)
        wait_for("the job running", lambda: len(ledger.runs()) == 1)
    finally:
        worker.stop()
    assert states_of(outcomes(s), "k-abandoned") == []  # nothing of it was committed
    with WorkerThread(s, TaskRegistry([worker_app.ledger_effect])):
        outs = outcomes(s, until=lambda o: states_of(o, "k-abandoned") == [("succeeded", 1)])
    assert states_of(outs, "k-abandoned") == [("succeeded", 1)]
    assert len(ledger.runs("k-abandoned")) == 2  # re-run: it had not been committed


def test_a_revoked_partition_lets_its_jobs_finish_and_commits_them(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = queue_settings(kafka, prefix, partitions=6)
    ledger = Ledger(tmp_path / "ledger.db")
    keys = [f"k-rebalance-{i}" for i in range(8)]
    jobs = [
        make_job("ledger-effect", {"ledger": str(ledger.path), "sleep_s": 1.5}, queue=QUEUE, key=k)
        for k in keys
    ]
    registry = TaskRegistry([worker_app.ledger_effect])
    with WorkerThread(s, registry) as first:
        write(s, *jobs)
        wait_for("all eight running", lambda: len(ledger.runs()) == 8)
        with WorkerThread(s, registry) as second:
            wait_for("the group split", lambda: first.assigned() > 0 and second.assigned() > 0)
            wait_for("every effect", lambda: len(ledger.effects()) == 8)
            outs = outcomes(s, until=lambda o: sum(x["state"] == "succeeded" for x in o) == 8)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    assert len(ledger.runs()) == 8  # finished in the grace period, committed, never re-run
    assert sorted(o["idempotency_key"] for o in outs if o["state"] == "succeeded") == keys


def test_a_task_rate_limit_paces_its_jobs(kafka: KafkaCluster, prefix: str) -> None:
    s = queue_settings(kafka, prefix)
    started: list[float] = []

    @task("paced", queue=QUEUE, rate_limit=20)
    async def paced(payload: Any, ctx: TaskContext) -> None:
        started.append(time.monotonic())

    with WorkerThread(s, TaskRegistry([paced])):
        write(s, *(make_job("paced", queue=QUEUE) for _ in range(70)))
        wait_for("every job", lambda: len(started) == 70)
    # One process owns every partition: the whole limit is its own.
    steady = started[10:]  # past the short initial burst
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert abs(rate - 20) <= 2, f"{rate:.1f} jobs/s"


def test_a_malformed_idempotency_record_is_quarantined_and_work_goes_on(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = queue_settings(kafka, prefix)
    ran: list[str] = []

    @task("effect", queue=QUEUE)
    def effect(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.idempotency_key)

    producer = make_producer(s)
    producer.produce(names(s).idempotency(QUEUE), b"\xff garbage", b"k-bad-record")
    assert producer.flush(10) == 0
    with WorkerThread(s, TaskRegistry([effect])):
        write(s, *(make_job("effect", queue=QUEUE, key=f"k-{i}") for i in range(10)))
        wait_for("every job", lambda: len(ran) == 10)
        (quarantined,) = read_topic(s, names(s).quarantine, until=lambda r: len(r) == 1)
    rec = codec.decode("quarantined", quarantined.value or b"")
    assert rec["source_topic"] == names(s).idempotency(QUEUE)
    assert rec["key"] == b"k-bad-record"
    assert "undecodable idempotency record" in rec["reason"]


def test_attempts_and_the_dead_letter_are_spans_of_the_job_trace(
    kafka: KafkaCluster, prefix: str
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dueflow.observability.tracing import JobTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    s = queue_settings(kafka, prefix)
    seen: list[Any] = []

    @task("traced", queue=QUEUE, max_attempts=2)
    def traced(payload: Any, ctx: TaskContext) -> None:
        seen.append(ctx.otel_context)
        raise RuntimeError("still failing")

    job = make_job("traced", queue=QUEUE, key="k-traced")
    with WorkerThread(s, TaskRegistry([traced]), tracer=JobTracer(provider)):
        writer = ExecWriter(s)
        value = codec.encode("job", job.to_record())
        writer.write_raw(
            QUEUE, b"k-traced", value, [*exec_headers(job), (hdr.TRACEPARENT, TRACEPARENT)]
        )
        writer.flush()
        (dead,) = read_topic(s, names(s).dlq(QUEUE), until=lambda r: len(r) == 1)
    spans: dict[str, list[Any]] = {}
    for sp in exporter.get_finished_spans():
        spans.setdefault(sp.name, []).append(sp)
    attempts = sorted(spans["dueflow.execute"], key=lambda sp: sp.attributes["dueflow.attempt"])
    (parked,) = spans["dueflow.dead_letter"]
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    for sp in [*attempts, parked]:
        assert sp.context.trace_id == trace_id  # one trace: the job's
        assert sp.parent is not None
        assert sp.parent.span_id == 0xB7AD6B7169203331  # siblings under the fire step
    assert [sp.attributes["dueflow.attempt"] for sp in attempts] == [1, 2]
    assert [link.context.span_id for link in attempts[1].links] == [attempts[0].context.span_id]
    assert [link.context.span_id for link in parked.links] == [attempts[1].context.span_id]
    assert all(sp.status.status_code.name == "ERROR" for sp in attempts)
    assert all(c is not None for c in seen)  # handlers got their attempt's context
    assert hdr.TRACE_LINK in dead.headers
    assert codec.decode("dead_letter", dead.value or b"")["trace_id"] == format(trace_id, "032x")
