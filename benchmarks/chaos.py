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

Then it waits until every job has a committed terminal outcome (or a
deadline passes) and judges (``tests/chaos/verdict.py``, rules in its
docstring) from what Kafka committed (outcomes, dead letters, exec records),
what the client asked for, the handlers' SQLite ledger (when and where each
run started and ended) and the fault log: ``lost``, ``unexcused``
re-executions, ``early``, ``duplicates``, ``double_fires``,
``dlq_unexpected``, ``retry_early``, ``flaky_wrong_attempt`` (all 0), every
flaky job succeeded on attempt k + 1, every always-fail job dead-lettered
exactly once, plus ``late_terminal``, lateness distributions and the faults
by kind (``faults_ok``: each kind at least ``--min-per-kind`` times). Every
process it started is stopped by pid at the end, also on failure. Exit code
1 when a guarantee was broken (the table ends with a ``BROKEN:`` line each).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dueflow.errors import DueflowError
from tests.chaos import evidence
from tests.chaos.cluster import QUEUE, ChaosCluster, Child
from tests.chaos.facts import Evidence, Rules
from tests.chaos.ledger import Ledger
from tests.chaos.verdict import broken, judge, unfinished
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


def fault_entries(driver: FaultDriver, cluster: ChaosCluster) -> list[dict[str, Any]]:
    """The driver's fault log in the judge's contract (``kind``, ``at_ms``, ``until_ms``,
    ``pids``: see tests/chaos/facts.py ``Fault``).

    Entries that already have ``at_ms`` pass through. Older entries (``at_s``,
    ``took_s`` after the driver's start, victim names in ``detail``) are
    converted: the start rounded to 0.1 s becomes a wall time, a process fault
    counts from the end of its injection (the kill is its last step), and
    victim names become pids.
    """
    began = getattr(driver, "_began", None)
    pid_of = {c.name: c.pid for c in cluster.every}
    out = []
    for f in driver.faults:
        if "at_ms" in f or began is None:
            out.append(dict(f))
            continue
        wall_of = time.time() * 1000 - (time.monotonic() - began) * 1000
        start = wall_of + (f["at_s"] - 0.05) * 1000
        end = wall_of + (f["at_s"] + f["took_s"] + 0.05) * 1000
        broker = f["kind"] in BROKER_FAULTS
        pids = [pid_of[t] for t in str(f.get("detail", "")).split() if t in pid_of]
        out.append(
            {
                **f,
                "at_ms": round(start if broker else end),
                "until_ms": round(end),
                "pids": [] if broker else pids,
            }
        )
    return out


def gather(
    cluster: ChaosCluster,
    ledger: Ledger,
    workload: Workload,
    driver: FaultDriver,
    *,
    full: bool = True,
) -> Evidence:
    """The run's evidence (``full=False``: only what :func:`unfinished` needs)."""
    return evidence.gather(
        cluster.settings,
        ledger,
        workload,
        queue=QUEUE,
        faults=fault_entries(driver, cluster),
        skews=getattr(driver, "skews", None),
        emitter_pids=[c.pid for c in cluster.every if c.role == "emitter"],
        worker_logs={c.pid: c.log_path for c in cluster.every if c.role == "worker"},
        full=full,
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
            left = len(unfinished(gather(cluster, ledger, workload, driver, full=False)))
        except DueflowError as exc:
            log(f"reading evidence failed ({exc}); again")
            left = -1
        if left == 0:
            return True
        log(f"waiting for {left} jobs to finish")
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
    rules: Rules | None = None,
) -> dict[str, Any]:
    """One chaos run in ``root``; returns the report (see the module docstring).

    ``rules``: the judge's margins and the fault minimums (default: at least one
    fault of every kind the driver injects)."""
    rules = rules or Rules(fault_minimums=dict.fromkeys(FAULTS, 1))
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
        report = judge(gather(cluster, ledger, workload, driver), rules)
        report.update(
            {
                "minutes": minutes,
                "seed": seed,
                "finished_in_time": finished,
                "fault_log": fault_entries(driver, cluster),
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


def print_table(report: dict[str, Any]) -> None:
    """The report's headline numbers; the guarantees first (each must be 0 or equal)."""
    rows: list[tuple[str, Any]] = [
        (
            "jobs (one-shot + cron)",
            f"{report['jobs']} ({report['one_shot_jobs']} + {report['cron_occurrences']})",
        ),
        ("faults", report["faults"]),
        ("faults by kind", report["faults_by_kind"]),
        ("faults ok (minimum per kind)", f"{report['faults_ok']} {report['faults_missing']}"),
        ("lost", f"{report['lost']} {report['lost_by_stage']}"),
        ("unexcused re-executions", report["unexcused"]),
        ("early", report["early"]),
        ("duplicates", report["duplicates"]),
        ("double fires", report["double_fires"]),
        ("dlq unexpected", report["dlq_unexpected"]),
        ("dlq (expected / of)", f"{report['dlq_expected']} / {report['dlq_expected_of']}"),
        ("flaky right attempt (ok / of)", f"{report['flaky_ok']} / {report['flaky_jobs']}"),
        ("flaky wrong attempt", report["flaky_wrong_attempt"]),
        ("retry early", report["retry_early"]),
        ("late terminal", report["late_terminal"]),
        ("terminal - due ms", report["terminal_lateness_ms"]),
        ("first-attempt start - due ms", report["lateness_ms"]),
        (
            "re-executions (excused)",
            f"{report['reexecutions']} ({report['excused']} {report['excused_by_kind']})",
        ),
        ("worker drops (uncommitted work)", report["worker_drops"]),
        ("dlq", f"{report['dlq']} {report['dlq_reasons']}"),
        ("effect conflicts", report["effect_conflicts"]),
        ("unexpected exits", report["unexpected_exits"]),
        ("finished in time", report["finished_in_time"]),
        ("wall s", report["wall_s"]),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for problem in broken(report):
        print(f"BROKEN: {problem}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rate", type=float, default=8.0, help="one-shot jobs per second")
    p.add_argument("--faults-per-minute", type=float, default=10.0)
    p.add_argument("--dir", type=Path, help="keep the run's files (logs, ledger) here")
    p.add_argument(
        "--slack-s",
        type=float,
        default=Rules().slack_ms / 1000,
        help="late: a terminal outcome after due + retry plan + this + broker outages",
    )
    p.add_argument(
        "--min-per-kind", type=int, default=1, help="faults of each kind the run must inject"
    )
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="dueflow-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    rules = Rules(
        slack_ms=round(args.slack_s * 1000),
        fault_minimums=dict.fromkeys(FAULTS, args.min_per_kind),
    )
    try:
        report = run_chaos(
            minutes=args.minutes,
            root=root,
            seed=seed,
            rate_per_s=args.rate,
            faults_per_minute=args.faults_per_minute,
            rules=rules,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if broken(report) else 0


if __name__ == "__main__":
    sys.exit(main())
