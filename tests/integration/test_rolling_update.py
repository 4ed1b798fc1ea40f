"""A rolling update of the whole pipeline under load, done as Kubernetes does it.

Kubernetes replaces a Deployment's pods one at a time (maxSurge 1,
maxUnavailable 0, as deploy/kubernetes renders them): it starts the new pod,
waits until its readiness probe passes, then sends the old one SIGTERM and,
after terminationGracePeriodSeconds, SIGKILL. Here two emitters and two
workers, real processes, are replaced that way twice over (eight
replacements, emitters and workers in turn, the active emitter among them)
while a client schedules jobs due 0.2-3 s ahead, and each job works 20-120 ms
(so jobs are in flight at every SIGTERM). Then: every job ran exactly once
(0 duplicates), none started before its due time (0 early), every one
succeeded (0 lost), every old process left by itself within its grace period,
and the takeover times are printed (SIGTERM of the active emitter to the
next one's first fire; SIGTERM of a worker to its partitions assigned
elsewhere).

The worker rolling restart with 15 s jobs and the emitter kill -9 are
tests/integration/test_worker_rolling_restart.py and test_emitter_failover.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.ports import free_port
from dueflow.kafka.topics import names
from dueflow.producers import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, Proc, wait_for
from tests.integration.rollout_app import RunLog
from tests.integration.test_health_probes import status_of
from tests.integration.worker_support import outcomes_of, read_topic

APP = "tests.integration.rollout_app"
ROUNDS = 2
# What Kubernetes would give each pod (the rendered manifests derive theirs).
EMITTER_GRACE_S = 20.0
WORKER_GRACE_S = 25.0


def _wall_ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


class Load:
    """Schedules jobs at about ``rate`` a second on a thread until stopped."""

    def __init__(self, p: Pipeline, rate: int) -> None:
        self.p = p
        self.rate = rate
        self.jobs: dict[str, int] = {}  # job id -> due (ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with Scheduler(self.p.settings) as s:
                i = 0
                while not self._stop.is_set():
                    for _ in range(self.rate // 10):
                        delay_ms = 200 + (i * 137) % 2800
                        job = s.schedule(
                            "rollout-job",
                            {"work_ms": 20 + (i * 31) % 100},
                            queue=QUEUE,
                            delay=delay_ms / 1000,
                        )
                        self.jobs[job.job_id] = job.due_ms
                        i += 1
                    self._stop.wait(0.1)  # the load's pace, not a synchronization
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise self.error


class Rollout:
    """Processes by role, replaced as a Deployment's rolling update replaces pods."""

    def __init__(self, p: Pipeline, runs: Path) -> None:
        self.p = p
        self.env = {"DUEFLOW_TEST_RUNS": str(runs)}
        self.ports: dict[int, int] = {}  # pid -> metrics port
        self.serial = 0
        self.report: list[dict[str, Any]] = []

    def start(self, role: str) -> Proc:
        self.serial += 1
        port = free_port()
        name = f"{role}-{self.serial}"
        if role == "emitter":
            proc = self.p.start(name, "emitter", "--metrics-port", str(port), env=self.env)
        else:
            proc = self.p.start(
                name,
                "worker",
                "--app",
                APP,
                "--queues",
                QUEUE,
                "--metrics-port",
                str(port),
                env=self.env,
            )
        self.ports[proc.pid] = port
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 90) -> None:
        port = self.ports[proc.pid]
        wait_for(f"{proc.name} ready", lambda: status_of(port, "/readyz") == 200, timeout)

    def replace(
        self, old: Proc, role: str, grace_s: float, others: Callable[[], list[Proc]]
    ) -> Proc:
        """Start the new one, wait until it is ready, SIGTERM the old one, wait up to
        the grace period (a SIGKILL after it fails the test)."""
        new = self.start(role)
        self.wait_ready(new)
        active = role == "emitter" and _is_active(old)
        term_ms = time.time_ns() // 1_000_000
        term = time.monotonic()
        os.kill(old.pid, signal.SIGTERM)
        try:
            code = old.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old.pid, signal.SIGKILL)
            old.popen.wait(10)
            raise AssertionError(f"{old.name} outlived its grace period of {grace_s} s") from None
        assert code == 0, f"{old.name} exited with {code}\n{old.log()[-3000:]}"
        row: dict[str, Any] = {
            "replaced": old.name,
            "by": new.name,
            "exit_s": round(time.monotonic() - term, 2),
        }
        remaining = [new, *(proc for proc in others() if proc is not old)]
        if active:
            row["takeover_s"] = _emitter_takeover_s(remaining, term_ms)
        elif role == "worker":
            row["takeover_s"] = _worker_takeover_s(remaining, term_ms)
        self.report.append(row)
        return new


