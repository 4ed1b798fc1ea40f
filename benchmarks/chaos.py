"""Chaos: try to lose, double or run early a job while processes and the broker die.

::

    python -m benchmarks.chaos --minutes 3 --json chaos.json [--seed 7] [--dir DIR]

Starts its own broker (a local KRaft broker on a free port, in a temporary
directory, so it may stop and kill it), the topics with a small wheel, two
emitters and three workers (real ``python -m dueflow`` processes running
``tests/chaos/handlers.py``), and schedules a workload for ``--minutes``:
one-shot jobs all over the wheel, flaky jobs, jobs that must end in the DLQ,
cron schedules firing every few seconds, and commands that cancel, move
(later, earlier) or update some pending jobs (the queue is finalized first).
Meanwhile the fault driver
(``tests/chaos/faults.py``) kill -9s and SIGSTOPs the active emitter and
workers, restarts workers one after another, replaces a worker and the
active emitter by ones whose clock runs 2 s ahead or behind (libfaketime),
restarts (SIGTERM, kill -9) and pauses (SIGSTOP) the broker, and adds and
removes workers; every kind at least ``--min-per-kind`` times (default 2,
1 in runs under 5 minutes), else the run fails (``kinds_short``).
``--cluster 3``: node faults (kill or pause the leader or coordinator that
matters) on a three-node cluster.

Then it waits until every job has a committed terminal outcome (or a
deadline passes) and judges (``tests/chaos/verdict.py``, rules in its
docstring) from what Kafka committed (outcomes, dead letters, exec records),
what the client asked for, the handlers' SQLite ledger (when and where each
run started and ended) and the fault log: ``lost``, ``unexcused``
re-executions, ``early``, ``duplicates``, ``dlq_unexpected``,
``retry_early``, ``flaky_wrong_attempt``, ``steer_cancel_ran``,
``steer_cancel_unconfirmed``, ``steer_ran_old`` (all 0; ``double_fires``, jobs fired
more than once, only reported: the workers skip the copies), every
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

from benchmarks.output import provenance
from dueflow.apps.ops.finalize import finalize_queue
from dueflow.config import Settings
from dueflow.errors import DueflowError
from tests.chaos import evidence
from tests.chaos.cluster import QUEUE, ChaosCluster
from tests.chaos.facts import Evidence, Rules
from tests.chaos.fault_plan import fault_target, fault_weights
from tests.chaos.faults import FaultDriver, log
from tests.chaos.ledger import Ledger
from tests.chaos.nodes import ClusterNodes
from tests.chaos.verdict import broken, judge, unfinished
from tests.chaos.workload import Workload, plan_jobs, plan_steering

# ------------------------------------------------------------------------ evidence


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
        faults=driver.faults,
        skews=driver.skews,
        emitter_pids=[c.pid for c in cluster.every if c.role == "emitter"],
        worker_logs={c.pid: c.log_path for c in cluster.every if c.role == "worker"},
        full=full,
    )


def wait_cron_caught_up(
    ledger: Ledger, workload: Workload, driver: FaultDriver, *, timeout_s: float
) -> bool:
    """Until every cron schedule has run an occurrence of the last few seconds that is
    due after this wait began: an emitter fires again since the faults ended (a node
    fault's after-effects, such as a coordinator moving, may still cost a failover
    then; deleting the schedules during one drops their pending occurrences)."""
    began_ms = int(time.time() * 1000)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        driver.housekeep()
        newest: dict[str, int] = {}
        for key in ledger.effect_keys():
            sid, sep, at = key.partition("@")
            if sep and at.isdigit():
                newest[sid] = max(newest.get(sid, 0), int(at))
        horizon = max(int(time.time() * 1000) - 6_000, began_ms)
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


def finalize(settings: Settings, *, timeout_s: float = 60.0) -> None:
    """``queue finalize`` of the chaos queue (its workers are all this release's), so the
    workload steers its jobs with commands."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            finalize_queue(settings, QUEUE, by="chaos", now_ms=int(time.time() * 1000))
            return
        except DueflowError as exc:
            if time.monotonic() > deadline:
                raise
            log(f"queue finalize failed ({exc}); again")
            time.sleep(1.0)


# ---------------------------------------------------------------------------- run


def run_chaos(
    *,
    minutes: float,
    root: Path,
    seed: int,
    rate_per_s: float = 8.0,
    faults_per_minute: float = 6.0,
    min_faults: int = 20,
    min_per_kind: int = 2,
    cluster_nodes: int = 1,
    shards: int = 1,
    workers: int = 3,
    on_ready: Callable[[ChaosCluster], None] | None = None,
    rules: Rules | None = None,
) -> dict[str, Any]:
    """One chaos run in ``root``; returns the report (see the module docstring).

    ``rules``: the judge's margins and the fault minimums (default: every kind
    the driver injects, ``min_per_kind`` times)."""
    rules = rules or Rules(
        fault_minimums=dict.fromkeys(fault_weights(cluster_nodes=cluster_nodes), min_per_kind)
    )
    rng = random.Random(seed)
    duration = minutes * 60.0
    ledger_path = root / "ledger.sqlite"
    ledger = Ledger(ledger_path)
    cluster = ChaosCluster(root, ledger=ledger_path, nodes=cluster_nodes, shards=shards)
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
        finalize(cluster.settings)
        plan = plan_jobs(
            rng=random.Random(rng.random()), duration_s=duration, rate_per_s=rate_per_s
        )
        # its own generator: the seed's jobs and faults stay what they were without it
        steering = plan_steering(plan, rng=random.Random(f"{seed}-steering"))
        log(
            f"broker {cluster.bootstrap}, {len(plan)} one-shot jobs over {duration:.0f} s, "
            f"{len(steering)} steered"
        )
        workload = Workload(cluster.settings, plan, duration, steer_plan=steering).start()
        marks = {"setup": time.monotonic()}
        kinds = fault_weights(cluster_nodes=cluster_nodes)
        target = fault_target(
            minutes=minutes,
            faults_per_minute=faults_per_minute,
            min_faults=min_faults,
            min_per_kind=min_per_kind,
            kinds=len(kinds),
        )
        driver = FaultDriver(
            cluster,
            random.Random(rng.random()),
            end_at=time.monotonic() + duration,
            target=target,
            min_per_kind=min_per_kind,
            ledger=ledger_path,
            weights=kinds,
            nodes=ClusterNodes(cluster.local_cluster) if cluster.local_cluster else None,
            overtime_s=duration,  # at most twice as long, to cover every kind
        )
        driver.run()
        marks["faults"] = time.monotonic()
        driver.settle(emitters=2, workers=2)
        wait_cron_caught_up(ledger, workload, driver, timeout_s=120.0)
        workload.delete_now.set()
        workload.join(timeout_s=RETRY_JOIN_S)
        log(f"faults done ({len(driver.faults)}); waiting for the jobs to finish")
        finished = wait_finished(cluster, ledger, workload, driver, timeout_s=300.0)
        time.sleep(10.0)  # late duplicates would show up now
        driver.housekeep()
        marks["wait"] = time.monotonic()
        report = judge(gather(cluster, ledger, workload, driver), rules)
        marks["judge"] = time.monotonic()
        report.update(
            {
                "minutes": minutes,
                "seed": seed,
                "cluster_nodes": cluster_nodes,
                "shards": shards,
                "finished_in_time": finished,
                **driver.report(),
                "schedule_failures": len(workload.failed),
                "schedule_retries": workload.errors,
                "wall_s": round(time.monotonic() - started, 1),
                # setup: broker(s), topics, processes; faults: the workload's length;
                # wait: settling, cron catch-up, every job finished; judge: evidence
                "phases_s": phase_seconds(started, marks),
            }
        )
        return report
    finally:
        cluster.stop_all()
        ledger.close()


RETRY_JOIN_S = 180.0


def phase_seconds(started: float, marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase, from consecutive monotonic marks (in insertion order)."""
    out, last = {}, started
    for name, at in marks.items():
        out[name] = round(at - last, 1)
        last = at
    return out


def default_min_per_kind(minutes: float) -> int:
    """2, but 1 below 5 minutes: two of every kind take about 150 s of faults alone
    (rolling restarts, SIGSTOPs held past session timeouts, broker faults with quiet
    time after them), more than a 3-minute run has."""
    return 2 if minutes >= 5 else 1


def print_table(report: dict[str, Any]) -> None:
    """The report's headline numbers; the guarantees first (each must be 0 or equal)."""
    rows: list[tuple[str, Any]] = [
        (
            "jobs (one-shot + cron)",
            f"{report['jobs']} ({report['one_shot_jobs']} + {report['cron_occurrences']})",
        ),
        ("faults", report["faults"]),
        ("faults by kind", report["faults_by_kind"]),
        ("fault overtime s (kinds short at the end)", report["overtime_s"]),
        ("faults ok (minimum per kind)", f"{report['faults_ok']} {report['faults_missing']}"),
        ("kinds short of the minimum", report["kinds_short"] or "none"),
        ("takeover ms", report["takeover_ms"]),
        (
            "takeovers over session + 1 s",
            f"{len(report['takeovers_slow'])} (bound {report['takeover_bound_ms']} ms; "
            f"{len(report['takeovers_slow_during_outages'])} more while a broker or node "
            "the takeover needs was down)",
        ),
        ("skews (pid: ms)", report["skews"]),
        ("lost", f"{report['lost']} {report['lost_by_stage']}"),
        ("unexcused re-executions", report["unexcused"]),
        ("early", report["early"]),
        ("duplicates", report["duplicates"]),
        ("double fires (legitimate: copies the workers skip)", report["double_fires"]),
        ("dlq unexpected", report["dlq_unexpected"]),
        ("dlq (expected / of)", f"{report['dlq_expected']} / {report['dlq_expected_of']}"),
        ("flaky right attempt (ok / of)", f"{report['flaky_ok']} / {report['flaky_jobs']}"),
        ("flaky wrong attempt", report["flaky_wrong_attempt"]),
        ("retry early", report["retry_early"]),
        ("steered (command, SDK's answer)", report["steered"]),
        ("steered before due (binding)", report["steered_binding"]),
        ("cancelled before due, ran", report["steer_cancel_ran"]),
        ("cancelled before due, no cancelled outcome", report["steer_cancel_unconfirmed"]),
        ("moved/updated before due, old version ran", report["steer_ran_old"]),
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
        ("excused exits", len(report["excused_exits"])),
        ("finished in time", report["finished_in_time"]),
        ("node faults (node, target, recovered ms)", _node_faults(report)),
        ("wall s", f"{report['wall_s']} {report.get('phases_s', {})}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for problem in problems(report):
        print(f"BROKEN: {problem}")


def problems(report: dict[str, Any]) -> list[str]:
    """The judge's broken guarantees, the fault kinds short of their minimum, and
    takeovers slower than the emitter session timeout + 1 s (or never seen)."""
    out = broken(report)
    if report["kinds_short"]:
        out.append(f"fault kinds short of the minimum: {report['kinds_short']}")
    if report["takeovers_slow"]:
        out.append(
            f"{len(report['takeovers_slow'])} takeovers over {report['takeover_bound_ms']} ms: "
            f"{report['takeovers_slow']}"
        )
    return out


def _node_faults(report: dict[str, Any]) -> str:
    rows = report.get("node_faults") or []
    if not rows:
        return "none"
    return "; ".join(f"{r['kind']} {r['node']} ({r['target']}) {r['recovered_ms']}" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rate", type=float, default=8.0, help="one-shot jobs per second")
    p.add_argument("--faults-per-minute", type=float, default=6.0)
    p.add_argument(
        "--min-per-kind",
        type=int,
        default=None,
        help="every fault kind at least this often (default 2; 1 in runs under 5 minutes)",
    )
    p.add_argument(
        "--cluster", type=int, default=1, metavar="NODES", help="brokers (node faults when > 1)"
    )
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help="emitter shards (wheel.shards); each emitter drives some",
    )
    p.add_argument("--dir", type=Path, help="keep the run's files (logs, ledger) here")
    p.add_argument(
        "--slack-s",
        type=float,
        default=Rules().slack_ms / 1000,
        help="late: a terminal outcome after due + retry plan + this + broker outages",
    )
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="dueflow-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    min_per_kind = (
        default_min_per_kind(args.minutes) if args.min_per_kind is None else args.min_per_kind
    )
    rules = Rules(
        slack_ms=round(args.slack_s * 1000),
        fault_minimums=dict.fromkeys(fault_weights(cluster_nodes=args.cluster), min_per_kind),
    )
    try:
        report = run_chaos(
            minutes=args.minutes,
            root=root,
            seed=seed,
            rate_per_s=args.rate,
            faults_per_minute=args.faults_per_minute,
            min_per_kind=min_per_kind,
            cluster_nodes=args.cluster,
            shards=args.shards,
            rules=rules,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps({**report, "measured": provenance()}, indent=2))
    return 1 if problems(report) else 0


if __name__ == "__main__":
    sys.exit(main())
