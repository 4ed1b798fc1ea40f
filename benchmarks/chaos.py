"""Chaos: try to lose, double or run early a job while processes and the broker die.

::

    python -m benchmarks.chaos --minutes 3 --json chaos.json [--seed 7] [--dir DIR]

Starts its own broker (a local KRaft broker on a free port, in a temporary
directory, so it may stop and kill it), the topics with a small wheel, two
emitters and three workers (real ``python -m dueflow`` processes running
``tests/chaos/handlers.py``), and schedules a workload for ``--minutes``:
one-shot jobs all over the wheel, flaky jobs, jobs that must end in the DLQ,
cron schedules firing every few seconds. Meanwhile, at random times, it
kill -9s the active emitter, kill -9s workers, restarts the broker (SIGTERM
or kill -9, same data), and adds and removes workers (rebalances).

Then it waits until every job has finished (or a deadline passes) and
judges from the handlers' SQLite ledger, the committed outcomes and the
DLQ: ``lost``, ``duplicates``, ``early`` (must all be 0), ``dlq``,
``reexecutions`` (at-least-once handler runs after a kill, informational),
and the faults injected by kind. Every process it started is stopped by pid
at the end, also on failure. Exit code 1 when a guarantee was broken.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dueflow import headers as hdr
from dueflow.errors import DueflowError, UndecodableRecord
from dueflow.ops.dlq import read_dead_letters
from dueflow.ops.reading import Span, ops_consumer, partitions_of, read_spans, watermarks
from dueflow.schemas import codec
from dueflow.topics import names
from tests.chaos.cluster import QUEUE, ChaosCluster, Child
from tests.chaos.ledger import Ledger
from tests.chaos.verdict import Evidence, judge
from tests.chaos.workload import Workload, plan_jobs

# relative weights of the fault kinds
FAULTS = {
    "kill_active_emitter": 3.0,
    "kill_worker": 3.0,
    "restart_broker": 1.2,
    "kill9_broker": 0.8,
    "add_worker": 1.5,
    "remove_worker": 1.5,
}
MIN_WORKERS, MAX_WORKERS = 1, 4
BROKER_FAULTS = frozenset({"restart_broker", "kill9_broker"})
MIN_GAP_S = 2.0  # between faults
BROKER_QUIET_S = 20.0  # no broker fault this soon after the last one


def log(message: str) -> None:
    sys.stderr.write(f"[chaos {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


class FaultDriver:
    """Injects faults at random times until ``end_at`` (monotonic)."""

    def __init__(
        self, cluster: ChaosCluster, rng: random.Random, *, end_at: float, target: int
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.end_at = end_at
        self.target = target
        self.faults: list[dict[str, Any]] = []
        self.unexpected: list[dict[str, Any]] = []
        self._pending: list[tuple[float, str]] = []  # (when, role) to start
        self._broker_quiet_until = 0.0
        self._began = time.monotonic()

    def run(self) -> None:
        next_at = time.monotonic() + self._gap()
        while time.monotonic() < self.end_at:
            self.housekeep()
            if time.monotonic() >= next_at:
                kind = self._choose()
                self.inject(kind)
                if kind in BROKER_FAULTS:
                    self._broker_quiet_until = time.monotonic() + BROKER_QUIET_S
                next_at = time.monotonic() + self._gap()
            time.sleep(0.1)

    def _gap(self) -> float:
        left = max(0.0, self.end_at - time.monotonic())
        owed = max(1, self.target - len(self.faults))
        return max(MIN_GAP_S, self.rng.uniform(0.4, 1.4) * left / owed)

    def _planned(self, role: str) -> int:
        live = self.cluster.workers if role == "worker" else self.cluster.emitters
        return len(live) + sum(1 for _, r in self._pending if r == role)

    def _choose(self) -> str:
        kinds = [
            k
            for k in FAULTS
            if k not in BROKER_FAULTS or time.monotonic() >= self._broker_quiet_until
        ]
        kind = self.rng.choices(kinds, weights=[FAULTS[k] for k in kinds])[0]
        workers = self._planned("worker")
        if kind == "add_worker" and workers >= MAX_WORKERS:
            kind = "remove_worker"
        if kind == "remove_worker" and workers <= MIN_WORKERS:
            kind = "add_worker"
        if kind == "kill_worker" and not self.cluster.workers:
            kind = "add_worker"
        if kind == "kill_active_emitter" and not self.cluster.emitters:
            kind = "kill_worker" if self.cluster.workers else "add_worker"
        return kind

    def inject(self, kind: str) -> None:
        began = time.monotonic()
        detail = ""
        c = self.cluster
        if kind == "kill_active_emitter":
            victim = c.active_emitter()
            detail = "active" if victim is not None else "no lease holder seen: any"
            if victim is None and c.emitters:
                victim = self.rng.choice(c.emitters)
            if victim is not None:
                c.kill(victim)
                detail += f" {victim.name}"
            self._pending.append((time.monotonic() + self.rng.uniform(0.5, 3.0), "emitter"))
        elif kind == "kill_worker":
            victim = self.rng.choice(c.workers)
            c.kill(victim)
            detail = victim.name
            self._pending.append((time.monotonic() + self.rng.uniform(0.0, 5.0), "worker"))
        elif kind in ("restart_broker", "kill9_broker"):
            down = c.restart_broker(kill=kind == "kill9_broker")
            detail = f"unavailable {down:.1f} s"
        elif kind == "add_worker":
            detail = c.start_worker().name
        elif kind == "remove_worker":
            victim = self.rng.choice(c.workers)
            code = c.terminate(victim)
            detail = f"{victim.name} exit {code}"
        self.faults.append(
            {
                "kind": kind,
                "at_s": round(began - self._began, 1),
                "took_s": round(time.monotonic() - began, 1),
                "detail": detail,
            }
        )
        log(f"fault {len(self.faults)}: {kind} ({detail})")

    def housekeep(self) -> None:
        """Start what is due to start; replace processes that died on their own."""
        now = time.monotonic()
        due = [p for p in self._pending if p[0] <= now]
        self._pending = [p for p in self._pending if p[0] > now]
        for _, role in due:
            (self.cluster.start_worker if role == "worker" else self.cluster.start_emitter)()
        for child in self.cluster.unexpected_exits():
            self._record_exit(child)
            (self.cluster.start_worker if child.role == "worker" else self.cluster.start_emitter)()

    def _record_exit(self, child: Child) -> None:
        info = {
            "name": child.name,
            "code": child.popen.returncode,
            "log_tail": child.log_tail(15),
        }
        self.unexpected.append(info)
        log(f"UNEXPECTED EXIT {child.name} code {info['code']}:\n{info['log_tail']}")

    def settle(self, *, emitters: int, workers: int) -> None:
        """After the faults: everything pending started, at least the given counts run."""
        for _, role in self._pending:
            (self.cluster.start_worker if role == "worker" else self.cluster.start_emitter)()
        self._pending = []
        while len(self.cluster.emitters) < emitters:
            self.cluster.start_emitter()
        while len(self.cluster.workers) < workers:
            self.cluster.start_worker()


# ------------------------------------------------------------------------ evidence


def read_outcomes(cluster: ChaosCluster) -> Counter[str]:
    """Committed ``succeeded`` outcomes per idempotency key."""
    consumer = ops_consumer(cluster.settings)
    topic = names(cluster.settings).outcomes
    succeeded: Counter[str] = Counter()

    def take(msg: Any) -> None:
        try:
            version = codec.parse_schema_header(
                hdr.header(msg.headers(), hdr.SCHEMA), expected="outcome"
            )
            out = codec.decode("outcome", msg.value() or b"", writer_version=version)
        except UndecodableRecord:
            return
        if out["state"] == "succeeded":
            succeeded[out["idempotency_key"]] += 1

    try:
        parts = partitions_of(consumer, topic)
        marks = watermarks(consumer, topic, parts)
        read_spans(consumer, [Span(topic, p, lo, hi) for p, (lo, hi) in marks.items()], take)
    finally:
        consumer.close()
    return succeeded


def read_dlq(cluster: ChaosCluster) -> dict[str, list[str]]:
    consumer = ops_consumer(cluster.settings)
    try:
        entries = read_dead_letters(cluster.settings, consumer, QUEUE)
    finally:
        consumer.close()
    out: dict[str, list[str]] = {}
    for e in entries:
        out.setdefault(e.idempotency_key or "?", []).append(e.reason)
    return out


def gather(
    cluster: ChaosCluster, ledger: Ledger, workload: Workload, *, outcomes: bool
) -> Evidence:
    return Evidence(
        accepted=list(workload.accepted),
        cron=list(workload.cron),
        runs=ledger.runs(),
        effects=ledger.effect_keys(),
        effect_conflicts=ledger.conflicts(),
        succeeded=read_outcomes(cluster) if outcomes else {},
        dead_letters=read_dlq(cluster),
    )


def wait_cron_caught_up(
    ledger: Ledger, workload: Workload, driver: FaultDriver, *, timeout_s: float
) -> bool:
    """Until every cron schedule has run an occurrence of the last few seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        driver.housekeep()
        newest: dict[str, int] = {}
        for key in ledger.effect_keys():
            sid, sep, at = key.partition("@")
            if sep and at.isdigit():
                newest[sid] = max(newest.get(sid, 0), int(at))
        horizon = int(time.time() * 1000) - 6_000
        if all(newest.get(sid, 0) >= horizon for sid in workload.cron_ids()):
            return True
        time.sleep(1.0)
    log("cron schedules did not catch up in time")
    return False


