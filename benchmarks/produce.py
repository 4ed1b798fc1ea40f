"""How fast does ``Scheduler.schedule_many`` write timers, against raw produce?

    python -m benchmarks.produce --jobs 200000 --json produce.json

Measures, in the same run and against the same broker:

- ``schedule_many``: N job requests (a small JSON payload, delays spread
  over the next hour, so records go to the near partitions and the first
  two wheel levels) through the SDK: checks, ids, content hash, Avro
  encoding, placement, produce, delivery, until every record is acknowledged.
- ``raw``: the very records ``schedule_many`` writes (same keys, values,
  headers and partitions, prepared beforehand), produced with plain
  ``confluent_kafka.Producer.produce`` to a topic with the same partition
  count and configs, with the same producer settings, until flushed. Both
  sides pass ``produce`` positional arguments (keywords cost about 0.5 us a
  call); ``schedule_many`` also passes its delivery callback.

Rounds alternate (raw, sdk, raw, sdk, ...) after an untimed warm-up of both;
the median round of each is reported. ``ratio`` = schedules_per_s / raw_per_s.
Uses ``DUEFLOW_BOOTSTRAP`` (or ``--bootstrap``) when set, else starts a local
broker on a free port and stops it at the end. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import Producer

from dueflow.apps.cli.common import format_table
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin, make_producer
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import TopicSpec, names, topic_layout
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.scheduler import BULK_PRODUCER, Scheduler
from dueflow.records.job_request import JobRequest
from dueflow.wall_clock import wall_ms

Record = tuple[bytes, bytes, int, list[tuple[str, bytes]]]
T = TypeVar("T")


@contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap`` if given, else a local broker of this run (stopped by pid at the end)."""
    if bootstrap:
        yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="dueflow-bench-") as tmp:
        local = LocalBroker(port=free_port_pair(), state_dir=Path(tmp), heap="1g")
        local.start()
        try:
            yield local.bootstrap
        finally:
            local.stop()


def requests(n: int, *, start: int = 0) -> list[JobRequest]:
    """Realistic jobs: an e-mail each, due over the next hour (about 150-byte values)."""
    return [
        JobRequest(
            "send_email",
            {"to": f"user{i}@example.com", "template": "welcome", "locale": "en"},
            delay=(i * 7) % 3_600,
        )
        for i in range(start, start + n)
    ]


def planned_timers(settings: Settings, reqs: list[JobRequest]) -> Iterator[PlannedTimer]:
    """Each of ``reqs`` planned as ``schedule_many`` plans it (outside any timing)."""
    planner = TimerPlanner(settings, recent=RecentJobs(0), ids=JobIds())
    for req in reqs:
        planned = planner.plan(req, now_ms=wall_ms())
        assert isinstance(planned, PlannedTimer)
        yield planned


def plan_records(settings: Settings, reqs: list[JobRequest]) -> list[Record]:
    """The records schedule_many writes for ``reqs`` (prepared outside any timing)."""
    return [
        (p.record.key, p.record.value, p.record.partition, p.record.headers)
        for p in planned_timers(settings, reqs)
    ]


def produce_raw(producer: Producer, topic: str, records: list[Record]) -> None:
    produce: Callable[..., None] = producer.produce
    poll = producer.poll
    for key, value, partition, headers in records:
        while True:
            try:
                # positional, as schedule_many calls it (cheaper than keywords)
                produce(topic, value, key, partition, None, None, 0, headers)
                break
            except BufferError:
                poll(0.05)
    if producer.flush(120):
        raise RuntimeError("raw produce: records left unacknowledged")


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, and its wall and CPU seconds."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


class BenchTopics(NamedTuple):
    settings: Settings
    raw_topic: str  # beside the timer topic, for the raw producer
    timer_partitions: int


