"""How fast, how punctual, how small and how safe is the emitter?

    python -m benchmarks.emitter --scenario drain|steady|capacity|failover --json PATH

Runs the emitter as a real process (``python -m dueflow emitter``) against a
broker (``--bootstrap``, else a local one started for the run), with the
default wheel geometry, and measures from outside:

- ``drain``: a backlog of ``--timers`` overdue timers (spread over the near
  and level-0 partitions, as after an outage) is fired as fast as the
  emitter can: ``fires_per_s``. Baseline in the same run: raw confluent-kafka
  consume of the same records and transactional produce of them (headers
  appended) with offsets in the transaction, ``raw_per_s``; ``ratio``.
- ``steady``: timers written at ``--rate`` per second for ``--duration``
  seconds, due 0.1-15 s after they are written; a ``read_committed``
  consumer reads every fired job as it arrives. The headline,
  ``lateness_ms`` {p50,p95,p99,max}, is its receive time minus due over
  every job (its first sighting): what a consumer sees, after the commit.
  Baseline: the same consumer's latency for records a transactional
  producer commits back to back (the floor any transactional emitter has),
  ``baseline_lateness_ms``. Secondary, where the time goes:
  ``emit_stamp_lateness_ms``, the exec record's CreateTime (stamped by the
  emitter's producer inside a transaction not committed yet) minus due, and
  ``fire_minus_due_ms`` (the ``df-fired`` header). ``--runs N`` repeats
  baseline and run N times on fresh topics, same broker: headlines over
  every job of every run, ``per_run``, and the min / median / max of the
  runs' p99 (``lateness_p99_spread_ms``, ``baseline_p99_spread_ms``); each
  run records ``broker_state`` (``cold``/``warmed``/``external``, see
  ``benchmarks/spread.py``) as of its start (its own baseline comes
  first), the wall seconds of earlier runs and ``load_s``.
- ``capacity``: resident memory of the emitter process with 0, 100k and 1M
  timers pending in the wheel (due minutes to weeks ahead), while running and
  after a restart at 1M: ``pending``, ``emitter_rss_mb``.
- ``failover``: two emitter processes under load; the active one is killed
  with SIGKILL ``--kills`` times (and restarted as a standby); every job is
  checked exactly once on the exec topic: ``kills``, ``lost``,
  ``duplicates``, ``takeover_s`` {p50,max} (kill to the standby's first fire).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.arrivals import take_arrived
from benchmarks.output import show
from benchmarks.proc_cpu import cpu_s
from benchmarks.spread import broker_state, describe, percentiles, spread, spread_rows
from dueflow import headers as hdr
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port, free_port_pair
from dueflow.config import Settings, load_settings
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules.wheel import place_timer
from tests.support.emitters import EmitterSubprocess, ensure_topics, wait_until
from tests.support.timers import ExecLog, job_value, now_ms

SCENARIOS = ("drain", "steady", "capacity", "failover")


# ----------------------------------------------------------------------------- plumbing


@contextlib.contextmanager
def cluster(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="dueflow-bench-") as tmp:
        port = free_port_pair()
        broker = LocalBroker(port=port, state_dir=Path(tmp) / "broker", heap="1g")
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


EMITTER_OVERRIDES: dict[str, str] = {}  # --emitter KEY=VALUE, for every scenario
# The emitter alone writes each job when it is due: no worker starts it at its due
# time here, so what is measured is the write's own lateness (--emitter
# fire_ahead_ms=200 measures the default, ahead of the due time).
ALONE: dict[str, Any] = {"fire_ahead_ms": 0}


def bench_settings(bootstrap: str, **emitter: Any) -> Settings:
    emitter = {**ALONE, **EMITTER_OVERRIDES, **emitter}
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    s = load_settings(
        env={},
        overrides={
            "bootstrap": bootstrap,
            "topic_prefix": prefix,
            "queues": "default:6",
            "emitter": emitter,
        },
    )
    ensure_topics(s)
    return s


def metric(port: int, name: str) -> float:
    """Sum of every sample of ``name`` on the emitter's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def start_emitter(settings: Settings, workdir: Path, name: str, port: int) -> EmitterSubprocess:
    return EmitterSubprocess(
        settings,
        workdir / f"{name}.log",
        extra_env={"DUEFLOW_OBSERVABILITY_METRICS_PORT": str(port)},
    ).start()