def wait_finished(
    cluster: ChaosCluster,
    ledger: Ledger,
    workload: Workload,
    driver: FaultDriver,
    *,
    timeout_s: float,
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        driver.housekeep()
        try:
            lost = judge(gather(cluster, ledger, workload, outcomes=False))["lost"]
        except DueflowError as exc:
            log(f"reading evidence failed ({exc}); again")
            lost = -1
        if lost == 0:
            return True
        log(f"waiting for {lost} jobs to finish")
        time.sleep(3.0)
    return False


# ---------------------------------------------------------------------------- run


def run_chaos(
    *,
    minutes: float,
    root: Path,
    seed: int,
    rate_per_s: float = 8.0,
    faults_per_minute: float = 10.0,
    min_faults: int = 20,
    workers: int = 3,
    on_ready: Callable[[ChaosCluster], None] | None = None,
) -> dict[str, Any]:
    """One chaos run in ``root``; returns the report (see the module docstring)."""
    rng = random.Random(seed)
    duration = minutes * 60.0
    ledger_path = root / "ledger.sqlite"
    ledger = Ledger(ledger_path)
    cluster = ChaosCluster(root, ledger=ledger_path)
    started = time.monotonic()
    try:
        cluster.start_broker()
        cluster.ensure_topics()
        for _ in range(2):
            cluster.start_emitter()
        for _ in range(workers):
            cluster.start_worker()
        deadline = time.monotonic() + 90
        while cluster.active_emitter() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no emitter became active")
            time.sleep(0.5)
        if on_ready is not None:
            on_ready(cluster)
        plan = plan_jobs(
            rng=random.Random(rng.random()), duration_s=duration, rate_per_s=rate_per_s
        )
        log(f"broker {cluster.broker.bootstrap}, {len(plan)} one-shot jobs over {duration:.0f} s")
        workload = Workload(cluster.settings, plan, duration).start()
        target = max(min_faults, round(faults_per_minute * minutes))
        driver = FaultDriver(
            cluster, random.Random(rng.random()), end_at=time.monotonic() + duration, target=target
        )
        driver.run()
        driver.settle(emitters=2, workers=2)
        wait_cron_caught_up(ledger, workload, driver, timeout_s=120.0)
        workload.delete_now.set()
        workload.join(timeout_s=RETRY_JOIN_S)
        log(f"faults done ({len(driver.faults)}); waiting for the jobs to finish")
        finished = wait_finished(cluster, ledger, workload, driver, timeout_s=300.0)
        time.sleep(10.0)  # late duplicates would show up now
        driver.housekeep()
        report = judge(gather(cluster, ledger, workload, outcomes=True))
        report.update(
            {
                "minutes": minutes,
                "seed": seed,
                "finished_in_time": finished,
                "faults": len(driver.faults),
                "faults_by_kind": dict(Counter(f["kind"] for f in driver.faults)),
                "fault_log": driver.faults,
                "unexpected_exits": len(driver.unexpected),
                "unexpected_exit_log": driver.unexpected,
                "schedule_failures": len(workload.failed),
                "schedule_retries": workload.errors,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
        return report
    finally:
        cluster.stop_all()
        ledger.close()


RETRY_JOIN_S = 180.0
KEYS = ("jobs", "faults", "lost", "duplicates", "early", "dlq", "reexecutions")


def print_table(report: dict[str, Any]) -> None:
    rows = [(k, report[k]) for k in KEYS]
    rows += [
        ("faults by kind", report["faults_by_kind"]),
        ("dlq (expected / of)", f"{report['dlq_expected']} / {report['dlq_expected_of']}"),
        ("dlq unexpected", report["dlq_unexpected"]),
        ("effect conflicts", report["effect_conflicts"]),
        ("cron occurrences", report["cron_occurrences"]),
        ("first-attempt lateness ms", report["lateness_ms"]),
        ("unexpected exits", report["unexpected_exits"]),
        ("wall s", report["wall_s"]),
    ]
    width = max(len(str(k)) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rate", type=float, default=8.0, help="one-shot jobs per second")
    p.add_argument("--faults-per-minute", type=float, default=10.0)
    p.add_argument("--dir", type=Path, help="keep the run's files (logs, ledger) here")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="dueflow-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = run_chaos(
            minutes=args.minutes,
            root=root,
            seed=seed,
            rate_per_s=args.rate,
            faults_per_minute=args.faults_per_minute,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    broken = report["lost"] or report["duplicates"] or report["early"]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