def bench_topics(bootstrap: str) -> BenchTopics:
    """Settings of a fresh topic prefix with every topic created, and a ``rawbench``
    topic of the timer topic's partitions and config: the raw producer's baseline
    writes the same records to it as ``schedule_many`` writes to the timers."""
    settings = load_settings(
        env=os.environ,
        overrides={"bootstrap": bootstrap, "topic_prefix": f"bench{uuid.uuid4().hex[:8]}"},
    )
    raw_topic = f"{settings.topic_prefix}.rawbench"
    timer_spec = ensure_with_copy(settings, names(settings).timers, raw_topic)
    return BenchTopics(settings, raw_topic, timer_spec.partitions)


def ensure_with_copy(settings: Settings, source: str, copy: str) -> TopicSpec:
    """Create every topic of ``settings`` and ``copy``, a topic of ``source``'s
    partitions and config (for a raw producer's baseline); ``source``'s spec."""
    layout = topic_layout(settings)
    spec = next(s for s in layout if s.name == source)
    report = TopicAdmin(
        make_admin(settings), replication_factor=settings.replication_factor
    ).ensure([*layout, TopicSpec(copy, "bench", spec.partitions, spec.config)])
    if not report.ok:
        raise RuntimeError(f"topics: {report.differences}")
    return spec


def run(bootstrap: str, jobs: int, rounds: int) -> dict[str, Any]:
    settings, raw_topic, timer_partitions = bench_topics(bootstrap)

    reqs = requests(jobs)
    warm = requests(min(jobs, 20_000), start=jobs)
    with Scheduler(settings) as scheduler:
        # the raw producer gets exactly the bulk producer's settings
        raw = make_producer(settings, **{**BULK_PRODUCER, **scheduler.producer_settings()})
        records = plan_records(settings, reqs)
        record_bytes = statistics.mean(
            len(k) + len(v) + sum(len(a) + len(b) for a, b in h) for k, v, _p, h in records
        )
        produce_raw(raw, raw_topic, plan_records(settings, warm))  # warm-up, untimed
        scheduler.schedule_many(warm)

        sdk_rounds: list[dict[str, float]] = []
        raw_rounds: list[dict[str, float]] = []
        for _ in range(rounds):
            _, wall, cpu = timed(lambda: produce_raw(raw, raw_topic, records))
            raw_rounds.append({"per_s": jobs / wall, "cpu_us_per_job": cpu / jobs * 1e6})
            result, wall, cpu = timed(lambda: scheduler.schedule_many(reqs))
            if result.scheduled != jobs:
                raise RuntimeError(f"schedule_many: {result.to_json()}")
            sdk_rounds.append({"per_s": jobs / wall, "cpu_us_per_job": cpu / jobs * 1e6})

    sdk = statistics.median(r["per_s"] for r in sdk_rounds)
    base = statistics.median(r["per_s"] for r in raw_rounds)
    return {
        "jobs": jobs,
        "rounds": rounds,
        "schedules_per_s": round(sdk),
        "raw_per_s": round(base),
        "ratio": round(sdk / base, 3),
        "sdk_cpu_us_per_job": round(statistics.median(r["cpu_us_per_job"] for r in sdk_rounds), 2),
        "raw_cpu_us_per_job": round(statistics.median(r["cpu_us_per_job"] for r in raw_rounds), 2),
        "record_bytes": round(record_bytes, 1),
        "timer_partitions": timer_partitions,
        "sdk_rounds_per_s": [round(r["per_s"]) for r in sdk_rounds],
        "raw_rounds_per_s": [round(r["per_s"]) for r in raw_rounds],
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.produce", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each")
    parser.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        out = run(bootstrap, args.jobs, args.rounds)
    print(
        format_table(
            ["", "per second (median)", "CPU us/job", "rounds"],
            [
                [
                    "schedule_many",
                    out["schedules_per_s"],
                    out["sdk_cpu_us_per_job"],
                    " ".join(map(str, out["sdk_rounds_per_s"])),
                ],
                [
                    "raw produce",
                    out["raw_per_s"],
                    out["raw_cpu_us_per_job"],
                    " ".join(map(str, out["raw_rounds_per_s"])),
                ],
            ],
        )
    )
    print(
        f"ratio {out['ratio']}  ({out['jobs']} jobs of {out['record_bytes']} bytes "
        f"(key+value+headers), {out['timer_partitions']} timer partitions)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