def wait_active(em: EmitterSubprocess, timeout_s: float = 60.0) -> float:
    return wait_until(lambda: em.active_count() > 0, timeout_s, "the emitter to become active")


def produce_timers(
    settings: Settings,
    timers: Iterator[tuple[str, int, int]],
    *,
    queue: str = "default",
) -> int:
    """Write ``(job_id, due_ms, placed_at_ms)`` timers the way any client may."""
    producer = Producer(
        settings.client_config(
            **{
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 1_000_000,
                "enable.idempotence": True,
            }
        )
    )
    topic = names(settings).timers
    schema = codec.schema_header("job")
    qb = queue.encode()
    count = 0
    for job_id, due, at in timers:
        key = job_id.encode()
        part = place_timer(
            due_ms=due, now_ms=at, geometry=settings.wheel, spread=zlib.crc32(key)
        ).partition
        headers = [
            (hdr.DUE, str(due).encode()),
            (hdr.QUEUE, qb),
            (hdr.JOB_ID, key),
            (hdr.SCHEMA, schema),
        ]
        value = job_value(job_id, queue=queue, due_ms=due)
        while True:
            try:
                producer.produce(topic, value, key, part, headers=list(headers))
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 20_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return count


# ----------------------------------------------------------------------------- drain


def raw_drain(settings: Settings, count: int) -> float:
    """Baseline: consume the same timer records and produce them, as the emitter
    writes: in transactions with the offsets (``emitter.transactional``), or with
    an idempotent producer, the offsets committed every 20,000 records once
    those are acknowledged."""
    out_topic = names(settings).exec("default")
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"raw-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    )
    timers = names(settings).timers
    consumer.assign([TopicPartition(timers, p, 0) for p in range(settings.wheel.total_partitions)])
    transactional = settings.emitter.transactional
    producer = Producer(
        settings.client_config(
            **{
                **(
                    {"transactional.id": f"raw-{uuid.uuid4().hex}"}
                    if transactional
                    else {"enable.idempotence": True, "acks": "all"}
                ),
                "linger.ms": 2,
                "batch.num.messages": 10_000,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 500_000,
                "partitioner": "murmur2_random",
            }
        )
    )
    done = 0
    in_txn = 0
    started = None
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    last: dict[int, int] = {}
    while done < count:
        _, msgs = take_arrived(consumer, timeout_s=1.0, max_records=5_000)
        if started is None and msgs:
            started = time.monotonic()
        for m in msgs:
            if m.error() is not None:
                continue
            h: list[Any] = m.headers() or []  # type: ignore[assignment]
            h.append((hdr.FIRED, b"1"))
            h.append((hdr.SOURCE, b"raw"))
            while True:
                try:
                    producer.produce(out_topic, m.value(), m.key(), headers=h)
                    break
                except BufferError:
                    producer.poll(0.01)
            last[m.partition() or 0] = (m.offset() or 0) + 1
            done += 1
            in_txn += 1
        if in_txn >= 20_000:
            offsets = [TopicPartition(timers, p, o) for p, o in last.items()]
            if transactional:
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
                producer.commit_transaction()
                producer.begin_transaction()
            else:
                producer.flush(60)  # acknowledged, then committed
                consumer.commit(offsets=offsets, asynchronous=True)
            in_txn = 0
        producer.poll(0)
    if transactional:
        producer.commit_transaction()
    else:
        producer.flush(60)
    elapsed = time.monotonic() - (started or time.monotonic())
    consumer.close()
    return count / elapsed


