"""What do ``scheduled`` outcomes (on by default) cost the scheduling client?

    python -m benchmarks.scheduled_outcomes --jobs 100000 --json scheduled_outcomes.json

With them, every job the SDK schedules also gets a small ``scheduled``
record in the outcomes topic (written once its timer is acknowledged), so
the status view, ``Scheduler.status`` and ``dueflow job`` know a job before
it runs. Measured in the same run and against the same broker, rounds
alternating after an untimed warm-up of each:

- ``raw``: the very timer records ``schedule_many`` writes, produced with
  plain ``confluent_kafka.Producer`` (as ``benchmarks.produce``);
- ``raw_both``: the floor of what ``on`` writes: the same timer records, then
  (once they are acknowledged, as the SDK does) each job's ``scheduled``
  outcome record to a topic of the outcomes topic's partitions and config,
  plain ``produce`` again;
- ``off``: ``Scheduler(scheduled_outcomes=False).schedule_many``;
- ``on``: ``Scheduler()`` (the default) ``.schedule_many``;
- ``one_by_one_off`` / ``one_by_one_on``: ``schedule()`` calls, each waiting
  for its acknowledgement (``--single`` jobs): the latency-bound path.

Reported: the median of each, ``ratio_on`` / ``ratio_off`` against raw,
``ratio_on_both`` (``on`` against ``raw_both``: two records per job on each
side), and
``cost_on`` = 1 - on/off (the share of throughput the outcomes take); CPU per
job of the whole process (``cpu_us_per_job``, librdkafka's threads included)
and of the calling thread alone (``main_cpu_us_per_job``: planning, ``produce``
calls and serving delivery reports, the part one Python thread must do). Uses
``DUEFLOW_BOOTSTRAP`` (or ``--bootstrap``) when set, else starts a local
broker on a free port and stops it at the end. Prints a table and writes JSON
(``benchmarks/output.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.output import show
from benchmarks.produce import (
    Record,
    bench_topics,
    broker,
    ensure_with_copy,
    plan_records,
    planned_timers,
    produce_raw,
    requests,
    timed,
)
from dueflow.apps.cli.common import format_table
from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.producers.outcomes import scheduled_outcome
from dueflow.producers.scheduler import BULK_PRODUCER, Scheduler
from dueflow.records.job_request import JobRequest
from dueflow.wall_clock import wall_ms


def outcome_records(settings: Settings, reqs: list[JobRequest]) -> list[Record]:
    """The ``scheduled`` outcome records ``schedule_many`` writes for ``reqs``, for
    the raw side (prepared outside any timing)."""
    topic_names = names(settings)
    out: list[Record] = []
    for planned in planned_timers(settings, reqs):
        job = planned.job
        rec = scheduled_outcome(
            topic_names,
            job_id=job.job_id,
            queue=job.queue,
            task=job.task,
            idempotency_key=job.idempotency_key,
            due_ms=job.due_ms,
            at_ms=wall_ms(),
            content_hash=job.content_hash,
        )
        assert rec.value is not None
        out.append((rec.key, rec.value, -1, rec.headers))
    return out


def run(bootstrap: str, jobs: int, rounds: int, single: int) -> dict[str, Any]:
    settings, raw_topic, _ = bench_topics(bootstrap)
    outcomes_topic = f"{settings.topic_prefix}.rawbench-outcomes"
    ensure_with_copy(settings, names(settings).outcomes, outcomes_topic)

    reqs = requests(jobs)
    warm = requests(min(jobs, 20_000), start=jobs)
    per_s: dict[str, list[float]] = {"raw": [], "raw_both": [], "off": [], "on": []}
    cpu: dict[str, list[float]] = {"raw": [], "raw_both": [], "off": [], "on": []}
    main_cpu: dict[str, list[float]] = {"raw": [], "raw_both": [], "off": [], "on": []}
    with (
        Scheduler(settings, scheduled_outcomes=False) as off,
        Scheduler(settings) as on,
    ):
        if not on.scheduled_outcomes or off.scheduled_outcomes:
            raise RuntimeError("the default must write scheduled outcomes")
        raw = make_producer(settings, **{**BULK_PRODUCER, **off.producer_settings()})
        records = plan_records(settings, reqs)
        outcomes = outcome_records(settings, reqs)

        def raw_both() -> None:
            produce_raw(raw, raw_topic, records)  # flushed: acknowledged
            produce_raw(raw, outcomes_topic, outcomes)

        produce_raw(raw, raw_topic, plan_records(settings, warm))  # warm-up, untimed
        produce_raw(raw, outcomes_topic, outcome_records(settings, warm))
        off.schedule_many(warm)
        on.schedule_many(warm)
        for _ in range(rounds):
            thread = time.thread_time()
            _, wall, used = timed(lambda: produce_raw(raw, raw_topic, records))
            main_cpu["raw"].append((time.thread_time() - thread) / jobs * 1e6)
            per_s["raw"].append(jobs / wall)
            cpu["raw"].append(used / jobs * 1e6)
            thread = time.thread_time()
            _, wall, used = timed(raw_both)
            main_cpu["raw_both"].append((time.thread_time() - thread) / jobs * 1e6)
            per_s["raw_both"].append(jobs / wall)
            cpu["raw_both"].append(used / jobs * 1e6)
            for name, scheduler in (("off", off), ("on", on)):
                thread = time.thread_time()
                result, wall, used = timed(functools.partial(scheduler.schedule_many, reqs))
                main_cpu[name].append((time.thread_time() - thread) / jobs * 1e6)
                if result.scheduled != jobs:
                    raise RuntimeError(f"schedule_many: {result.to_json()}")
                per_s[name].append(jobs / wall)
                cpu[name].append(used / jobs * 1e6)
        one_by_one: dict[str, float] = {}
        for name, scheduler in (("off", off), ("on", on)):
            started = time.perf_counter()
            for req in requests(single, start=2 * jobs):
                scheduler.schedule_request(req)
            one_by_one[name] = single / (time.perf_counter() - started)
        failed_outcomes = on.outcome_reports.failed

    med = {k: statistics.median(v) for k, v in per_s.items()}
    return {
        "jobs": jobs,
        "rounds": rounds,
        "raw_per_s": round(med["raw"]),
        "raw_both_per_s": round(med["raw_both"]),
        "off_per_s": round(med["off"]),
        "on_per_s": round(med["on"]),
        "ratio_off": round(med["off"] / med["raw"], 3),
        "ratio_on": round(med["on"] / med["raw"], 3),
        "ratio_on_both": round(med["on"] / med["raw_both"], 3),
        "cost_on": round(1 - med["on"] / med["off"], 3),
        "cpu_us_per_job": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "main_cpu_us_per_job": {k: round(statistics.median(v), 2) for k, v in main_cpu.items()},
        "single": single,
        "one_by_one_off_per_s": round(one_by_one["off"]),
        "one_by_one_on_per_s": round(one_by_one["on"]),
        "failed_outcomes": failed_outcomes,
        "rounds_per_s": {k: [round(x) for x in v] for k, v in per_s.items()},
        "cpus": os.cpu_count(),
    }


def ratio_cell(out: dict[str, Any], key: str) -> str:
    """The table's ratio column: ``on`` against both raw floors."""
    if key == "raw":
        return "1"
    if key == "raw_both":
        return "-"
    if key == "on":
        return f"{out['ratio_on']} (to both: {out['ratio_on_both']})"
    return str(out[f"ratio_{key}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scheduled_outcomes", description=__doc__
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each")
    parser.add_argument("--single", type=int, default=2_000, help="schedule() calls of each")
    parser.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    with broker(args.bootstrap) as bootstrap:
        out = run(bootstrap, args.jobs, args.rounds, args.single)
    out["host"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(
        format_table(
            [
                "schedule_many",
                "per second (median)",
                "ratio to raw",
                "CPU us/job",
                "calling thread",
                "rounds",
            ],
            [
                [
                    name,
                    out[f"{key}_per_s"],
                    ratio_cell(out, key),
                    out["cpu_us_per_job"][key],
                    out["main_cpu_us_per_job"][key],
                    " ".join(map(str, out["rounds_per_s"][key])),
                ]
                for name, key in (
                    ("raw produce", "raw"),
                    ("raw produce, timers then outcomes", "raw_both"),
                    ("scheduled outcomes off", "off"),
                    ("scheduled outcomes on (default)", "on"),
                )
            ],
        )
    )
    print()
    show(
        {
            "cost of the outcomes (1 - on/off)": out["cost_on"],
            "schedule() one by one, off": f"{out['one_by_one_off_per_s']}/s",
            "schedule() one by one, on": f"{out['one_by_one_on_per_s']}/s",
            "host load before -> after": (
                f"{out['host']['load_before'][0]} -> {out['host']['load_after'][0]}"
            ),
        },
        None,
    )
    if args.json:
        show(out, args.json, hide=set(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
