"""Worker processes started with the CLI: kill -9, rate limits across processes, signals.

Every process a test starts is stopped by pid in teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from dueflow import headers as hdr
from dueflow.config import Settings, load_settings
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind
from dueflow.records.worker_codec import decode_key_state
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    Ledger,
    ensure_topics,
    outcomes_of,
    read_topic,
    wait_for,
)

QUEUE = "jobs"
ROOT = Path(__file__).resolve().parents[2]


class Processes:
    """CLI worker processes of one test (stopped by pid at the end)."""

    def __init__(self, kafka: KafkaCluster, prefix: str, tmp_path: Path) -> None:
        self.kafka = kafka
        self.prefix = prefix
        self.tmp = tmp_path
        self.ledger = Ledger(tmp_path / "ledger.db")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.config = tmp_path / "dueflow.toml"

    def configure(
        self,
        *,
        partitions: int = 6,
        rate: float | None = None,
        tiers_ms: tuple[int, ...] = (200, 500),
        **worker: Any,
    ) -> Settings:
        lines = [
            "[[queues]]",
            f'name = "{QUEUE}"',
            f"partitions = {partitions}",
            f"retry_tiers_ms = {list(tiers_ms)}",
        ]
        if rate is not None:
            lines.append(f"rate_limit_per_s = {rate}")
        lines.append("[worker]")
        values = {
            "session_timeout_ms": 3000,
            "transaction_timeout_ms": 5000,
            "commit_interval_ms": 50,
            **worker,
        }
        lines += [f"{k} = {v!r}" for k, v in values.items()]
        lines += ["[observability]", 'log_format = "text"']
        self.config.write_text("\n".join(lines) + "\n")
        settings = load_settings(config_file=self.config, env=self.env())
        ensure_topics(settings)
        return settings

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DUEFLOW_BOOTSTRAP": self.kafka.bootstrap,
            "DUEFLOW_TOPIC_PREFIX": self.prefix,
            "DUEFLOW_CONFIG": str(self.config),
            "DUEFLOW_TEST_LEDGER": str(self.ledger.path),
            "PYTHONPATH": str(ROOT),
        }

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with (self.tmp / f"worker-{len(self.procs)}.log").open("wb") as log:
            proc = self._popen(log, args)
        self.procs.append(proc)
        return proc

    def _popen(self, log: Any, args: tuple[str, ...]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dueflow",
                "worker",
                "--app",
                "tests.integration.worker_app",
                "--queues",
                QUEUE,
                *args,
            ],
            env=self.env(),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.tmp.glob("worker-*.log"))
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                # A supervisor's children run in process groups of their own: by pid.
                children = _descendants(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and any children it started
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait(10)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc), children first."""
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after ")"
            text = stat.read_text()
            parent_of[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = [child for child, parent in parent_of.items() if parent in frontier]
        found += below
        frontier = below
    return found


@pytest.fixture
def procs(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(kafka, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def group_assignment(settings: Settings) -> dict[str, list[tuple[str, int]]]:
    """Member id -> assigned partitions of the queue's worker group (when it is stable)."""
    admin = AdminClient(settings.client_config())
    group = names(settings).worker_group(QUEUE)
    try:
        desc = admin.describe_consumer_groups([group])[group].result(10)
    except Exception:  # coordinator not ready yet (e.g. a broker that just started): not stable
        return {}
    if str(desc.state).split(".")[-1].upper() != "STABLE":
        return {}
    return {
        m.member_id: sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
        for m in desc.members
    }


def wait_members(settings: Settings, count: int) -> None:
    def ok() -> bool:
        members = group_assignment(settings)
        return len(members) == count and all(members.values())

    wait_for(f"{count} group members with partitions", ok, 90)


def succeeded(settings: Settings, n: int, timeout: float = 120) -> list[dict[str, Any]]:
    records = read_topic(
        settings,
        names(settings).outcomes,
        until=lambda r: (
            len({o["idempotency_key"] for o in outcomes_of(r) if o["state"] == "succeeded"}) >= n
        ),
        timeout=timeout,
    )
    return outcomes_of(records)


@pytest.mark.timeout(300)
def test_kill_9_of_one_of_two_workers_loses_nothing_and_reruns_only_uncommitted_jobs(
    procs: Processes,
) -> None:
    s = procs.configure(concurrency=8)
    victim = procs.start()
    survivor = procs.start()
    wait_members(s, 2)
    n = 400
    # Every 10th job is slow: a partition's committed offset then lags behind
    # jobs already done, and those are redelivered after the kill.
    jobs = [
        make_job(
            "ledger-effect",
            {"sleep_s": 1.0 if i % 10 == 0 else 0.005},
            queue=QUEUE,
            key=f"k{i:04d}",
        )
        for i in range(n)
    ]
    writer = ExecWriter(s)
    writer.write(jobs)
    writer.flush()
    wait_for(
        "the victim to be busy",
        lambda: sum(1 for _, _, _, pid in procs.ledger.runs() if pid == victim.pid) >= 60,
        90,
    )
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    outs = succeeded(s, n, timeout=180)
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(60) == 0

    keys = {j.idempotency_key for j in jobs}
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert set(done) == keys  # nothing lost
    assert set(done.values()) == {1}  # Kafka saw each job succeed exactly once
    idem = read_topic(s, names(s).idempotency(QUEUE))
    states = Counter(
        (r.key.decode(), decode_key_state(r.value, r.headers.get(hdr.SCHEMA))[0])
        for r in idem
        if r.key and r.value
    )
    assert states == Counter({(k, "done"): 1 for k in keys})

    committed_by = {
        o["idempotency_key"]: int(o["worker"].rsplit(":", 1)[1])
        for o in outs
        if o["state"] == "succeeded"
    }
    runs: dict[str, list[int]] = {}
    for key, _attempt, _at, pid in procs.ledger.runs():
        runs.setdefault(key, []).append(pid)
    effects = procs.ledger.effects()
    by_victim = [k for k, pid in committed_by.items() if pid == victim.pid]
    assert by_victim, "the victim committed nothing before it was killed"
    for key in by_victim:
        assert runs[key] == [victim.pid], key  # committed: never run again
    reruns = [k for k, pids in runs.items() if len(pids) > 1]
    for key in reruns:
        # Only what the victim ran without committing runs again, once, on the survivor.
        assert runs[key] == [victim.pid, survivor.pid], key
        assert committed_by[key] == survivor.pid
        # 2 when the victim died after its effect, 1 when it died before it
        assert effects[key] in (1, 2), key
    assert len(reruns) < n // 4
    for key in keys - set(reruns):
        assert effects[key] == 1, key
    skipped = [o for o in outs if o["state"] == "duplicate"]
    assert skipped, "no redelivered job was skipped by idempotency"
    for o in skipped:
        assert len(runs[o["idempotency_key"]]) == 1  # skipped, not run again


@pytest.mark.timeout(300)
def test_a_worker_stopped_past_its_session_starts_nothing_it_held_after_sigcont(
    procs: Processes,
) -> None:
    """Each partition: a job due now, then jobs due 10 s later (held by the worker
    that fetched them). SIGSTOP one worker until the other has run and committed
    every job, then SIGCONT it: its hold timers are overdue at once, and it must
    start none of the records it still holds (it was expelled while stopped and
    learns so only from its next heartbeat)."""
    partitions = 6
    s = procs.configure(partitions=partitions, concurrency=2)
    victim = procs.start()
    survivor = procs.start()
    wait_members(s, 2)
    due = int(time.time() * 1000) + 10_000
    writer = ExecWriter(s)
    held: list[str] = []
    for p in range(partitions):
        writer.write([make_job("ledger-effect", {}, queue=QUEUE, key=f"now-{p}")], partition=p)
        keys = [f"held-{p}-{i}" for i in range(5)]
        writer.write(
            (make_job("ledger-effect", {}, queue=QUEUE, key=k, due_ms=due) for k in keys),
            partition=p,
        )
        held += keys
    writer.flush()

    def runs_of(pid: int) -> list[tuple[str, float]]:
        return [(key, at) for key, _, at, run_pid in procs.ledger.runs() if run_pid == pid]

    # Both ran their partitions' first jobs: the held ones came in the same fetch.
    wait_for(
        "both workers to run their first jobs",
        lambda: len(procs.ledger.runs()) == partitions and bool(runs_of(victim.pid)),
        60,
    )
    assert time.time() * 1000 < due - 3000, "too slow to stop the victim before the due time"
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        outs = succeeded(s, partitions + len(held), timeout=120)  # all, by the survivor
        resumed_at = time.time()
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    wait_members(s, 2)  # the victim heard it was expelled and joined again

    late = [key for key, at in runs_of(victim.pid) if at >= resumed_at]
    assert late == [], f"the resumed worker started {len(late)} jobs it no longer owned"
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert set(done) >= set(held)
    assert set(done.values()) == {1}
    effects = procs.ledger.effects()
    assert all(effects[k] == 1 for k in held)  # (a first job may run twice: uncommitted)
    assert {k for k, _ in runs_of(survivor.pid)} >= set(held)
    survivor.send_signal(signal.SIGTERM)
    victim.send_signal(signal.SIGTERM)
    assert survivor.wait(60) == 0
    assert victim.wait(60) == 0


@pytest.mark.timeout(300)
def test_an_attempt_handed_on_to_a_retry_never_runs_again_on_the_next_owner(
    procs: Processes,
) -> None:
    """One partition: a slow job, then a job whose first attempt fails (its retry
    waits 15 s in a tier). Its `retrying` commits while the slow job still runs,
    so the committed offset stays behind it. kill -9 that worker: the next owner
    reads both again, runs the slow one again (never committed), but must not
    run the failed attempt again: it was handed on, and its retry runs once."""
    s = procs.configure(partitions=1, concurrency=4, tiers_ms=(200, 500, 30_000))
    workers = [procs.start(), procs.start()]
    wait_for("both workers in the group", lambda: len(group_assignment(s)) == 2, 90)
    slow = make_job("ledger-effect", {"sleep_s": 8.0}, queue=QUEUE, key="slow")
    flaky = make_job(
        "fails-once",
        {},
        queue=QUEUE,
        key="flaky",
        backoff=Backoff(kind=BackoffKind.FIXED, base_ms=15_000, max_ms=15_000, jitter=False),
    )
    writer = ExecWriter(s)
    writer.write([slow, flaky], partition=0)
    writer.flush()

    def states(records: list[Any], key: str) -> list[tuple[str, int]]:
        return [
            (o["state"], o["attempt"]) for o in outcomes_of(records) if o["idempotency_key"] == key
        ]

    def wait_outcome(key: str, state: str, attempt: int, timeout: float) -> list[Any]:
        return read_topic(
            s,
            names(s).outcomes,
            until=lambda r: (state, attempt) in states(r, key),
            timeout=timeout,
        )

    wait_outcome("flaky", "retrying", 1, 60)  # committed while the slow job runs
    ((_, _, _, owner),) = procs.ledger.runs("slow")  # running on the partition's owner
    first, second = sorted(workers, key=lambda p: p.pid != owner)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    wait_outcome("flaky", "succeeded", 2, 90)
    records = wait_outcome("slow", "succeeded", 1, 60)

    # The next owner read the partition again from behind the handed-on attempt.
    assert [pid for _, _, _, pid in procs.ledger.runs("slow")] == [first.pid, second.pid]
    attempts = Counter(attempt for _, attempt, _, _ in procs.ledger.runs("flaky"))
    assert attempts == Counter({1: 1, 2: 1}), attempts  # attempt 1 was never run again
    assert procs.ledger.effects()["flaky"] == 1
    assert ("duplicate", 1) in states(records, "flaky")  # the redelivered attempt 1, skipped
    second.send_signal(signal.SIGTERM)
    assert second.wait(60) == 0


@pytest.mark.timeout(300)
def test_a_queue_rate_limit_holds_across_two_processes(procs: Processes) -> None:
    rate = 30.0
    s = procs.configure(rate=rate, concurrency=16)
    supervisor = procs.start("--processes", "2")
    wait_members(s, 2)
    n = 330
    writer = ExecWriter(s)
    writer.write(make_job("ledger-effect", {}, queue=QUEUE) for _ in range(n))
    writer.flush()
    wait_for("every job", lambda: len(procs.ledger.effects()) == n, 120)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0

    runs = procs.ledger.runs()
    by_pid: dict[int, list[float]] = {}
    for _key, _attempt, at, pid in runs:
        by_pid.setdefault(pid, []).append(at)
    assert len(by_pid) == 2, "both processes ran jobs"
    # Measure while both processes run jobs (each owns half the partitions).
    start = max(min(t) for t in by_pid.values()) + 0.5
    end = min(max(t) for t in by_pid.values()) - 0.5
    assert end - start > 5
    inside = sum(1 for _, _, at, _ in runs if start <= at <= end)
    measured = inside / (end - start)
    assert abs(measured - rate) <= 0.1 * rate, f"{measured:.1f} jobs/s, limit {rate}"


def test_sigterm_drains_and_a_second_signal_exits_at_once(procs: Processes) -> None:
    s = procs.configure(partitions=1, shutdown_grace_s=30.0)
    worker = procs.start()
    wait_members(s, 1)
    writer = ExecWriter(s)
    writer.write([make_job("ledger-effect", {"sleep_s": 1.5}, queue=QUEUE, key="k-drained")])
    writer.flush()
    wait_for("the job running", lambda: len(procs.ledger.runs()) == 1)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert procs.ledger.effects() == {"k-drained": 1}  # finished during the drain
    (out,) = [o for o in outcomes_of(read_topic(s, names(s).outcomes)) if o["state"] == "succeeded"]
    assert out["idempotency_key"] == "k-drained"

    worker = procs.start()
    wait_members(s, 1)
    writer.write([make_job("ledger-effect", {"sleep_s": 60}, queue=QUEUE, key="k-forced")])
    writer.flush()
    wait_for("the long job running", lambda: len(procs.ledger.runs("k-forced")) == 1)
    worker.send_signal(signal.SIGTERM)
    wait_for("the drain to begin", lambda: procs.logs().count("shutting down") == 2)
    began = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 128 + signal.SIGTERM
    assert time.monotonic() - began < 5
    assert "k-forced" not in procs.ledger.effects()
    assert "second signal" in procs.logs()


def test_the_supervisor_gives_up_on_children_that_die_at_start(procs: Processes) -> None:
    procs.configure(partitions=1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dueflow",
            "worker",
            "--app",
            "tests.integration.child_refusing_app",
            "--queues",
            QUEUE,
            "--processes",
            "2",
        ],
        env=procs.env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    procs.procs.append(proc)
    _out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1
    assert b"keep dying at start" in err
    assert b"will not load in a worker child" in err  # the children said why