class ExecEnds:
    """Samples the end offsets of the exec topic every 20 ms (a ListOffsets request:
    no cost to the emitter) with the emitter's CPU time, to tell when the last
    fire became visible: the first sample at the final end offsets."""

    def __init__(self, settings: Settings, pid: int) -> None:
        self._consumer = Consumer(
            settings.client_config(**{"group.id": f"ends-{uuid.uuid4().hex}"})
        )
        topic = names(settings).exec("default")
        self._tps = [TopicPartition(topic, p) for p in range(settings.queue("default").partitions)]
        self._pid = pid
        self._samples: list[tuple[float, int, float]] = []  # (monotonic, sum of ends, cpu s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ExecEnds:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            total = sum(
                self._consumer.get_watermark_offsets(tp, timeout=5, cached=False)[1]
                for tp in self._tps
            )
            self._samples.append((time.monotonic(), total, cpu_s(self._pid)))
            time.sleep(0.02)  # sampling interval of the measurement

    def __exit__(self, *_: object) -> None:
        time.sleep(0.3)  # a few samples past the end
        self._stop.set()
        self._thread.join()
        self._consumer.close()

    def settled(self) -> tuple[float, float]:
        """(monotonic time, emitter CPU seconds) of the first sample at the final ends."""
        final = self._samples[-1][1]
        at, _, cpu = next(x for x in self._samples if x[1] == final)
        return at, cpu