def _spread(values: list[int]) -> str:
    if not values:
        return "-"
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values):.0f} p99 {p99} max {values[-1]} (n {len(values)})"


def _is_active(proc: Proc) -> bool:
    role = None
    for e in proc.json_lines():
        if e.get("event") == "emitter is active":
            role = "active"
        elif e.get("event") == "emitter is standby":
            role = "standby"
    return role == "active"


def _first_after(procs: list[Proc], event: str, after_ms: int, timeout: float = 30) -> int:
    def found() -> int | None:
        times = [
            _wall_ms(e["ts"])
            for proc in procs
            for e in proc.events(event)
            if _wall_ms(e["ts"]) >= after_ms
        ]
        return min(times) if times else None

    return int(wait_for(f"'{event}' after the SIGTERM", found, timeout))


def _emitter_takeover_s(others: list[Proc], term_ms: int) -> float:
    """SIGTERM of the active emitter until another one reads as the active one."""
    return round((_first_after(others, "emitter reading", term_ms) - term_ms) / 1000, 2)


def _worker_takeover_s(others: list[Proc], term_ms: int) -> float:
    """SIGTERM of a worker until its partitions were assigned to the others."""
    return round((_first_after(others, "partitions assigned", term_ms) - term_ms) / 1000, 2)


@pytest.mark.timeout(240)
def test_rolling_updates_of_emitters_and_workers_under_load_lose_duplicate_and_rush_nothing(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    p = Pipeline(kafka.bootstrap, prefix, tmp_path)
    runs = tmp_path / "runs.db"
    log = RunLog(runs)
    rollout = Rollout(p, runs)
    started = time.monotonic()
    try:
        emitters = [rollout.start("emitter"), rollout.start("emitter")]
        workers = [rollout.start("worker"), rollout.start("worker")]
        for proc in emitters + workers:
            rollout.wait_ready(proc)
        with Load(p, rate=60) as load:
            wait_for("jobs running", lambda: len(log.runs()) > 200, 60)
            rollout_from = time.time_ns() // 1_000_000
            for _round in range(ROUNDS):
                for i in range(2):
                    emitters[i] = rollout.replace(
                        emitters[i], "emitter", EMITTER_GRACE_S, lambda: list(emitters)
                    )
                    workers[i] = rollout.replace(
                        workers[i], "worker", WORKER_GRACE_S, lambda: list(workers)
                    )
            load.stop()
        jobs = load.jobs
        assert len(jobs) > 500, len(jobs)

        def all_succeeded(records: list[Any]) -> bool:
            done = {o["job_id"] for o in outcomes_of(records) if o["state"] == "succeeded"}
            return done >= set(jobs)

        outs = outcomes_of(
            read_topic(p.settings, names(p.settings).outcomes, until=all_succeeded, timeout=90)
        )
        succeeded = Counter(o["job_id"] for o in outs if o["state"] == "succeeded")
        lost = set(jobs) - set(succeeded)
        ran = Counter(job_id for job_id, *_ in log.runs())
        duplicates = {j: n for j, n in ran.items() if n > 1}
        early = [(job_id, due, start) for job_id, _a, due, start, _pid in log.runs() if start < due]
        before = sorted(s - d for _j, _a, d, s, _p in log.runs() if d < rollout_from)
        during = sorted(s - d for _j, _a, d, s, _p in log.runs() if d >= rollout_from)
        print(
            f"\nrolling update: {len(jobs)} jobs, {len(rollout.report)} replacements in "
            f"{time.monotonic() - started:.0f} s; lost {len(lost)}, duplicates "
            f"{len(duplicates)}, early {len(early)}; start - due (ms) before the rollout "
            f"{_spread(before)}, during it {_spread(during)}"
        )
        for row in rollout.report:
            print("  ", row)
        assert not lost, f"lost {len(lost)} jobs, e.g. {sorted(lost)[:5]}\n{p.logs()}"
        assert not duplicates, f"ran twice: {list(duplicates.items())[:5]}"
        assert set(succeeded.values()) == {1}, "a job succeeded twice on the outcomes topic"
        assert set(ran) == set(jobs)
        assert not early, f"started before due: {early[:5]}"
        assert not [o for o in outs if o["state"] in ("retrying", "dead")]
        takeovers = [r["takeover_s"] for r in rollout.report if "takeover_s" in r]
        assert len(takeovers) >= 2 * ROUNDS + 1  # every worker, and the active emitter(s)
        assert "abandoning" not in p.logs(), "a job was abandoned at a SIGTERM"
    finally:
        p.stop_all()
