"""The watchdog and max_memory against a real broker: an async handler that blocks the
event loop is recorded as timed out while it blocks, a loop blocked for good restarts the
process, and a process past max_memory restarts after its job; nothing is lost or doubled.

Every process a test starts is stopped by pid in teardown (the ``procs`` fixture).
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records.worker_codec import decode_key_state
from tests.conftest import KafkaCluster
from tests.integration.test_worker_jobs import outcomes, queue_settings, states_of, write
from tests.integration.test_worker_processes import QUEUE, Processes, wait_members
from tests.integration.worker_support import Ledger, WorkerThread, read_topic, wait_for

TIMEOUT_S = 1.0  # block-loop-first's timeout (tests/integration/worker_app.py)
INTERVAL_S = 0.5  # worker.watchdog_interval_s: the defaults, so these run on any version
RESTART_S = 10.0  # worker.watchdog_restart_s
JOB_TIMEOUT = "dueflow.consumers.failures.JobTimeout"
MEMORY_EXCEEDED = "dueflow.consumers.failures.WorkerMemoryExceeded"


@pytest.fixture
def procs(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(kafka, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key_states(settings: Any, key: str) -> list[str]:
    """The idempotency records of ``key``, in the order they were written."""
    out = []
    for r in read_topic(settings, names(settings).idempotency(QUEUE)):
        if r.key is not None and r.key.decode() == key and r.value:
            out.append(decode_key_state(r.value, r.headers.get(hdr.SCHEMA))[0])
    return out


@pytest.mark.timeout(120)
def test_a_handler_blocking_the_loop_is_recorded_as_timed_out_while_it_blocks(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    """The attempt is committed as a timeout within its timeout + the watchdog interval,
    while the handler still blocks; its late return is not recorded as a success."""
    s = queue_settings(kafka, prefix)
    ledger = Ledger(tmp_path / "ledger.db")
    block_s = RESTART_S - 2  # an embedded worker does not restart: not this test
    returned: list[float] = []

    @task("blocks", queue=QUEUE, timeout=TIMEOUT_S, max_attempts=3)
    async def blocks(payload: Any, ctx: TaskContext) -> None:
        ledger.run(ctx.idempotency_key, ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(block_s)  # noqa: ASYNC251 - blocking the event loop is the test
            returned.append(time.time())
        ledger.effect(ctx.idempotency_key)

    metrics = Metrics()
    with WorkerThread(s, TaskRegistry([blocks]), metrics=metrics):
        write(s, make_job("blocks", {}, queue=QUEUE, key="k-block"))
        outs = outcomes(s, until=lambda o: ("retrying", 1) in states_of(o, "k-block"), timeout=60)
        assert not returned, "the timeout was recorded only after the handler returned"
        (failed,) = [o for o in outs if o["state"] == "retrying"]
        assert failed["error_type"] == JOB_TIMEOUT
        assert "blocking the event loop" in failed["error"]
        (_key, _attempt, started, _pid) = ledger.runs("k-block")[0]
        recorded_after = failed["at_ms"] / 1000 - started
        # timeout + at most one interval + the watchdog's commit (a loaded machine: slack)
        assert recorded_after < TIMEOUT_S + INTERVAL_S + 3.0, recorded_after
        outs = outcomes(s, until=lambda o: ("succeeded", 2) in states_of(o, "k-block"), timeout=60)
        assert returned, "the blocked handler never came back"
        assert (
            metrics.registry.get_sample_value(
                "dueflow_worker_loop_blocked_total", {"queue": QUEUE, "task": "blocks"}
            )
            == 1
        )
    # Once timed out, once succeeded: the first attempt's late return wrote nothing.
    assert states_of(outs, "k-block") == [("retrying", 1), ("succeeded", 2)]
    assert [a for _k, a, _t, _p in ledger.runs("k-block")] == [1, 2]
    assert _key_states(s, "k-block") == ["retrying", "done"]


@pytest.mark.timeout(240)
def test_a_loop_blocked_for_good_restarts_the_process_and_its_other_jobs_run(
    procs: Processes,
) -> None:
    """A CLI worker whose handler blocks the loop for 120 s: the attempt is recorded as
    timed out while it blocks, the process restarts in place soon after, and the jobs
    that waited behind the block run once, long before the block would have ended."""
    block_s = 120.0
    s = procs.configure(partitions=2, concurrency=4)
    proc = procs.start()
    wait_members(s, 1)
    writer = ExecWriter(s)
    writer.write([make_job("block-loop-first", {"block_s": block_s}, queue=QUEUE, key="blocker")])
    writer.flush()
    wait_for("the blocking attempt to start", lambda: bool(procs.ledger.runs("blocker")), 60)
    blocked_at = procs.ledger.runs("blocker")[0][2]
    # Jobs behind the block: fetched by the blocked process, which cannot start them.
    keys = [f"q{i:02d}" for i in range(20)]
    writer.write([make_job("ledger-async", {}, queue=QUEUE, key=k) for k in keys])
    writer.flush()
    written_at = time.time()

    outs = outcomes(
        s,
        until=lambda o: (
            all(("succeeded", 1) in states_of(o, k) for k in keys)
            and ("succeeded", 2) in states_of(o, "blocker")
        ),
        timeout=90,
    )
    finished_at = time.time()
    assert proc.poll() is None, "the worker exited instead of restarting in place"
    # The other jobs did not wait for the block to end.
    assert finished_at - written_at < block_s / 2, finished_at - written_at
    (failed,) = [o for o in outs if o["idempotency_key"] == "blocker" and o["state"] == "retrying"]
    assert failed["error_type"] == JOB_TIMEOUT
    assert failed["at_ms"] / 1000 - blocked_at < TIMEOUT_S + INTERVAL_S + 3.0
    # The exec record of the first attempt is read again by the restarted process (its
    # offset moved only with the loop's next batch): a duplicate, skipped, not run.
    ran = [st for st in states_of(outs, "blocker") if st[0] != "duplicate"]
    assert ran == [("retrying", 1), ("succeeded", 2)]
    assert set(states_of(outs, "blocker")) <= {("retrying", 1), ("duplicate", 1), ("succeeded", 2)}
    # Nothing lost, nothing doubled: each job succeeded once and ran once.
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert done == Counter({k: 1 for k in [*keys, "blocker"]})
    runs = Counter(k for k, _a, _t, _p in procs.ledger.runs())
    assert runs == Counter({**{k: 1 for k in keys}, "blocker": 2})
    effects = procs.ledger.effects()
    assert all(effects[k] == 1 for k in keys)
    logs = procs.logs()
    assert "handler blocking the event loop: attempt recorded as timed out" in logs
    assert "restarting the worker process" in logs
    assert "worker process restarted in place" in logs
    assert "block-loop-first" in logs  # the log names the task


@pytest.mark.timeout(240)
def test_under_the_supervisor_a_blocked_child_exits_and_a_fresh_one_takes_its_place(
    procs: Processes,
) -> None:
    """``--processes 2``: the child whose loop stays blocked records the attempt, exits
    with 75 and the supervisor starts a fresh child; the parent's merged metrics count
    the restart; every job runs once."""
    port = _free_port()
    s = procs.configure(partitions=2, concurrency=4)
    proc = procs.start("--processes", "2", "--metrics-port", str(port))
    wait_members(s, 2)
    writer = ExecWriter(s)
    writer.write([make_job("block-loop-first", {"block_s": 120.0}, queue=QUEUE, key="blocker")])
    writer.flush()
    wait_for("the blocking attempt to start", lambda: bool(procs.ledger.runs("blocker")), 60)
    keys = [f"s{i:02d}" for i in range(20)]
    writer.write([make_job("ledger-async", {}, queue=QUEUE, key=k) for k in keys])
    writer.flush()
    outs = outcomes(
        s,
        until=lambda o: (
            all(("succeeded", 1) in states_of(o, k) for k in keys)
            and ("succeeded", 2) in states_of(o, "blocker")
        ),
        timeout=120,
    )
    assert proc.poll() is None
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert done == Counter({k: 1 for k in [*keys, "blocker"]})
    runs = Counter(k for k, _a, _t, _p in procs.ledger.runs())
    assert runs == Counter({**{k: 1 for k in keys}, "blocker": 2})
    pids = {pid for _k, _a, _t, pid in procs.ledger.runs("blocker")}
    assert len(pids) == 2  # the retry ran in another process than the blocked one
    logs = procs.logs()
    assert "worker process asked to restart; restarting it" in logs
    assert "worker processes keep dying" not in logs
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r'dueflow_worker_restarts_total\{reason="blocked_loop"\} (\S+)', text)
    assert found is not None, text
    assert float(found.group(1)) == 1.0
    proc.send_signal(signal.SIGTERM)  # the supervisor stops its children
    assert proc.wait(60) == 0


@pytest.mark.timeout(240)
def test_a_process_past_max_memory_restarts_after_its_job_and_loses_nothing(
    procs: Processes,
) -> None:
    """A sync handler leaks 400 MiB in a process limited to 300 MiB: its job succeeds
    once, the process finishes, commits, leaves and restarts (in place), and the jobs
    after it run once, in the fresh process (small again)."""
    limit = 300 * 2**20
    port = _free_port()
    s = procs.configure(partitions=2, concurrency=2)
    proc = procs.start("--max-memory", "300MiB", "--metrics-port", str(port))
    wait_members(s, 1)
    writer = ExecWriter(s)
    writer.write([make_job("grow-memory", {"mb": 400}, queue=QUEUE, key="hog")])
    writer.flush()
    outcomes(s, until=lambda o: ("succeeded", 1) in states_of(o, "hog"), timeout=90)
    wait_for(
        "the restart",
        lambda: "worker process restarted in place" in procs.logs(),
        90,
    )
    keys = [f"m{i:02d}" for i in range(10)]
    writer.write([make_job("ledger-async", {}, queue=QUEUE, key=k) for k in keys])
    writer.flush()
    outs = outcomes(
        s, until=lambda o: all(("succeeded", 1) in states_of(o, k) for k in keys), timeout=90
    )
    assert proc.poll() is None
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert done == Counter({k: 1 for k in [*keys, "hog"]})
    assert Counter(k for k, _a, _t, _p in procs.ledger.runs()) == Counter(
        {**{k: 1 for k in keys}, "hog": 1}
    )
    marks = dict((k, v) for k, v, _t in procs.ledger.marks())
    assert marks["hog"] >= limit  # the hog did pass the limit
    for k in keys:
        assert marks[k] < limit, (k, marks[k])  # later jobs ran in a fresh process
    logs = procs.logs()
    assert "worker memory past max_memory: finishing its jobs, then restarting" in logs
    # The new image counts the restart of the one before it.
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r'dueflow_worker_restarts_total\{reason="memory"\} (\S+)', text)
    assert found is not None, text
    assert float(found.group(1)) == 1.0


@pytest.mark.timeout(240)
def test_a_job_that_grows_past_the_hard_ceiling_fails_and_ends_in_the_dlq(
    procs: Processes,
) -> None:
    """A sync handler that allocates without end, alone in its process (max_memory
    150 MiB, ceiling 300 MiB): at the ceiling its attempt fails (it ran alone: the
    cause) and the process restarts at once; its retry does the same and the job is
    dead-lettered, not restarted for ever. A job after it runs once."""
    s = procs.configure(partitions=2, concurrency=2)
    proc = procs.start("--max-memory", "150MiB")
    wait_members(s, 1)
    writer = ExecWriter(s)
    writer.write([make_job("grow-without-end", {"cap_mb": 800}, queue=QUEUE, key="greedy")])
    writer.flush()
    outs = outcomes(s, until=lambda o: ("dead", 2) in states_of(o, "greedy"), timeout=150)
    assert [st for st in states_of(outs, "greedy") if st[0] != "duplicate"] == [
        ("retrying", 1),
        ("dead", 2),
    ]
    for o in outs:
        if o["idempotency_key"] == "greedy" and o["state"] in ("retrying", "dead"):
            assert o["error_type"] == MEMORY_EXCEEDED
    (dead,) = read_topic(s, names(s).dlq(QUEUE), until=lambda r: len(r) >= 1, timeout=30)
    assert dead.key == b"greedy"
    writer.write([make_job("ledger-async", {}, queue=QUEUE, key="after")])
    writer.flush()
    outs = outcomes(s, until=lambda o: ("succeeded", 1) in states_of(o, "after"), timeout=90)
    assert proc.poll() is None
    assert [a for _k, a, _t, _p in procs.ledger.runs("greedy")] == [1, 2]
    assert [a for _k, a, _t, _p in procs.ledger.runs("after")] == [1]
    logs = procs.logs()
    assert logs.count("worker memory past its ceiling: abandoning its jobs and restarting") == 2
    assert logs.count("worker process restarted in place  reason=memory_ceiling") == 2