def scenario_drain(bootstrap: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    s = bench_settings(bootstrap, catchup_max_rate_per_s=1e9)
    count = args.timers
    base = now_ms() - 70_000
    delays = (200, 1_000, 1_800, 5_000, 20_000, 50_000)  # near and level-0 partitions

    def backlog() -> Iterator[tuple[str, int, int]]:
        for i in range(count):
            due = base + (i * 60_000) // count
            yield f"d{i}", due, due - delays[i % len(delays)]

    t0 = time.monotonic()
    produce_timers(s, backlog())
    print(f"backlog of {count} timers written in {time.monotonic() - t0:.1f}s")
    raw = raw_drain(s, count)
    print(f"raw consume+transactional produce: {raw:,.0f}/s")
    # The emitter counts its own fires (its metrics), apart from the baseline's copies.
    port = free_port()
    em = start_emitter(s, workdir, "drain", port)
    try:
        active_at = wait_active(em)
        cpu0 = cpu_s(em.pid)
        with ExecEnds(s, em.pid) as ends:
            # The metrics are read rarely: rendering them costs the emitter CPU.
            wait_until(
                lambda: metric(port, "dueflow_fires_total") >= count,
                600,
                "the backlog to drain",
                0.5,
            )
        done_at, cpu_at = ends.settled()
        cpu = cpu_at - cpu0
        rss = rss_mb(em.pid)
    finally:
        em.stop()
    elapsed = done_at - active_at
    fires_per_s = count / elapsed
    return {
        "scenario": "drain",
        "timers": count,
        "fires_per_s": round(fires_per_s),
        "raw_per_s": round(raw),
        "ratio": round(fires_per_s / raw, 3),
        "seconds": round(elapsed, 2),
        "emitter_cpu_s": round(cpu, 2),
        "emitter_rss_mb": round(rss, 1),
    }


# ----------------------------------------------------------------------------- steady


def _load(settings: Settings, rate: int, seconds: float, dues: dict[str, int]) -> None:
    """Write ``rate`` timers per second for ``seconds``, due 0.1-15 s after writing."""
    producer = Producer(settings.client_config(**{"linger.ms": 5, "enable.idempotence": True}))
    topic = names(settings).timers
    schema = codec.schema_header("job")
    start = time.monotonic()
    i = 0
    tick = 0.01
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            break
        target = int(elapsed * rate)
        while i < target:
            now = now_ms()
            due = now + 100 + (i * 7_919) % 14_900
            job_id = f"s{i}"
            key = job_id.encode()
            part = place_timer(
                due_ms=due, now_ms=now, geometry=settings.wheel, spread=zlib.crc32(key)
            ).partition
            headers: list[tuple[str, str | bytes | None]] = [
                (hdr.DUE, str(due).encode()),
                (hdr.QUEUE, b"default"),
                (hdr.SCHEMA, schema),
            ]
            producer.produce(
                topic, job_value(job_id, queue="default", due_ms=due), key, part, headers=headers
            )
            dues[job_id] = due
            i += 1
        producer.poll(0)
        time.sleep(tick)  # pacing of the load generator
    producer.flush(30)


def _checker_main(settings: Settings, out_path: str, stop: Any) -> None:
    """In its own process: read the exec topic as records arrive until told to stop
    and then quiet for 0.5 s (at most 10 s more), then write what was seen (job id,
    due, fired, seen, record timestamp) as JSON lines."""
    log = ExecLog(settings).start()
    try:
        last = time.monotonic()
        stopped_at: float | None = None
        while True:
            at, msgs = take_arrived(log.consumer, timeout_s=0.02)
            now = time.monotonic()
            if log.record(msgs, at):
                last = now
            if stopped_at is None and stop.is_set():
                stopped_at = now
            if stopped_at is not None and (
                now - max(last, stopped_at) >= 0.5 or now - stopped_at >= 10
            ):
                break
    finally:
        log.close()
    with open(out_path, "w") as fh:
        for r in log.records:
            fh.write(json.dumps([r.job_id, r.due_ms, r.fired_ms, r.seen_ms, r.timestamp_ms]) + "\n")


class Checker:
    """A read_committed consumer of the exec topic in a separate process (so the
    load generator does not slow it down), as a worker would be."""

    def __init__(self, settings: Settings, workdir: Path, name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.path = workdir / f"{name}.seen.jsonl"
        self.stop_event = ctx.Event()
        self.proc = ctx.Process(
            target=_checker_main, args=(settings, str(self.path), self.stop_event)
        )

    def __enter__(self) -> Checker:
        self.proc.start()
        time.sleep(2.0)  # let its consumer join and fetch (no records exist yet)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()

    def seen(self) -> list[tuple[str, int, int, int, int]]:
        """(job id, due, df-fired, seen by the checker, record timestamp) per record."""
        out = []
        for line in self.path.read_text().splitlines():
            job_id, due, fired, seen, stamp = json.loads(line)
            out.append((job_id, due, fired, seen, stamp))
        return out


def baseline_latency(
    settings: Settings, rate: int, seconds: float, batch_ms: int, workdir: Path
) -> list[float]:
    """Latency of records a transactional producer commits every ``batch_ms``:
    the floor of any transactional emitter on this machine."""
    topic = names(settings).exec("default")
    producer = Producer(
        settings.client_config(**{"transactional.id": f"base-{uuid.uuid4().hex}", "linger.ms": 2})
    )
    producer.init_transactions(30)
    with Checker(settings, workdir, "baseline") as checker:
        start = time.monotonic()
        i = 0
        opened = False
        opened_at = 0.0
        while time.monotonic() - start < seconds:
            target = int((time.monotonic() - start) * rate)
            while i < target:
                if not opened:
                    producer.begin_transaction()
                    opened, opened_at = True, time.monotonic()
                t = str(now_ms()).encode()
                producer.produce(
                    topic, b"x", f"b{i}".encode(), headers=[(hdr.DUE, t), (hdr.FIRED, t)]
                )
                i += 1
            if opened and time.monotonic() - opened_at >= batch_ms / 1000:
                producer.commit_transaction()
                opened = False
            time.sleep(0.001)  # pacing of the load generator
        if opened:
            producer.commit_transaction()
        time.sleep(1.0)  # the last records reach the checker
    return [float(seen - due) for _, due, _, seen, _ in first_sightings(checker.seen())]


Sighting = tuple[str, int, int, int, int]  # (job id, due, df-fired, seen, record timestamp)

EMIT_STAMP_MEASURE = (
    "exec record CreateTime - due: when the emitter's producer stamped the record, "
    "inside a transaction not committed yet; not what a consumer sees"
)
LATENESS_MEASURE = "receive time of a read_committed consumer - due, every job (its first sighting)"


def first_sightings(records: list[Sighting]) -> list[Sighting]:
    """Each job's first sighting (by receive time)."""
    seen: set[str] = set()
    out = []
    for r in sorted(records, key=lambda r: r[3]):
        if r[0] not in seen:
            seen.add(r[0])
            out.append(r)
    return out


@dataclass(frozen=True)
class SteadyRun:
    """What one steady run recorded."""

    timers: int
    written_s: float
    records: list[Sighting]  # every record the checker saw, duplicates too
    baseline: list[float]  # the baseline's seen - due, every record
    emitter_cpu_s: float
    transactions: int
    histogram: dict[str, float]
    load_s: float
    broker_state: str
    broker_load_before_s: float | None


def steady_run_figures(r: SteadyRun) -> dict[str, Any]:
    """One run's figures (an entry of ``per_run``)."""
    first = first_sightings(r.records)
    return {
        "timers": r.timers,
        "rate_per_s": round(r.timers / r.written_s) if r.written_s else None,
        "fired": len(first),
        "lost": r.timers - len(first),
        "duplicates": len(r.records) - len(first),
        "early": sum(
            1 for _, due, fired, seen, stamp in r.records if min(seen, fired, stamp) < due
        ),
        "lateness_ms": percentiles([float(seen - due) for _, due, _, seen, _ in first]),
        "emit_stamp_lateness_ms": percentiles([float(st - due) for _, due, _, _, st in first]),
        "fire_minus_due_ms": percentiles([float(f - due) for _, due, f, _, _ in first]),
        "baseline_lateness_ms": percentiles(r.baseline),
        "transactions": r.transactions,
        "timers_per_transaction": round(r.timers / max(1, r.transactions), 1),
        "emitter_cpu_share": round(r.emitter_cpu_s / (r.written_s + 15.0), 3),
        "emitter_histogram_share_le": r.histogram,
        "load_s": r.load_s,
        "broker_state": r.broker_state,
        "broker_load_before_s": r.broker_load_before_s,
    }


def combine_steady(runs: list[SteadyRun]) -> dict[str, Any]:
    """Figures over every job of every run (the headlines), the spread of the runs'
    p99 and ``per_run``."""
    if not runs:
        raise ValueError("combine_steady: no runs")
    per_run = [steady_run_figures(r) for r in runs]
    first = [x for r in runs for x in first_sightings(r.records)]
    timers = sum(r.timers for r in runs)
    written = sum(r.written_s for r in runs)
    transactions = sum(r.transactions for r in runs)
    return {
        "scenario": "steady",
        "runs": len(runs),
        "rate_per_s": round(timers / written) if written else None,
        "timers": timers,
        "fired": len(first),
        "lost": timers - len(first),
        "duplicates": sum(p["duplicates"] for p in per_run),
        "early": sum(p["early"] for p in per_run),
        "lateness_ms": percentiles([float(seen - due) for _, due, _, seen, _ in first]),
        "lateness_measure": LATENESS_MEASURE,
        "lateness_p99_spread_ms": spread([p["lateness_ms"] for p in per_run]),
        "baseline_lateness_ms": percentiles([x for r in runs for x in r.baseline]),
        "baseline_p99_spread_ms": spread([p["baseline_lateness_ms"] for p in per_run]),
        "baseline": "transactional producer committing back to back, same consumer: seen - due",
        # secondary: where the time goes, not what a job sees
        "emit_stamp_lateness_ms": percentiles([float(st - due) for _, due, _, _, st in first]),
        "emit_stamp_measure": EMIT_STAMP_MEASURE,
        "fire_minus_due_ms": percentiles([float(f - due) for _, due, f, _, _ in first]),
        "transactions": transactions,
        "timers_per_transaction": round(timers / max(1, transactions), 1),
        "emitter_cpu_share": round(
            sum(r.emitter_cpu_s for r in runs) / (written + 15.0 * len(runs)), 3
        ),
        "per_run": per_run,
    }


def steady_run(
    bootstrap: str,
    args: argparse.Namespace,
    workdir: Path,
    *,
    broker_state: str,
    broker_load_before_s: float | None,
) -> SteadyRun:
    """The baseline, then the emitter, each on topics of its own."""
    s = bench_settings(bootstrap)
    # The emitter commits as soon as every due timer fired: the baseline commits
    # back to back (batch 0 ms), the floor of any transactional emitter here.
    base = baseline_latency(s, args.rate, min(args.duration, 15.0), 0, workdir)
    s = bench_settings(bootstrap)
    port = free_port()
    em = start_emitter(s, workdir, "steady", port)
    dues: dict[str, int] = {}
    try:
        wait_active(em)
        with Checker(s, workdir, "steady") as checker:
            cpu0 = cpu_s(em.pid)
            t0 = time.monotonic()
            _load(s, args.rate, args.duration, dues)
            written = time.monotonic() - t0
            wait_until(
                lambda: metric(port, "dueflow_fires_total") >= len(dues),
                120,
                "every timer to fire",
                0.25,
            )
            cpu = cpu_s(em.pid) - cpu0
            hist = _histogram(port, "dueflow_fire_lateness_seconds")
            commits = metric(port, "dueflow_emitter_transactions_total")
    finally:
        em.stop()
    return SteadyRun(
        timers=len(dues),
        written_s=written,
        records=checker.seen(),
        baseline=base,
        emitter_cpu_s=cpu,
        transactions=int(commits),
        histogram=hist,
        load_s=args.duration,
        broker_state=broker_state,
        broker_load_before_s=broker_load_before_s,
    )


def scenario_steady(bootstrap: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    started_here = not args.bootstrap
    load_before = 0.0  # seconds of load this broker carried in this invocation
    runs: list[SteadyRun] = []
    for i in range(args.runs):
        t0 = time.monotonic()
        run_dir = workdir / f"run-{i + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        r = steady_run(
            bootstrap,
            args,
            run_dir,
            # the run's own baseline loads the broker before the emitter's part
            broker_state=broker_state(started_here=started_here, load_before_s=load_before),
            broker_load_before_s=round(load_before, 1) if started_here else None,
        )
        runs.append(r)
        load_before += time.monotonic() - t0
        late = steady_run_figures(r)["lateness_ms"]
        print(f"run {i + 1} of {args.runs}: seen - due {describe(late)}", flush=True)
    emitter = load_settings(env={}, overrides={"emitter": {**ALONE, **EMITTER_OVERRIDES}}).emitter
    return {
        **combine_steady(runs),
        "batch_max_ms": emitter.batch_max_ms,
        "producers": emitter.producers,
        "duration_s": args.duration,
        "broker_started_for_run": started_here,
    }


def _histogram(port: int, name: str) -> dict[str, float]:
    """Share of observations at or below each bucket bound (cumulative), per le."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    buckets: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    total = buckets.get("+Inf", 0.0) or 1.0
    return {
        le: round(v / total, 4)
        for le, v in buckets.items()
        if le in ("0.01", "0.02", "0.05", "0.1")
    }


# ----------------------------------------------------------------------------- capacity


def _far_timers(prefix: str, count: int) -> Iterator[tuple[str, int, int]]:
    now = now_ms()
    for i in range(count):
        # 2 minutes to 30 days ahead: levels 1, 2 and 3 of the default wheel.
        delay = 120_000 + (i * 2_654_435_761) % (30 * 86_400_000)
        yield f"{prefix}{i}", now + delay, now


def _settled_rss(pid: int, seconds: float) -> float:
    """RSS after ``seconds`` of running (the largest sample of the last second)."""
    end = time.monotonic() + seconds
    samples: list[float] = []
    while time.monotonic() < end:
        samples.append(rss_mb(pid))
        time.sleep(0.2)  # sampling interval of a measurement, not synchronization
    return max(samples[-5:])


def scenario_capacity(bootstrap: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    s = bench_settings(bootstrap, housekeeping_interval_ms=1_000)
    port = free_port()
    em = start_emitter(s, workdir, "capacity", port)
    points: list[dict[str, Any]] = []
    try:
        wait_active(em)
        points.append({"pending": 0, "emitter_rss_mb": round(_settled_rss(em.pid, 8), 1)})
        written = 0
        for target in (100_000, 1_000_000):
            written += produce_timers(s, _far_timers(f"c{written}-", target - written))
            wait_until(
                lambda t=target: metric(port, "dueflow_timers_pending") >= t,
                120,
                "pending timers to show",
                0.5,
            )
            pending = int(metric(port, "dueflow_timers_pending"))
            points.append(
                {"pending": pending, "emitter_rss_mb": round(_settled_rss(em.pid, 10), 1)}
            )
    finally:
        em.stop()
    # A fresh start with 1M pending: the catch-up read must not load them either.
    port2 = free_port()
    em2 = start_emitter(s, workdir, "capacity-restart", port2)
    try:
        wait_active(em2)
        restart_rss = _settled_rss(em2.pid, 12)
    finally:
        em2.stop()
    rss_100k, rss_1m = points[1]["emitter_rss_mb"], points[2]["emitter_rss_mb"]
    return {
        "scenario": "capacity",
        "pending": [p["pending"] for p in points],
        "emitter_rss_mb": [p["emitter_rss_mb"] for p in points],
        "rss_1m_over_100k": round(rss_1m / rss_100k, 3),
        "restart_at_1m_rss_mb": round(restart_rss, 1),
        "baseline": "pending=0 (the same process before any timer)",
    }


# ----------------------------------------------------------------------------- failover


def scenario_failover(bootstrap: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    s = bench_settings(
        bootstrap,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=max(100, args.session_timeout_ms // 10),
    )
    procs = [start_emitter(s, workdir, f"fo-{i}", free_port()) for i in range(2)]
    log = ExecLog(s).start()
    stop = threading.Event()
    dues: dict[str, int] = {}
    takeovers: list[float] = []
    lease_takeovers: list[float] = []
    phases: list[dict[str, float]] = []

    def read() -> None:
        while not stop.is_set():
            at, msgs = take_arrived(log.consumer, timeout_s=0.02)
            log.record(msgs, at)

    reader = threading.Thread(target=read, daemon=True)
    try:
        wait_until(lambda: any(p.active_count() for p in procs), 60, "an active emitter")
        active = next(p for p in procs if p.active_count())
        standby = next(p for p in procs if p is not active)
        reader.start()
        loader = threading.Thread(
            target=_load, args=(s, args.rate, args.kills * 9.0 + 6.0, dues), daemon=True
        )
        loader.start()
        time.sleep(3.0)  # let the load reach a steady state before the first kill
        for k in range(args.kills):
            before = standby.active_count()
            killed_wall = now_ms()
            killed = time.monotonic()
            active.kill()
            took = wait_until(_became_active(standby, before), 60, "the takeover")
            first = wait_until(_fired_after(log, killed_wall + 50), 60, "fires again", 0.01)
            lease_takeovers.append(took - killed)
            takeovers.append(first - killed)
            phase = _phases(standby, killed_wall)
            phases.append(phase)
            print(f"kill {k + 1}: firing again {first - killed:.2f}s; phases (s) {phase}")
            active = standby
            standby = start_emitter(s, workdir, f"fo-{k + 2}", free_port())
            procs.append(standby)
            time.sleep(4.0)  # the new standby joins; the load goes on between kills
        loader.join()
        wait_until(lambda: len({r.job_id for r in log.records}) >= len(dues), 120, "all fires")
        time.sleep(2.0)  # a quiet period, so late duplicates would be seen
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        for p in procs:
            p.stop()
        log.close()
    counts = Counter(r.job_id for r in log.records)
    return {
        "scenario": "failover",
        "kills": len(takeovers),
        "timers": len(dues),
        "lost": len(set(dues) - set(counts)),
        "duplicates": sum(c - 1 for c in counts.values()),
        "early": sum(1 for r in log.records if r.fired_ms < r.due_ms or r.seen_ms < r.due_ms),
        "takeover_s": {
            "p50": round(statistics.median(takeovers), 2),
            "max": round(max(takeovers), 2),
        },
        "lease_takeover_s": {
            "p50": round(statistics.median(lease_takeovers), 2),
            "max": round(max(lease_takeovers), 2),
        },
        # From the new active emitter's log, seconds after the kill: lease assigned,
        # older emitters fenced, reading, first commit (p50, max).
        "phases_s": {
            key: {
                "p50": round(statistics.median(ph[key] for ph in phases), 2),
                "max": round(max(ph[key] for ph in phases), 2),
            }
            for key in (
                "lease",
                "fenced",
                "reading",
                "first_commit",
                "fence_step",
                "offsets_step",
                "cron_step",
                "start_step",
            )
            if all(key in ph for ph in phases)
        },
        "session_timeout_s": args.session_timeout_ms / 1000,
    }


_PHASE_EVENTS = {
    "emitter lease acquired": "lease",
    "emitter active": "fenced",
    "emitter reading": "reading",
    "emitter first commit": "first_commit",
}


def _phases(p: EmitterSubprocess, killed_wall_ms: int) -> dict[str, float]:
    """Seconds from the kill to each step of the takeover, from ``p``'s log (its last
    active period); "fenced" is when fencing and the offset reads were done."""
    wait_until(
        lambda: any(e.get("event") == "emitter first commit" for e in p.events()), 30, "a commit"
    )
    out: dict[str, float] = {}
    for e in p.events():
        key = _PHASE_EVENTS.get(str(e.get("event")))
        if key is None:
            continue
        at = datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp() * 1000
        if at >= killed_wall_ms:
            out.setdefault(key, round((at - killed_wall_ms) / 1000, 3))
            if key == "fenced":  # how starting took that long, step by step
                for step in ("fence_ms", "offsets_ms", "cron_ms", "start_ms"):
                    if step in e:
                        out.setdefault(step[:-3] + "_step", round(float(e[step]) / 1000, 3))
    return out


def _became_active(p: EmitterSubprocess, before: int) -> Callable[[], bool]:
    return lambda: p.active_count() > before


def _fired_after(log: ExecLog, wall_ms: int) -> Callable[[], bool]:
    return lambda: any(r.fired_ms > wall_ms for r in log.records[-2000:])


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    parser.add_argument("--timers", type=int, default=500_000, help="drain: backlog size")
    parser.add_argument("--rate", type=int, default=5_000, help="steady/failover: timers/s")
    parser.add_argument("--duration", type=float, default=30.0, help="steady: seconds of load")
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="steady: measure this many times (fresh topics each, same broker): each "
        "run's figures and the spread of the p99 over them",
    )
    parser.add_argument("--kills", type=int, default=10, help="failover: kill -9 count")
    parser.add_argument("--session-timeout-ms", type=int, default=3_000, help="failover")
    parser.add_argument("--logs", metavar="DIR", help="keep the emitters' logs here")
    parser.add_argument(
        "--emitter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an emitter setting, e.g. batch_max_ms=5 (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs: {args.runs}; give 1 or more")
    for item in args.emitter:
        key, _, value = item.partition("=")
        EMITTER_OVERRIDES[key.strip()] = value.strip()
    if args.scenario == "failover" and args.rate == 5_000:
        args.rate = 1_000
    run = {
        "drain": scenario_drain,
        "steady": scenario_steady,
        "capacity": scenario_capacity,
        "failover": scenario_failover,
    }[args.scenario]
    with tempfile.TemporaryDirectory(prefix="dueflow-bench-") as tmp, cluster(args.bootstrap) as b:
        workdir = Path(args.logs) if args.logs else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(b, args, workdir)
    show(result, args.json, hide=("per_run",))
    if "per_run" in result:
        print()
        show(spread_rows(result["per_run"], count="timers"), None)


if __name__ == "__main__":
    main()
