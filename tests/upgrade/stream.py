"""A service that schedules a steady stream of jobs with the SDK of one release.

Run as a script by that release's interpreter (``python tests/upgrade/stream.py
...``), so it uses only what every release's SDK has (``load_settings``,
``Scheduler.schedule``, ``Scheduler.add_schedule``) and the standard library;
the cluster, topics and queues come from the environment, as for the
processes. It writes one JSON line per fact to ``--out`` (flushed at once):

- ``{"type": "ready"}`` once the scheduler is started;
- ``{"type": "cron", "schedule_id", "cron", "kind", "start_ms", "end_ms", "sdk"}``
  per ``--cron`` schedule added;
- ``{"type": "job", "job_id", "due_ms", "kind", "sdk", "at_ms", "far"}`` per job,
  once the broker has its timer;
- ``{"type": "stopped", "jobs": N}`` at a SIGTERM, after the last job.

Jobs: ``--far N`` jobs due ``--far-delay-s`` out, first; then ``--rate`` jobs a
second due 0.5-10 s out until SIGTERM, their kinds in a fixed rotation (see
``kind_of``) from ``--first`` (two streams of one test use different ranges).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from typing import IO, Any

TASK = "upgrade-job"
QUEUE = "jobs"
MAX_ATTEMPTS = 2  # an exhausted job fails twice (tiers: the queue's first, then DLQ)


def kind_of(i: int) -> str:
    """The kind of the stream's ``i``-th job: mostly ``ok``, every few a failing one."""
    if i % 40 == 7:
        return "permanent"
    if i % 40 == 27:
        return "exhausted"
    if i % 5 == 3:
        return "flaky"
    if i % 10 == 5:
        return "slow"
    return "ok"


def work_ms_of(i: int, kind: str) -> int:
    """How long the handler works: 20-170 ms, a slow job 1-2 s (jobs are in flight)."""
    if kind == "slow":
        return 1_000 + (i * 379) % 1_000
    return 20 + (i * 31) % 150


def delay_ms_of(i: int) -> int:
    """Due 0.5-10 s out."""
    return 500 + (i * 7_919) % 9_500


def _emit(out: IO[str], doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def _schedule(s: Any, out: IO[str], sdk: str, i: int, delay_ms: int, *, far: bool) -> None:
    kind = kind_of(i)
    job = s.schedule(
        TASK,
        {"kind": kind, "work_ms": work_ms_of(i, kind), "i": i},
        queue=QUEUE,
        delay=delay_ms / 1000,
        max_attempts=MAX_ATTEMPTS if kind == "exhausted" else None,
        # The optional fields each reader range-checks: labels (given unsorted: a
        # release may write them in either order), a timeout and a deadline.
        labels={"sdk": sdk, "kind": kind},
        timeout=30,
        max_lateness=600,
    )
    _emit(
        out,
        {
            "type": "job",
            "job_id": job.job_id,
            "due_ms": job.due_ms,
            "kind": kind,
            "sdk": sdk,
            "at_ms": time.time_ns() // 1_000_000,
            "far": far,
        },
    )


def cron_window(now_ms: int, every_s: int, starts_in_ms: int, lasts_ms: int) -> tuple[int, int]:
    """The schedule's start and end: each half way between two occurrences (none on
    the edge), the start at least ``starts_in_ms`` after ``now_ms``."""
    step = every_s * 1000
    start = (now_ms + starts_in_ms) // step * step + step // 2
    return start, start + lasts_ms // step * step


def _add_cron(s: Any, out: IO[str], sdk: str, spec: str) -> None:
    """``ID|EXPRESSION|KIND|STARTS_IN_MS|LASTS_MS``: a schedule in UTC from this
    stream's now, every missed one fired."""
    schedule_id, expr, kind, starts_in_ms, lasts_ms = spec.split("|")
    every_s = int(expr.split()[0].removeprefix("*/"))
    start_ms, end_ms = cron_window(
        time.time_ns() // 1_000_000, every_s, int(starts_in_ms), int(lasts_ms)
    )
    s.add_schedule(
        schedule_id,
        cron=expr,
        timezone="UTC",
        task=TASK,
        payload={"kind": kind, "work_ms": 50},
        queue=QUEUE,
        misfire="fire_all",
        start=datetime.fromtimestamp(int(start_ms) / 1000, UTC),
        end=datetime.fromtimestamp(int(end_ms) / 1000, UTC),
    )
    _emit(
        out,
        {
            "type": "cron",
            "schedule_id": schedule_id,
            "cron": expr,
            "kind": kind,
            "start_ms": int(start_ms),
            "end_ms": int(end_ms),
            "sdk": sdk,
        },
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--sdk", required=True, help="the release's name, written with each job")
    p.add_argument("--rate", type=int, default=20, help="jobs a second")
    p.add_argument("--first", type=int, default=0, help="index of the first job")
    p.add_argument("--far", type=int, default=0)
    p.add_argument("--far-delay-s", type=float, default=60.0)
    p.add_argument("--cron", action="append", default=[])
    args = p.parse_args(argv)

    from dueflow.config import load_settings
    from dueflow.producers import Scheduler

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    settings = load_settings(env=os.environ)
    i = args.first
    with open(args.out, "a") as out, Scheduler(settings) as s:
        _emit(out, {"type": "ready", "sdk": args.sdk})
        for spec in args.cron:
            _add_cron(s, out, args.sdk, spec)
        for n in range(args.far):
            _schedule(s, out, args.sdk, i, int(args.far_delay_s * 1000) + n * 100, far=True)
            i += 1
        per_tick = max(1, args.rate // 10)
        while not stop.is_set():
            for _ in range(per_tick):
                _schedule(s, out, args.sdk, i, delay_ms_of(i), far=False)
                i += 1
            stop.wait(0.1)  # the stream's pace
        _emit(out, {"type": "stopped", "jobs": i - args.first})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
