"""Worker throughput with exactly-once commits, against plain consumption.

    python -m benchmarks.worker --jobs 200000 --processes 2 --json out.json

Writes ``--jobs`` exec records (as the emitter does) to a fresh queue, then:

1. baseline: a plain confluent-kafka consumer reads the same topic
   (``raw_consume_per_s``, first to last record), taking records as they
   arrive (``benchmarks/arrivals.py``: a ``consume(n, 1.0)`` would wait out
   its timeout for the last, partial batch and add up to a second);
2. the worker: ``--processes`` worker processes with a no-op handler and
   exactly-once commits (idempotency record + outcome + offsets per
   transaction); ``jobs_per_s`` is measured from the group's committed
   offsets (first commit to the last), so it counts only committed work.
   ``--result-bytes N``: the handler returns a string whose JSON is N bytes
   (the job's result, in its outcome) instead of None.

Each worker process reports the keys it ran; ``duplicates`` is runs minus
distinct keys. Uses the broker at ``--bootstrap`` / ``DUEFLOW_BOOTSTRAP``,
or starts a local one for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from benchmarks.arrivals import take_arrived
from benchmarks.output import show
from dueflow import headers as hdr
from dueflow.config import Settings, load_settings
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.records import codec

QUEUE = "bench"


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from dueflow.broker.local import LocalBroker
    from dueflow.broker.ports import free_port_pair

    state = Path(tempfile.mkdtemp(prefix="dueflow-bench-"))
    local = LocalBroker(port=free_port_pair(), state_dir=state, heap="1g")
    local.start()
    try:
        yield local.bootstrap
    finally:
        local.stop()


def produce(settings: Settings, jobs: int) -> float:
    """Write ``jobs`` exec records; return the seconds it took."""
    topic = names(settings).exec(QUEUE)
    producer = Producer(
        settings.client_config(
            **{
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "compression.type": "lz4",
                "partitioner": "murmur2_random",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
    )
    started = time.perf_counter()
    for i in range(jobs):
        job = make_job("noop", None, queue=QUEUE, key=f"bench-{i}")
        value = codec.encode("job", job.to_record())
        while True:
            try:
                producer.produce(
                    topic, value, job.idempotency_key.encode(), headers=list(exec_headers(job))
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records not delivered")
    return time.perf_counter() - started


def raw_consume(settings: Settings, jobs: int) -> float:
    """Plain confluent-kafka consumption of the exec topic: records per second."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"raw-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
    )
    consumer.subscribe([names(settings).exec(QUEUE)])
    count = 0
    first = last = 0.0
    deadline = time.monotonic() + 300
    try:
        while count < jobs and time.monotonic() < deadline:
            _, msgs = take_arrived(consumer, timeout_s=1.0, max_records=2_000)
            if msgs:
                if not count:
                    first = time.perf_counter()
                count += sum(
                    1 for m in msgs if m.error() is None and not hdr.is_command(m.headers())
                )
                last = time.perf_counter()
    finally:
        consumer.close()
    if count < jobs:
        raise RuntimeError(f"raw consumer read {count} of {jobs}")
    return (count - 1) / (last - first) if last > first else float("inf")


def child(
    settings: Settings, handler: str, out: str, result_bytes: int = 0, profile: bool = False
) -> None:
    """One worker process: a no-op handler that remembers the keys it ran (and returns a
    result of ``result_bytes`` bytes of JSON, if not 0); with ``profile``, a pyinstrument
    profile of the process is written beside ``out`` (``.profile.txt``)."""
    from dueflow.consumers import TaskContext, TaskRegistry, task
    from dueflow.consumers.worker_process import run_worker
    from dueflow.observability import logs

    obs = settings.observability
    # Log lines go to a file (what a deployment pays), not to the terminal.
    logs.configure(obs.log_format, obs.log_level, open(out + ".log", "w"))  # noqa: SIM115
    ran: list[str] = []
    marks: list[tuple[int, float]] = []  # (jobs run so far, process CPU seconds)

    def record(key: str) -> None:
        ran.append(key)
        if len(ran) % 1_000 == 1:
            marks.append((len(ran), time.process_time()))

    result = "x" * (result_bytes - 2) if result_bytes >= 2 else None

    async def noop_async(payload: Any, ctx: TaskContext) -> Any:
        record(ctx.idempotency_key)
        return result

    def noop_sync(payload: Any, ctx: TaskContext) -> Any:
        record(ctx.idempotency_key)
        return result

    noop = task("noop", queue=QUEUE)(noop_async if handler == "async" else noop_sync)
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005, async_mode="disabled")
        profiler.start()
    code = run_worker(settings, TaskRegistry([noop]), queues=[QUEUE])
    if profiler is not None:
        profiler.stop()
        Path(out + ".profile.txt").write_text(profiler.output_text(show_all=False))
        if profiler.last_session is not None:  # for other views: pyinstrument --load
            profiler.last_session.save(out + ".pyisession")
    Path(out).write_text("\n".join(ran))
    if len(marks) >= 2:
        (n0, c0), (n1, c1) = marks[0], marks[-1]
        Path(out + ".cpu").write_text(json.dumps({"jobs": n1 - n0, "cpu_s": c1 - c0}))
    sys.exit(code)


