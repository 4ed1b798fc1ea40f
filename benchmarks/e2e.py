"""End to end: schedule jobs, fire them, run them, commit them (exactly-once on).

    python -m benchmarks.e2e --jobs 200000 --processes 2 --json e2e.json
    python -m benchmarks.e2e --mode steady --rate 5000 --duration 30 --json steady.json

The whole pipeline as real processes on one broker (``--bootstrap`` /
``DUEFLOW_BOOTSTRAP``, else a local one started for the run), default wheel:
the SDK's ``schedule_many`` in this process, one ``python -m dueflow
emitter`` (the active one), ``--processes`` worker processes running an
async no-op handler that notes the job's key, due time and start time.

- ``burst`` (default): ``--jobs`` jobs due within ``--window-s`` of the
  first schedule. ``throughput_jobs_per_s`` = jobs / (first schedule ->
  every job committed: outcomes and exec offsets, one transaction; how it is
  seen: ``benchmarks/completion.py``, ``completion_watch`` in the result). With ``--ahead-s S`` the
  jobs are due within ``--window-s`` from S seconds after the first
  schedule, every one of them written before the first is due, and the
  throughput and the CPU count from the first due time: a burst of jobs
  coming due, scheduling not included.
- ``steady``: ``--rate`` jobs per second for ``--settle-s`` plus
  ``--duration`` seconds, each due 1-3 s after it is scheduled, in one
  ``schedule_many`` call about every ``--feed-every-ms`` (5): the lateness a
  job sees at that rate.

The headline, ``lateness_ms`` {p50,p95,p99,max}, is handler start - due over
every job (its first run): the worker is a ``read_committed`` consumer, so
this is what a consumer sees (the emitter's fires once appended; with
``--emitter transactional=true`` once its transaction committed). The pipeline is
created for the run (new topics, a new consumer group, the emitter's first
transactions) and its first seconds are slower; ``lateness_settled_ms``
(steady) leaves out the jobs due before 1 s after ``--settle-s`` and is
only ever shown as "settled", next to the headline. ``fired_lateness_ms``
(the emitter's ``df-fired`` stamp - due) and ``fired_to_start_ms`` say where
the time goes; they are not what a job sees. ``executed``, ``lost`` (jobs
never run), ``duplicates`` (runs beyond the first: must be 0);
``duplicates_skipped`` (copies of a job the emitter fired again that the
workers skipped: committed ``duplicate`` outcomes) and ``emitter_refires``
(the emitter's count of fires it may have repeated after a takeover). Burst:
``throughput_spread_jobs_per_s``, the min / median / max over ``--runs``.

``--runs N`` repeats the measurement N times in one invocation (fresh
topics each, the same broker, one warm-up before the first): the headlines
are over every job of every run, ``per_run`` has each run's figures, and
``lateness_p99_spread_ms`` (also ``raw_latency_`` and
``lateness_settled_``) the min / median / max of the runs' p99. Each run
records ``broker_state`` (``cold``: started for this invocation, nothing
before the run; ``warmed``: the warm-up or earlier runs went first,
``broker_load_before_s`` wall seconds of them, set-up included;
``external``: ``--bootstrap``) and ``load_s``, the run length.

Baseline in the same run, on the same broker: ``raw_roundtrip_msgs_per_s``,
plain confluent-kafka produce + consume of as many records of the same size
through one topic with the exec topic's partition count (a consumer in its
own process, first produce to last receive); ``ratio`` = pipeline / raw. In
steady mode the raw records are also sent at ``--rate``, by a producer that
lingers 0 ms (the floor: each record goes out at once), and their latency
(receive - produce) is ``raw_latency_ms``. Every measuring consumer (the
baseline's, the outcome watcher) reads records as soon as they arrive
(``benchmarks/arrivals.py``), so it adds no batching wait.

CPU: ``cpu_us_per_job`` is user+sys CPU per job of each process the run
starts or is (``load_producer``: this process, ``schedule_many`` and the
commit polling; ``emitter``; ``worker_<n>``; the local ``broker``), from the
first schedule to the last commit, idle polling included;
``raw_cpu_us_per_record`` the same for the baseline's producer and consumer;
``watcher_cpu_us_per_job`` the completion watcher's (not in the total).
``broker_jit_cpu_s`` is the part of the local broker's CPU its JIT compiler
threads took during the measured run, and ``broker_threads_cpu_us_per_job``
the broker's CPU per job by kind of thread (the request path, JIT, GC, group
coordinator, transaction markers: ``benchmarks/broker_probe.py``);
``--broker-requests`` adds its requests per second by API
(``broker_requests_per_s``, read over JMX) and ``broker_requests_per_job``;
``host_cpu`` the busy and steal shares
of the whole host's CPU meanwhile (near 1.0 busy: the run measured queueing
for a core). ``--per-second``: each run's lateness by second of due time
(``per_run[].per_second``), to tell episodes from a tail everywhere.
``--visibility``: two more readers of the exec topics split the time from
the emitter's stamp to a ``read_committed`` consumer into appended and
committed (``per_run[].visibility``, ``benchmarks/visibility_probe.py``);
they cost CPU, so such runs are for the split, not the headline.
Experiments: ``--emitter``/``--worker KEY=VALUE`` (settings),
``--broker KEY=VALUE`` (server properties of the local broker),
``--broker-jvm=OPTION`` (its JVM); all are recorded in the result.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from benchmarks.arrivals import take_arrived
from benchmarks.broker_probe import BrokerRequests, cpu_delta, request_rates, thread_cpu_s
from benchmarks.completion import completion_watcher
from benchmarks.e2e_result import (
    Measured,
    combine,
    host_cpu_share,
    per_job,
    per_second,
    run_figures,
)
from benchmarks.output import show
from benchmarks.proc_cpu import cpu_s
from benchmarks.produce import plan_records
from benchmarks.spread import broker_state, describe, spread_rows
from benchmarks.visibility_probe import SPANS, VisibilityProbe
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port, free_port_pair
from dueflow.config import Settings, load_settings
from dueflow.headers import FIRED
from dueflow.kafka.clients import consumer_config, make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import TopicSpec, names, topic_layout
from dueflow.producers import Scheduler
from dueflow.records.job_request import JobRequest
from dueflow.wall_clock import wall_ms
from tests.support.emitters import EmitterSubprocess, wait_until

QUEUE = "bench"
RAW_WARM_KEY = b"warm-up"  # the raw baseline's first record: not counted, not timed
TASK = "e2e.noop"


# ----------------------------------------------------------------------------- workers


def worker_main(settings: Settings, out: str) -> None:
    """One worker process: a no-op handler that notes (key, due, start, fired) of
    every run (fired: the emitter's ``df-fired`` header, -1 if absent)."""
    from dueflow.consumers import TaskContext, TaskRegistry, task
    from dueflow.consumers.worker_process import run_worker
    from dueflow.observability import logs

    logs.configure("text", "WARNING")
    runs: list[tuple[str, int, int, int]] = []
    note = runs.append

    async def noop(payload: Any, ctx: TaskContext) -> None:
        start = time.time_ns() // 1_000_000
        note((ctx.idempotency_key, ctx.due_ms, start, int(ctx.headers.get(FIRED, b"-1"))))

    code = run_worker(settings, TaskRegistry([task(TASK, queue=QUEUE)(noop)]), queues=[QUEUE])
    Path(out).write_text(json.dumps({"runs": runs}))
    sys.exit(code)


class Workers:
    """``count`` spawned worker processes, stopped with SIGTERM (then SIGKILL) by pid."""

    def __init__(self, settings: Settings, count: int, workdir: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.files = [workdir / f"worker-{i}.json" for i in range(count)]
        self.procs = [
            ctx.Process(target=worker_main, args=(settings, str(f)), daemon=False)
            for f in self.files
        ]

    def start(self) -> Workers:
        for p in self.procs:
            p.start()
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join(10)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def runs(self) -> list[tuple[str, int, int, int]]:
        runs: list[tuple[str, int, int, int]] = []
        for f in self.files:
            doc = json.loads(f.read_text())
            runs.extend((str(k), int(d), int(s), int(fi)) for k, d, s, fi in doc["runs"])
        return runs


def group_ready(admin: AdminClient, group: str, members: int) -> bool:
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
    except Exception:
        return False
    return len(desc.members) >= members and "STABLE" in str(desc.state).upper()


# ----------------------------------------------------------------------------- baseline


def raw_consumer_main(settings: Settings, topic: str, count: int, out: str, ready: Any) -> None:
    """Read ``count`` records of ``topic`` as they arrive; write the last receive time,
    the latencies (receive - produce) and this process's CPU seconds."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"raw-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    consumer.poll(0.5)  # connected and fetching before the producer starts
    ready.set()
    seen = 0
    last = 0
    latencies: list[int] = []
    deadline = time.monotonic() + 300
    while seen < count and time.monotonic() < deadline:
        at, msgs = take_arrived(consumer, timeout_s=0.05)
        if not msgs:
            continue
        for m in msgs:
            if m.error() is None and m.key() != RAW_WARM_KEY:
                seen += 1
                if len(latencies) < 200_000:
                    latencies.append(at - int(m.timestamp()[1]))
        last = at
    consumer.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(
        json.dumps(
            {
                "seen": seen,
                "last_ms": last,
                "latencies": latencies,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
        )
    )


def raw_roundtrip(
    settings: Settings,
    records: list[tuple[bytes, bytes, int, list[tuple[str, bytes]]]],
    workdir: Path,
    *,
    rate: float | None = None,
) -> dict[str, Any]:
    """Plain produce + consume of ``records`` through one topic (see the module docstring)."""
    topic = f"{settings.topic_prefix}.raw"
    parts = settings.queue(QUEUE).partitions
    report = TopicAdmin(make_admin(settings), replication_factor=1).ensure(
        [TopicSpec(topic, "bench", parts, {"cleanup.policy": "delete"})]
    )
    assert report.ok, report.differences
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    out = workdir / "raw.json"
    proc = ctx.Process(
        target=raw_consumer_main, args=(settings, topic, len(records), str(out), ready)
    )
    proc.start()
    try:
        ready.wait(60)
        producer = Producer(
            settings.client_config(
                **{
                    "linger.ms": 0 if rate else 20,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 1_000_000,
                    "enable.idempotence": True,
                }
            )
        )
        # Connected, with its producer id, before the clock starts: otherwise the
        # first ~0.3 s of records wait for that and make the baseline's p99.
        producer.produce(topic, b"", RAW_WARM_KEY, 0)
        producer.flush(30)
        first = wall_ms()
        t0 = time.monotonic()
        cpu0 = time.process_time()
        for i, (key, value, _p, headers) in enumerate(records):
            if rate and i % 50 == 0:
                ahead = t0 + i / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # pacing of the load generator
            while True:
                try:
                    producer.produce(topic, value, key, i % parts, headers=list(headers))
                    break
                except BufferError:
                    producer.poll(0.01)
            if i % 1_000 == 0:
                producer.poll(0)
        producer.flush(60)
        producer_cpu = time.process_time() - cpu0
        proc.join(300)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    doc = json.loads(out.read_text())
    if doc["seen"] < len(records):
        raise RuntimeError(f"raw consumer read {doc['seen']} of {len(records)}")
    seconds = (doc["last_ms"] - first) / 1000
    return {
        "msgs_per_s": round(len(records) / seconds) if seconds > 0 else None,
        "seconds": seconds,
        "latencies": [float(x) for x in doc["latencies"]],
        "cpu_s": {"producer": producer_cpu, "consumer": float(doc["cpu_s"])},
    }


# ----------------------------------------------------------------------------- pipeline


def bench_settings(
    bootstrap: str,
    partitions: int,
    emitter: dict[str, str] | None = None,
    worker: dict[str, str] | None = None,
) -> Settings:
    s = load_settings(
        env={},
        overrides={
            "bootstrap": bootstrap,
            "topic_prefix": f"e2e{uuid.uuid4().hex[:8]}",
            "queues": [{"name": QUEUE, "partitions": partitions}],
            "worker": {"concurrency": 64, "session_timeout_ms": 6_000, **(worker or {})},
            "emitter": dict(emitter or {}),
            "observability": {"log_format": "json", "log_level": "INFO"},
        },
    )
    report = TopicAdmin(make_admin(s), replication_factor=1).ensure(topic_layout(s))
    assert report.ok, report.differences
    return s


def requests_burst(jobs: int, window_ms: int, ahead_ms: int = 0) -> list[JobRequest]:
    """``jobs`` e-mail jobs due evenly over ``window_ms``, from ``ahead_ms`` after
    they are scheduled."""
    return [
        JobRequest(
            TASK,
            {"to": f"user{i}@example.com", "template": "welcome", "locale": "en"},
            delay=(ahead_ms + i * window_ms // jobs) / 1000,
            queue=QUEUE,
        )
        for i in range(jobs)
    ]


def steady_feed(
    scheduler: Scheduler, rate: int, seconds: float, *, every_s: float = 0.005
) -> tuple[int, float]:
    """Schedule ``rate`` jobs/s for ``seconds``, due 1-3 s ahead, one ``schedule_many``
    call about every ``every_s`` (each flushes: a ProduceRequest per timer partition
    its jobs fall in); (count, seconds taken)."""
    t0 = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - t0) < seconds:
        target = int(elapsed * rate)
        if target > i:
            batch = [
                JobRequest(
                    TASK,
                    {"to": f"user{k}@example.com", "template": "welcome", "locale": "en"},
                    delay=1.0 + (k * 7_919 % 2_000) / 1000,
                    queue=QUEUE,
                )
                for k in range(i, target)
            ]
            result = scheduler.schedule_many(batch)
            if not result.ok:
                raise RuntimeError(f"schedule_many: {result.to_json()}")
            i = target
        time.sleep(every_s)  # pacing of the load generator
    return i, time.monotonic() - t0


@contextmanager
def pipeline(
    settings: Settings, processes: int, workdir: Path
) -> Iterator[tuple[EmitterSubprocess, Workers]]:
    """An active emitter and ``processes`` workers in a stable group."""
    port = free_port()
    emitter = EmitterSubprocess(
        settings,
        workdir / "emitter.log",
        extra_env={"DUEFLOW_OBSERVABILITY_METRICS_PORT": str(port)},
    ).start()
    workers = Workers(settings, processes, workdir)
    try:
        workers.start()
        wait_until(lambda: emitter.active_count() > 0, 90, "the emitter to become active")
        admin = make_admin(settings)
        group = names(settings).worker_group(QUEUE)
        wait_until(lambda: group_ready(admin, group, processes), 120, "the worker group", 0.25)
        yield emitter, workers
    finally:
        workers.stop()
        emitter.stop()


def warm_up(
    bootstrap: str,
    args: argparse.Namespace,
    emitter: dict[str, str],
    worker: dict[str, str],
    workdir: Path,
) -> float:
    """Run jobs at ``--warmup-rate`` for ``--warmup-s`` through a pipeline of
    their own (own topics) first.

    A broker started for the run compiles its request paths (the JVM's JIT)
    for about its first minute under load: 0.25-0.7 of a core went to compiler
    threads while a cold broker served the measured jobs, and lateness p99 at
    5k jobs/s halved once they were done. A production broker is warm; so is
    the raw baseline, which runs after the pipeline. What the JIT still takes
    during the measured run is ``broker_jit_cpu_s`` (~3 s of the broker's ~19 s
    at 5k jobs/s after the default warm-up; warming up until the compiler
    threads were idle at the warm-up rate did not lower it). Seconds taken."""
    if args.warmup_s <= 0:
        return 0.0
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    settings = bench_settings(bootstrap, args.partitions, emitter, worker)
    with (
        pipeline(settings, args.processes, workdir),
        completion_watcher(settings, QUEUE) as watcher,
    ):
        with Scheduler(settings) as scheduler:
            jobs, _ = steady_feed(
                scheduler, args.warmup_rate, args.warmup_s, every_s=args.feed_every_ms / 1000
            )
        watcher.wait(jobs, args.timeout)
    return time.monotonic() - t0


def _host_cpu() -> list[int]:
    """The host's CPU time so far: the ``cpu`` line of ``/proc/stat`` (clock ticks)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


@contextmanager
def cluster(
    bootstrap: str | None,
    workdir: Path,
    properties: dict[str, str] | None = None,
    jvm_options: list[str] | None = None,
) -> Iterator[tuple[str, int | None]]:
    """``(bootstrap, broker pid)``: the given cluster (pid unknown) or a local broker."""
    if bootstrap:
        yield bootstrap, None
        return
    local = LocalBroker(
        port=free_port_pair(),
        state_dir=workdir / "broker",
        heap="1g",
        extra_properties=properties,
        jvm_options=jvm_options or (),
    )
    pid, _ = local.start()
    try:
        yield local.bootstrap, pid
    finally:
        local.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dueflow-e2e-") as tmp:
        workdir = Path(tmp)
        properties = dict(i.partition("=")[::2] for i in args.broker)
        with cluster(args.bootstrap, workdir, properties, args.broker_jvm) as (
            bootstrap,
            broker_pid,
        ):
            return _run(args, bootstrap, broker_pid, workdir, load_before)


def _run(
    args: argparse.Namespace,
    bootstrap: str,
    broker_pid: int | None,
    workdir: Path,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    emitter_settings = dict(i.partition("=")[::2] for i in args.emitter)
    worker_settings = dict(i.partition("=")[::2] for i in args.worker)
    warmup_s = warm_up(bootstrap, args, emitter_settings, worker_settings, workdir / "warmup")
    broker_load_s = warmup_s  # seconds of load the broker carried before the next run
    measured: list[Measured] = []
    record_bytes = 0.0
    for i in range(args.runs):
        t0 = time.monotonic()
        settings = bench_settings(bootstrap, args.partitions, emitter_settings, worker_settings)
        m, record_bytes = measure(
            args,
            settings,
            broker_pid,
            workdir / f"run-{i + 1}",
            broker_state=broker_state(
                started_here=broker_pid is not None, load_before_s=broker_load_s
            ),
            broker_load_before_s=round(broker_load_s, 1) if broker_pid else None,
        )
        measured.append(m)
        if args.runs_out:
            path = args.runs_out
            if args.runs > 1:
                path = path.with_name(f"{path.stem}.{i + 1}{path.suffix}")
            path.write_text(json.dumps(sorted(m.runs, key=lambda r: r[2])))
        broker_load_s += time.monotonic() - t0
        lateness = run_figures(m, steady=steady(args))["lateness_ms"]
        print(f"run {i + 1} of {args.runs}: lateness {describe(lateness)}", flush=True)
    transactional = load_settings(
        env={}, overrides={"emitter": emitter_settings}
    ).emitter.transactional
    out: dict[str, Any] = {
        "benchmark": "e2e",
        "mode": args.mode,
        **combine(measured, steady=steady(args)),
        "processes": args.processes,
        "partitions": args.partitions,
        "exactly_once": True,
        "emitter_transactional": transactional,
        # how "every job committed" was seen (benchmarks/completion.py)
        "completion_watch": "outcomes" if transactional else "committed offsets",
        "record_bytes": round(record_bytes, 1),
        "broker_started_for_run": broker_pid is not None,
        "host": host_info(load_before),
        "warmup_rate_per_s": args.warmup_rate,
        "warmup_s": round(warmup_s, 1),
        "emitter_settings": emitter_settings,
        "worker_settings": worker_settings,
        "broker_settings": dict(i.partition("=")[::2] for i in args.broker),
        "broker_jvm_options": args.broker_jvm,
    }
    if args.mode == "burst":
        out["window_s"] = args.window_s
        out["ahead_s"] = args.ahead_s
    else:
        out["rate_per_s"] = args.rate
        out["duration_s"] = args.duration
        out["settle_s"] = args.settle_s
        out["load_s"] = args.settle_s + args.duration
        out["feed_every_ms"] = args.feed_every_ms
    return out


def steady(args: argparse.Namespace) -> bool:
    return bool(args.mode == "steady")


def measure(
    args: argparse.Namespace,
    settings: Settings,
    broker_pid: int | None,
    workdir: Path,
    *,
    broker_state: str,
    broker_load_before_s: float | None,
) -> tuple[Measured, float]:
    """One run on fresh topics (``settings``' own prefix): the pipeline, then the raw
    baseline on the same broker; and the mean record size."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (
        pipeline(settings, args.processes, workdir) as (emitter, workers),
        completion_watcher(settings, QUEUE) as watcher,
        ExitStack() as probes,
    ):
        requests = (
            probes.enter_context(BrokerRequests(broker_pid))
            if broker_pid and args.broker_requests
            else None
        )
        visibility = (
            probes.enter_context(
                VisibilityProbe(
                    consumer_config(settings, f"{settings.topic_prefix}.visibility"),
                    [names(settings).exec(q) for q in settings.queue_names],
                    workdir / "visibility",
                )
            )
            if args.visibility
            else None
        )
        # user+sys CPU of every process of the pipeline, from the first schedule to the
        # last commit: idle polling counts, as it does in production
        pids = {
            "emitter": emitter.pid,
            **{f"worker_{n + 1}": pid for n, pid in enumerate(workers.pids())},
        }
        if broker_pid:
            pids["broker"] = broker_pid
        cpu0 = {k: cpu_s(pid) for k, pid in pids.items()}
        host0 = _host_cpu()
        threads0 = thread_cpu_s(broker_pid) if broker_pid else {}
        requests0 = requests.counts() if requests else {}
        wall0 = time.monotonic()
        own0 = time.process_time()
        with Scheduler(settings) as scheduler:
            if args.mode == "burst":
                ahead_ms = int(args.ahead_s * 1000)
                reqs = requests_burst(args.jobs, int(args.window_s * 1000), ahead_ms)
                started = time.time()
                result = scheduler.schedule_many(reqs)
                scheduled_s = time.time() - started
                if not result.ok:
                    raise RuntimeError(f"schedule_many: {result.to_json()}")
                jobs = result.scheduled
                if ahead_ms:
                    # the burst is the jobs coming due: measured from the first due time,
                    # every job written before it
                    first_due = started + ahead_ms / 1000
                    if time.time() >= first_due:
                        raise RuntimeError(
                            f"scheduling took {scheduled_s:.1f} s, past the first due time:"
                            " raise --ahead-s"
                        )
                    time.sleep(first_due - time.time())
                    started = first_due
                    cpu0 = {k: cpu_s(pid) for k, pid in pids.items()}
                    host0 = _host_cpu()
                    threads0 = thread_cpu_s(broker_pid) if broker_pid else {}
                    own0 = time.process_time()
            else:
                started = time.time()
                jobs, scheduled_s = steady_feed(
                    scheduler,
                    args.rate,
                    args.settle_s + args.duration,
                    every_s=args.feed_every_ms / 1000,
                )
        done = watcher.wait(jobs, args.timeout)
        commit_ms = emitter_commit_ms(int(emitter.extra_env["DUEFLOW_OBSERVABILITY_METRICS_PORT"]))
        refires = emitter.metric("dueflow_emitter_refires_total") or 0.0
        # this process: the load producer (schedule_many) and the commit polling
        cpu: dict[str, float | None] = {"load_producer": time.process_time() - own0}
        cpu.update({k: cpu_s(pid) - cpu0[k] for k, pid in pids.items()})
        host = host_cpu_share(host0, _host_cpu())
        if not broker_pid:
            cpu["broker"] = None
        watcher_cpu = watcher.cpu_s()
        threads = cpu_delta(threads0, thread_cpu_s(broker_pid)) if broker_pid else None
        window_s = time.monotonic() - wall0
        rates = request_rates(requests0, requests.counts(), window_s) if requests else None
    runs = workers.runs()
    # The baseline: records of the very size the SDK writes, same run, same broker.
    sample = plan_records(settings, requests_burst(min(jobs, 1_000), 1_000))
    records = [sample[i % len(sample)] for i in range(jobs)]
    raw = raw_roundtrip(settings, records, workdir, rate=args.rate if steady(args) else None)
    record_bytes = statistics.mean(
        len(k) + len(v) + sum(len(a) + len(b) for a, b in h) for k, v, _p, h in sample
    )
    measured = Measured(
        jobs=jobs,
        runs=runs,
        started_s=started,
        done_s=done,
        schedule_s=scheduled_s,
        load_s=args.settle_s + args.duration if steady(args) else 0.0,
        # jobs scheduled after the settling time are due from 1 s after it
        settled_from_ms=int((started + args.settle_s + 1.0) * 1000) if steady(args) else None,
        raw_msgs_per_s=raw["msgs_per_s"],
        raw_seconds=raw["seconds"],
        raw_latencies=raw["latencies"],
        raw_cpu_s=raw["cpu_s"],
        cpu_s=cpu,
        watcher_cpu_s=watcher_cpu,
        broker_jit_cpu_s=threads.get("jit", 0.0) if threads is not None else None,
        # the emitter's dueflow_emitter_commit_seconds: bucket bounds, every commit
        emitter_commit_ms=commit_ms,
        broker_state=broker_state,
        broker_load_before_s=broker_load_before_s,
        duplicates_skipped=watcher.duplicates(),
        emitter_refires=refires,
        extra={
            "host_cpu": host,
            **({"broker_threads_cpu_us_per_job": per_job(threads, jobs)} if threads else {}),
            **(
                {
                    "broker_requests_per_s": rates,
                    "broker_requests_per_job": round(rates["total"] * window_s / jobs, 2),
                }
                if rates
                else {}
            ),
            **({"per_second": per_second(runs)} if args.per_second else {}),
            **({"visibility": visibility.result()} if visibility else {}),
        },
    )
    return measured, record_bytes


def emitter_commit_ms(port: int) -> dict[str, Any]:
    """Quantiles (upper bounds of the histogram's buckets, ms) and count of the
    emitter's commit durations, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith("dueflow_emitter_commit_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    out: dict[str, Any] = {"count": int(total)}
    for q in (0.5, 0.95, 0.99, 0.999):
        bound = next((le for le, c in buckets if c >= q * total), float("inf"))
        out[f"p{q * 100:g}"] = bound * 1000 if bound != float("inf") else None
    return out


def host_info(load_before: tuple[float, float, float]) -> dict[str, Any]:
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    p.add_argument("--mode", choices=["burst", "steady"], default="burst")
    p.add_argument("--jobs", type=int, default=100_000, help="burst: jobs to schedule")
    p.add_argument("--window-s", type=float, default=1.0, help="burst: jobs due within this")
    p.add_argument(
        "--ahead-s",
        type=float,
        default=0.0,
        help="burst: the first job is due this long after the first schedule, and the"
        " throughput and CPU count from then (every job written before it comes due);"
        " 0: from the first schedule, scheduling included",
    )
    p.add_argument("--rate", type=int, default=5_000, help="steady: jobs per second")
    p.add_argument("--duration", type=float, default=30.0, help="steady: seconds of load")
    p.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="steady: seconds of load before --duration; lateness_settled_ms leaves their "
        "jobs out (lateness_ms, the headline, does not)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="measure this many times (fresh topics each, same broker, one warm-up): "
        "each run's figures and the spread of the p99 over them",
    )
    p.add_argument("--processes", type=int, default=2, help="worker processes")
    p.add_argument("--partitions", type=int, default=6, help="exec topic partitions")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    p.add_argument(
        "--warmup-s",
        type=float,
        default=40.0,
        help="seconds of jobs through a pipeline of their own before the measured run "
        "(warms the broker's JIT; 0: none)",
    )
    p.add_argument("--warmup-rate", type=int, default=3_000, help="warm-up jobs per second")
    p.add_argument(
        "--emitter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an emitter setting, e.g. batch_min_ms=10 (repeatable)",
    )
    p.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a worker setting, e.g. commit_interval_ms=200 (repeatable)",
    )
    p.add_argument(
        "--broker",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a server property of the local broker (repeatable)",
    )
    p.add_argument(
        "--broker-jvm",
        action="append",
        default=[],
        metavar="OPTION",
        help="a JVM option of the local broker, e.g. --broker-jvm=-XX:TieredStopAtLevel=1",
    )
    p.add_argument(
        "--feed-every-ms",
        type=float,
        default=5.0,
        help="steady: the load generator calls schedule_many about this often (each "
        "call flushes; default 5)",
    )
    p.add_argument(
        "--broker-requests",
        action="store_true",
        help="the local broker's requests by API during each measured run, read over "
        "JMX (per_run[].broker_requests_per_s; about a second of CPU to attach)",
    )
    p.add_argument(
        "--per-second",
        action="store_true",
        help="each run's lateness per second of due time (p50/p99/max, and the p99 of "
        "stamp - due and start - stamp) in per_run[].per_second",
    )
    p.add_argument(
        "--visibility",
        action="store_true",
        help="split stamp -> read_committed into appended and committed, with two more "
        "readers of the exec topics (per_run[].visibility; they cost CPU)",
    )
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument(
        "--runs-out",
        type=Path,
        help="write every run here as JSON [key, due ms, start ms, fired ms], by start",
    )
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs: {args.runs}; give 1 or more")
    result = run(args)
    show(result, args.json, hide=("lateness_cdf_ms", "per_run"))
    if args.per_second:
        for n, run_ in enumerate(result["per_run"], 1):
            print(f"\nrun {n}: per second of due time (ms)")
            print("second   jobs   p50   p99   max  stamp-due p99  start-stamp p99")
            for row in run_["per_second"]:
                print(
                    f"{row['second']:>6} {row['jobs']:>6} {row['lateness_p50_ms']:>5.0f} "
                    f"{row['lateness_p99_ms']:>5.0f} {row['lateness_max_ms']:>5.0f} "
                    f"{row['fired_lateness_p99_ms'] or 0:>14.0f} "
                    f"{row['fired_to_start_p99_ms'] or 0:>16.0f}"
                )
    if args.visibility:
        for n, run_ in enumerate(result["per_run"], 1):
            v = run_["visibility"]
            spans = "; ".join(
                f"{span.removesuffix('_ms').replace('_', ' ')} p50 {v[span]['p50']:.0f} / "
                f"p99 {v[span]['p99']:.0f} ms"
                for span in SPANS
            )
            print(f"run {n}, {v['records']:,} records: {spans}")
    print()
    show(spread_rows(result["per_run"]), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
