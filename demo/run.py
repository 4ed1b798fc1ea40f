"""``python -m demo`` (``make demo``): dueflow doing its job, end to end.

Starts a local Kafka broker (or uses ``DUEFLOW_BOOTSTRAP``), creates the
topics, starts two emitters (one active, one hot standby), a worker
supervisor with two worker processes and the status view, all as real
processes. Then it schedules a realistic mix of jobs in waves (see
:mod:`demo.workload`), shows live progress, kills the active
emitter with SIGKILL half way through, measures how long the standby takes
to fire again, waits for every job to finish, stops everything it started
and prints a summary computed from what the handlers recorded. Exit code 0
when nothing was lost or duplicated, 1 otherwise.

``--short`` is the CI variant (fewer jobs, a shorter window); ``--json PATH``
writes the summary as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
from rich.console import Console

from demo.display import Bar, ProgressView, summary_table
from demo.ledger import LedgerReader
from demo.observer import Observer, Tally
from demo.processes import Child, scrape
from demo.stack import EMITTER_SESSION_MS, QUEUES, DemoStack
from demo.summary import DemoSummary, Failover, summarize
from demo.workload import CRON_PLANS, POISON_ID, SHORT, Wave, WorkloadShape, cron_runs, plan_waves
from dueflow.producers import Scheduler
from dueflow.wall_clock import wall_ms

SETTLE_S = 1.5  # quiet time after the last job, so a late duplicate would be seen
DRAIN_S = 45.0
_TWO_DAYS_MS = 2 * 86_400_000
WARM_UP_JOBS = 60  # after the last due time, how long the demo waits for stragglers


class WaveFeeder(threading.Thread):
    """Schedules the waves at their times through one :class:`Scheduler`."""

    def __init__(self, scheduler: Scheduler, waves: Sequence[Wave]) -> None:
        super().__init__(name="demo-feeder", daemon=True)
        self.scheduler = scheduler
        self.waves = waves
        self.scheduled: list[str] = []
        self.failed = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            for wave in self.waves:
                if self.stop.wait(max(0.0, t0 + wave.at_ms / 1000 - time.monotonic())):
                    return
                result = self.scheduler.schedule_many(wave.requests)
                self.scheduled.extend(j for j in result.job_ids if j is not None)
                self.failed += result.failed
        except BaseException as exc:  # reported by the demo
            self.error = exc


@dataclasses.dataclass
class Takeover:
    """Watches the standby after the kill (wall-clock ms of each step)."""

    killed: Child
    standby: Child
    killed_ms: int
    lease_moved_ms: int | None = None
    firing_again_ms: int | None = None

    def poll(self, view: ProgressView) -> None:
        if self.firing_again_ms is not None or self.standby.port is None:
            return
        got = scrape(self.standby.port, timeout_s=0.5) or {}
        now = wall_ms()
        if self.lease_moved_ms is None and got.get("dueflow_emitter_leader", 0.0) >= 1.0:
            self.lease_moved_ms = now
            view.event(
                f"{self.standby.name} holds the lease "
                f"{(now - self.killed_ms) / 1000:.2f} s after the kill"
            )
        if got.get("dueflow_fires_total", 0.0) > 0:
            self.lease_moved_ms = self.lease_moved_ms or now
            self.firing_again_ms = now
            view.event(
                f"[green]{self.standby.name} is firing again "
                f"{(now - self.killed_ms) / 1000:.2f} s after the kill[/green]"
            )

    def result(self) -> Failover:
        return Failover(
            f"{self.killed.name} (pid {self.killed.pid})",
            self.killed_ms,
            self.lease_moved_ms,
            self.firing_again_ms,
        )


def _counts(tally: Tally, *, wanted: set[str], cron: set[str]) -> dict[str, int]:
    return {
        "fired": len(tally.fired),
        "finished": len(wanted & (tally.succeeded | tally.dead)),
        "cron_done": len(cron & tally.succeeded),
        "retrying": len(tally.retrying),
        "dead": len(tally.dead),
    }


def run_workload(
    stack: DemoStack, shape: WorkloadShape, *, seed: int, kill: bool, console: Console
) -> tuple[DemoSummary, dict[str, Any]]:
    """Everything between "processes started" and the summary."""
    settings = stack.settings
    assert settings is not None
    t0 = time.monotonic()
    stack.wait_for("an active emitter", lambda: stack.leader() is not None, 90)
    first_leader = stack.leader()
    stack.wait_for("two worker processes in every queue's group", stack.workers_ready, 120, 0.5)
    console.print(f"emitters and workers ready in {time.monotonic() - t0:.1f} s")
    ledger = LedgerReader(stack.ledger_dir)
    with Scheduler(settings) as scheduler:
        t0 = time.monotonic()
        warm_up(scheduler, ledger, stack)
        console.print(
            f"warm-up: {WARM_UP_JOBS} jobs through emitter and workers in "
            f"{time.monotonic() - t0:.1f} s (first transactions, connections, coordinators)"
        )
    waves = plan_waves(shape, rng=random.Random(seed))
    flaky = sum(1 for w in waves for r in w.requests if r.task == "payment.charge")
    observer = Observer(settings, list(QUEUES)).start()
    takeover: Takeover | None = None
    timings: dict[str, float] = {}
    with Scheduler(settings) as scheduler:
        start_ms = wall_ms() + 2_000
        end_ms = wall_ms() + shape.due_span_ms
        schedules = [
            scheduler.add_schedule(
                p.schedule_id,
                cron=p.cron,
                timezone=p.timezone,
                task=p.task,
                queue=p.queue,
                payload=p.payload,
                start=datetime.fromtimestamp(start_ms / 1000, UTC),
                end=datetime.fromtimestamp(
                    (end_ms if p.ends_with_window else start_ms + _TWO_DAYS_MS) / 1000, UTC
                ),
            )
            for p in CRON_PLANS
        ]
        cron_expected = {k for s in schedules for k in cron_runs(s, until_ms=end_ms)}
        feeder = WaveFeeder(scheduler, waves)
        started = time.monotonic()
        feeder.start()
        kill_at = started + shape.kill_at_ms / 1000
        deadline = started + shape.due_span_ms / 1000 + DRAIN_S
        done_at: float | None = None
        with ProgressView(console) as view:
            view.event(
                f"scheduling {shape.jobs:,} jobs over {shape.schedule_s:.0f} s "
                f"(due {shape.min_lead_ms / 1000:g}-{shape.max_lead_ms / 1000:g} s ahead), "
                f"{len(CRON_PLANS)} cron schedules; kill -9 of the active emitter "
                f"at {shape.kill_at_ms / 1000:.0f} s"
            )
            while True:
                now = time.monotonic()
                if kill and takeover is None and now >= kill_at:
                    takeover = _kill_leader(stack, view)
                if takeover is not None:
                    takeover.poll(view)
                wanted = set(feeder.scheduled)
                counts = observer.read(
                    functools.partial(_counts, wanted=wanted, cron=cron_expected)
                )
                executed = ledger.effect_count()
                _show(
                    view,
                    stack,
                    shape,
                    feeder,
                    counts,
                    executed,
                    flaky,
                    cron_expected,
                    takeover,
                    first_leader,
                )
                finished = (
                    not feeder.is_alive()
                    and counts["finished"] >= len(wanted)
                    and counts["cron_done"] >= len(cron_expected)
                )
                if finished and done_at is None:
                    done_at = now
                    view.event("every job has finished; a quiet second to catch duplicates")
                if done_at is not None and now - done_at >= SETTLE_S:
                    break
                if now > deadline:
                    view.event("[red]time is up: some jobs did not finish[/red]")
                    break
                problem = _dead_process(stack, takeover)
                if problem:
                    view.event(f"[red]{problem}[/red]")
                    break
                time.sleep(0.05 if takeover and takeover.firing_again_ms is None else 0.25)
        feeder.stop.set()
        feeder.join(30)
        timings["workload_s"] = round(time.monotonic() - started, 2)
    console.print("stopping the workers (they commit what they ran), the emitters, the view")
    endpoints = stack.endpoints()
    status_seen = stack.status_ready()
    codes = stack.stop_children()
    observer.stop()
    summary = summarize(
        scheduled=feeder.scheduled,
        cron_expected=sorted(cron_expected),
        ledger=ledger.read(),
        dead=observer.tally.dead,
        fire_lateness_ms=observer.tally.fire_lateness_ms,
        failover=takeover.result() if takeover else None,
        elapsed_s=0.0,
        endpoints=endpoints,
    )
    extra = {
        "shape": dataclasses.asdict(shape),
        "schedule_failures": feeder.failed,
        "feeder_error": repr(feeder.error) if feeder.error else None,
        "observer_error": repr(observer.error) if observer.error else None,
        "dead_is_the_poison_job": observer.tally.dead == {POISON_ID},
        "status_view_answered": status_seen,
        "exit_codes": codes,
        "pids": stack.pids(),
        "emitter_session_timeout_ms": EMITTER_SESSION_MS,
        **timings,
    }
    return summary, extra


def warm_up(scheduler: Scheduler, ledger: LedgerReader, stack: DemoStack) -> None:
    """Run a few jobs through the whole pipeline before the measured workload, and give
    the status view a little time to come up.

    On a fresh broker the first transactions of each process wait for their
    coordinators to load; jobs due then would be late for reasons no running
    cluster has.
    """
    result = scheduler.schedule_many(
        {
            "task": "email.send" if i % 2 else "report.build",
            "payload": {"warm_up": i},
            "queue": "emails" if i % 2 else "reports",
            "job_id": f"warm-up-{i}",
        }
        for i in range(WARM_UP_JOBS)
    )
    if not result.ok:
        raise RuntimeError(f"warm-up jobs not scheduled: {result.to_json()}")
    stack.wait_for("the warm-up jobs", lambda: ledger.effect_count() >= WARM_UP_JOBS, 90, 0.2)
    if stack.view is not None:
        deadline = time.monotonic() + 15
        while not stack.status_ready() and time.monotonic() < deadline:
            time.sleep(0.2)


def _kill_leader(stack: DemoStack, view: ProgressView) -> Takeover | None:
    leader = stack.leader()
    if leader is None:
        return None
    standby = next(e for e in stack.emitters if e is not leader)
    killed_ms = wall_ms()
    leader.kill()
    view.event(
        f"[bold red]kill -9 {leader.name} (pid {leader.pid}), the active emitter[/bold red]; "
        f"{standby.name} is the standby"
    )
    return Takeover(leader, standby, killed_ms)


def _dead_process(stack: DemoStack, takeover: Takeover | None) -> str | None:
    killed = takeover.killed if takeover else None
    for child in stack.children:
        if child is not killed and child is not stack.view and not child.alive():
            return f"{child.name} exited unexpectedly:\n{child.log_tail()}"
    return None


def _show(
    view: ProgressView,
    stack: DemoStack,
    shape: WorkloadShape,
    feeder: WaveFeeder,
    counts: dict[str, int],
    executed: int,
    flaky: int,
    cron_expected: set[str],
    takeover: Takeover | None,
    first_leader: Child | None,
) -> None:
    cron = len(cron_expected)
    bars = {
        "scheduled": Bar(len(feeder.scheduled), shape.jobs),
        "fired": Bar(counts["fired"], shape.jobs + cron),
        "executed": Bar(executed, shape.jobs - 1 + cron),
        "retried": Bar(counts["retrying"], flaky + 1),
        "dead": Bar(counts["dead"], 1),
    }
    notes = {
        "fired": "one-shot jobs and cron runs",
        "retried": "flaky payments and the hopeless webhook",
        "dead": "the webhook, after 3 attempts",
    }
    parts = []
    for em in stack.emitters:
        if takeover is not None and em is takeover.killed:
            parts.append(f"{em.name} killed")
        elif takeover is not None and em is takeover.standby:
            parts.append(f"{em.name} {'active' if takeover.firing_again_ms else 'taking over'}")
        else:
            parts.append(f"{em.name} {'active' if em is first_leader else 'standby'}")
    if stack.view is not None:
        parts.append(f"status page {stack.status_page_url()}")
    view.update(bars, notes, " | ".join(parts))


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--short", action="store_true", help="the short CI variant")
    p.add_argument("--jobs", type=int, help="one-shot jobs to schedule")
    p.add_argument("--seconds", type=float, help="how long the jobs keep coming")
    p.add_argument("--seed", type=int, default=7, help="seed of the workload's random draws")
    p.add_argument("--workdir", type=Path, default=Path(".dueflow") / "demo")
    p.add_argument("--json", type=Path, help="write the summary here as JSON")
    p.add_argument("--no-kill", action="store_true", help="do not kill the active emitter")
    p.add_argument("--no-status-view", action="store_true", help="do not start the status view")
    p.add_argument(
        "--keep-topics", action="store_true", help="keep the run's topics on DUEFLOW_BOOTSTRAP"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = SHORT if args.short else WorkloadShape()
    if args.jobs is not None:
        shape = dataclasses.replace(shape, jobs=max(2, args.jobs))
    if args.seconds is not None:
        shape = dataclasses.replace(shape, schedule_s=max(0.5, args.seconds))
    console = Console()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C raises KeyboardInterrupt even where the caller ignored SIGINT (a shell's
    # background job): the stack's exit then stops whatever was started.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        with DemoStack(
            args.workdir.resolve(),
            external_bootstrap=os.environ.get("DUEFLOW_BOOTSTRAP") or None,
            status_view=not args.no_status_view,
            keep_topics=args.keep_topics,
            on_step=console.print,
        ) as stack:
            summary, extra = run_workload(
                stack, shape, seed=args.seed, kill=not args.no_kill, console=console
            )
    except KeyboardInterrupt:
        console.print("interrupted: everything the demo started has been stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    summary = dataclasses.replace(summary, elapsed_s=round(time.monotonic() - t0, 1))
    console.print(summary_table(summary))
    console.print(f"logs of every process: {args.workdir / 'logs'}")
    if args.json:
        doc = {**summary.to_json(), **extra}
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
