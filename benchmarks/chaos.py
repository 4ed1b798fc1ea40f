"""Chaos: try to lose, double or run early a job while processes and the broker die.

::

    python -m benchmarks.chaos --minutes 3 --json chaos.json [--seed 7] [--dir DIR]

Starts its own broker (a local KRaft broker on a free port, in a temporary
directory, so it may stop and kill it), the topics with a small wheel, two
emitters and three workers (real ``python -m dueflow`` processes running
``tests/chaos/handlers.py``), and schedules a workload for ``--minutes``:
one-shot jobs all over the wheel, flaky jobs, jobs that must end in the DLQ,
cron schedules firing every few seconds. Meanwhile the fault driver
(``tests/chaos/faults.py``) kill -9s and SIGSTOPs the active emitter and
workers, restarts workers one after another, replaces a worker and the
active emitter by ones whose clock runs 2 s ahead or behind (libfaketime),
restarts (SIGTERM, kill -9) and pauses (SIGSTOP) the broker, and adds and
removes workers; every kind at least ``--min-per-kind`` times (default 2,
1 in runs under 5 minutes), else the run fails (``kinds_short``).
``--cluster 3``: node faults (kill or pause the leader or coordinator that
matters) on a three-node cluster.

Then it waits until every job has finished (or a deadline passes) and
judges from the handlers' SQLite ledger, the committed outcomes and the
DLQ: ``lost``, ``duplicates``, ``early`` (must all be 0), ``dlq``,
``reexecutions`` (at-least-once handler runs after a kill, informational),
and the faults: by kind, the fault log, ``skews`` (pid -> ms) and
``takeover_ms`` per emitter fault kind. Every process it started is stopped
by pid at the end, also on failure. Exit code 1 when a guarantee was broken
or a fault kind fell short of its minimum.
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
from tests.chaos.cluster import QUEUE, ChaosCluster
from tests.chaos.fault_plan import fault_target, fault_weights
from tests.chaos.faults import FaultDriver, log
from tests.chaos.ledger import Ledger
from tests.chaos.verdict import Evidence, judge
from tests.chaos.workload import Workload, plan_jobs

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
    faults_per_minute: float = 6.0,
    min_faults: int = 20,
    min_per_kind: int = 2,
    cluster_nodes: int = 1,
    workers: int = 3,
    on_ready: Callable[[ChaosCluster], None] | None = None,
) -> dict[str, Any]:
    """One chaos run in ``root``; returns the report (see the module docstring)."""
    if cluster_nodes > 1:
        # The driver's node faults are written against tests/chaos/nodes.NodeControl;
        # ChaosCluster still starts one LocalBroker.
        raise NotImplementedError(
            f"--cluster {cluster_nodes}: ChaosCluster does not start a multi-node cluster yet "
            "(connect dueflow.broker.cluster to tests.chaos.nodes.NodeControl)"
        )
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
                **driver.report(),
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


def default_min_per_kind(minutes: float) -> int:
    """2, but 1 below 5 minutes: two of every kind take about 150 s of faults alone
    (rolling restarts, SIGSTOPs held past session timeouts, broker faults with quiet
    time after them), more than a 3-minute run has."""
    return 2 if minutes >= 5 else 1


KEYS = ("jobs", "faults", "lost", "duplicates", "early", "dlq", "reexecutions")


def print_table(report: dict[str, Any]) -> None:
    rows = [(k, report[k]) for k in KEYS]
    rows += [
        ("faults by kind", report["faults_by_kind"]),
        ("kinds short of the minimum", report["kinds_short"] or "none"),
        ("takeover ms", report["takeover_ms"]),
        ("skews (pid: ms)", report["skews"]),
        ("dlq (expected / of)", f"{report['dlq_expected']} / {report['dlq_expected_of']}"),
        ("dlq unexpected", report["dlq_unexpected"]),
        ("effect conflicts", report["effect_conflicts"]),
        ("cron occurrences", report["cron_occurrences"]),
        ("first-attempt lateness ms", report["lateness_ms"]),
        ("unexpected exits", report["unexpected_exits"]),
        ("excused exits", len(report["excused_exits"])),
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
            min_per_kind=default_min_per_kind(args.minutes)
            if args.min_per_kind is None
            else args.min_per_kind,
            cluster_nodes=args.cluster,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    broken = report["lost"] or report["duplicates"] or report["early"] or report["kinds_short"]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