def committed(admin: AdminClient, settings: Settings, partitions: int) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions

    group = names(settings).worker_group(QUEUE)
    topic = names(settings).exec(QUEUE)
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(partitions)]
    )
    result = admin.list_consumer_group_offsets([request])[group].result(10)
    return sum(max(0, tp.offset) for tp in result.topic_partitions)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with broker(args.bootstrap or os.environ.get("DUEFLOW_BOOTSTRAP")) as bootstrap:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        settings = load_settings(
            env={},
            overrides={
                "bootstrap": bootstrap,
                "topic_prefix": prefix,
                "queues": [{"name": QUEUE, "partitions": args.partitions}],
                "worker": {"concurrency": args.concurrency, "session_timeout_ms": 6000},
                # --job-log off: warnings only (no job lines); all / failures: the
                # default INFO level in JSON with observability.job_log set so.
                "observability": (
                    {"log_format": "text", "log_level": "WARNING"}
                    if args.job_log == "off"
                    else {"log_format": "json", "log_level": "INFO", "job_log": args.job_log}
                ),
            },
        )
        # The queue's topics and the outcomes topic: not the timer topic (no emitter here).
        worker_topics = [
            t
            for t in topic_layout(settings)
            if t.role
            in ("exec", "retry", "dlq", "idempotency", "outcomes", "quarantine", "control")
        ]
        report = TopicAdmin(make_admin(settings), replication_factor=1).ensure(worker_topics)
        assert report.ok, report.differences
        produce_s = produce(settings, args.jobs)
        raw = raw_consume(settings, args.jobs)

        ctx = multiprocessing.get_context("spawn")
        outdir = Path(tempfile.mkdtemp(prefix="dueflow-bench-keys-"))
        procs = [
            ctx.Process(
                target=child,
                args=(
                    settings,
                    args.handler,
                    str(outdir / f"{i}.keys"),
                    args.result_bytes,
                    args.profile,
                ),
            )
            for i in range(args.processes)
        ]
        admin = make_admin(settings)
        for p in procs:
            p.start()
        first_at = first_count = None
        done_at = None
        deadline = time.monotonic() + args.timeout
        try:
            while time.monotonic() < deadline:
                count = committed(admin, settings, args.partitions)
                now = time.perf_counter()
                if count and first_at is None:
                    first_at, first_count = now, count
                if count >= args.jobs:
                    done_at = now
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
        if done_at is None or first_at is None or first_count is None:
            raise RuntimeError("the workers did not commit every job in time")
        ran = [line for f in outdir.glob("*.keys") for line in f.read_text().splitlines() if line]
        rate = (args.jobs - first_count) / (done_at - first_at) if done_at > first_at else 0.0
        cpu = [json.loads(f.read_text()) for f in outdir.glob("*.cpu")]
        cpu_jobs = sum(c["jobs"] for c in cpu)
        cpu_us = 1e6 * sum(c["cpu_s"] for c in cpu) / cpu_jobs if cpu_jobs > 0 else None
        if args.profile:
            print("profiles:", *sorted(outdir.glob("*.profile.txt")), sep="\n  ")
        return {
            "jobs": args.jobs,
            "executed": len(ran),
            "duplicates": len(ran) - len(set(ran)),
            "missing": args.jobs - len(set(ran)),
            "jobs_per_s": round(rate, 1),
            "raw_consume_per_s": round(raw, 1),
            "ratio": round(rate / raw, 3) if raw else None,
            # CPU of the worker processes (all their threads) per job between
            # their first and last job: independent of what else runs on the host.
            "worker_cpu_us_per_job": round(cpu_us, 1) if cpu_us else None,
            "jobs_per_cpu_s": round(1e6 / cpu_us) if cpu_us else None,
            "processes": args.processes,
            "partitions": args.partitions,
            "concurrency": args.concurrency,
            "handler": args.handler,
            "result_bytes": args.result_bytes,
            "job_log": args.job_log,
            "produce_s": round(produce_s, 2),
            "exactly_once": True,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--handler", choices=["async", "sync"], default="async")
    parser.add_argument(
        "--result-bytes",
        type=int,
        default=0,
        help="the handler returns a result of this many bytes of JSON (0: None)",
    )
    parser.add_argument(
        "--job-log",
        choices=["off", "failures", "all"],
        default="off",
        help="job log lines: off (WARNING level), or INFO with observability.job_log",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile each worker process with pyinstrument (slower; for finding costs)",
    )
    parser.add_argument("--bootstrap", help="existing cluster (default: start a local broker)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = run(args)
    show(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
