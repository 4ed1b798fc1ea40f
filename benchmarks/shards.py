"""Do emitter shards scale the drain, and does one shard's failover spare the others?

    python -m benchmarks.shards [--configs 1x1,2x2,4x4] [--timers 200000] [--json PATH]

Runs emitters as real processes (``python -m dueflow emitter``) against a
broker (``--bootstrap``, else a local one started for the run), default wheel
geometry, each configuration ``SxP`` (``wheel.shards`` = S, P emitter
processes standing in for machines) on topics of its own:

- ``drain``: the P processes start on empty topics and the benchmark waits
  until the S shards are spread over them (cooperative-sticky: S/P each).
  Then ``--timers`` timers, already due and spread by key over the shards
  (``TimerPlacer``), are written in one transaction: its commit makes the
  whole backlog visible at once, so no process drains another's shard before
  the assignment settles. A ``read_committed`` consumer of the exec topic
  counts the fires per shard (``shard_for(crc32(key))``). ``fires_per_s`` is
  the count over first to last fire seen, per shard and in all;
  ``commit_to_last_s`` the time from the backlog's commit to the last fire,
  ``drain_per_s`` the count over it (what a consumer waits for: a stalled
  first fire shows here, ``first_fire_after_commit_s``, not in
  ``fires_per_s``). ``emitter_errors``: error events the emitters logged
  meanwhile, by kind.
  CPU from ``/proc/<pid>/stat`` (utime + stime) between the commit and the
  last fire: every emitter process, and the broker's when this run started
  it, as µs of CPU per fire. The broker's figure includes serving the
  counting consumer.
- ``baseline`` (same run, same broker, a one-shard topic): raw
  confluent-kafka consume of the same backlog and produce of it, the way the
  emitter writes (``benchmarks.emitter.raw_drain``: an idempotent producer and
  offsets committed once acknowledged; with ``--emitter transactional=true``
  in transactions with the offsets):
  records/s and µs of CPU per record (this process, the broker). Every
  configuration's ``ratio`` is its fires/s over the baseline's. A broker
  started here is first warmed up by the same work on a quarter of the
  backlog (``warm_up_s``), so the first measurement does not pay its JIT.
- ``failover``: S=2, P=2, timers due 0.5-2 s after they are written at
  ``--rate``/s for ``--load-s`` s; ``--kill-after-s`` s in, the owner of
  shard 1 is killed with SIGKILL. Shard 0's fire lateness (``df-fired`` -
  ``df-due``) p50/p95/p99/max for timers due before the kill, during the
  outage (kill to takeover) and after; ``takeover_s``: kill to the
  survivor's ``emitter is active`` for shard 1 (its log's timestamp);
  ``lost`` over every timer (must be 0); ``copies``: timers fired twice, the
  dead owner's fires after its last commit fired again by the survivor
  (workers skip them; at most the survivor's ``dueflow_emitter_refires_total``,
  ``refires``; 0 in transactions). Also shard 0's seen - due during the
  outage: what a ``read_committed`` consumer saw.

``--emitter KEY=VALUE`` (repeatable) sets an emitter setting for every
configuration, e.g. ``transactional=true`` to measure firing in transactions
on the same machine.

The machine this was written on has two cores shared by the broker, every
emitter and the counting consumer: more processes do not make more cores, so
``emitter_us_per_fire`` (CPU per fire, all processes) is the figure that
shows how the work scales; fires/s shows what this host delivers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.arrivals import take_arrived
from benchmarks.emitter import raw_drain
from benchmarks.output import show
from benchmarks.proc_cpu import cpu_s
from benchmarks.spread import describe, percentiles
from dueflow import headers as hdr
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.config import Settings, load_settings
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.records.timer_record import TimerPlacer
from dueflow.rules.wheel import MAX_SHARDS, shard_for
from tests.support.emitters import EmitterSubprocess, ensure_topics, wait_until
from tests.support.timers import ExecLog, Fired, job_value, now_ms

DEFAULT_CONFIGS = "1x1,2x2,4x4"
QUEUE = "default"


class Config(NamedTuple):
    """``shards`` wheels driven by ``processes`` emitter processes."""

    shards: int
    processes: int

    @property
    def name(self) -> str:
        return f"{self.shards}x{self.processes}"


# ----------------------------------------------------------------------------- pure


def parse_configs(text: str) -> tuple[Config, ...]:
    """``"1x1,2x2,4x2"`` -> configurations (shards x processes)."""
    out: list[Config] = []
    for item in text.split(","):
        shards, sep, processes = item.strip().lower().partition("x")
        if not sep or not shards.isdigit() or not processes.isdigit():
            raise ValueError(f"--configs: {item.strip()!r}; give SHARDSxPROCESSES, e.g. 2x2")
        cfg = Config(int(shards), int(processes))
        if not 1 <= cfg.shards <= MAX_SHARDS or cfg.processes < 1:
            raise ValueError(
                f"--configs: {item.strip()!r}; shards 1 to {MAX_SHARDS}, processes 1 or more"
            )
        out.append(cfg)
    return tuple(out)


def fair_split(shards: int, processes: int) -> list[int]:
    """How many shards each process holds once the assignment is balanced, largest first."""
    each, extra = divmod(shards, processes)
    return [each + 1] * extra + [each] * (processes - extra)


def is_spread(held: Sequence[set[int]], shards: int) -> bool:
    """Every shard held by exactly one process, as evenly as :func:`fair_split`."""
    every = [s for h in held for s in h]
    return sorted(every) == list(range(shards)) and sorted(
        (len(h) for h in held), reverse=True
    ) == fair_split(shards, len(held))


def per_s(count: int, first: float | None, last: float | None) -> float | None:
    """``count`` over ``first`` to ``last`` (seconds); None when the span is empty."""
    if first is None or last is None or last <= first:
        return None
    return count / (last - first)


def us_per(cpu_seconds: float | None, count: int) -> float | None:
    """µs of CPU per item, 0.1 µs; None without a CPU figure or items."""
    if cpu_seconds is None or count <= 0:
        return None
    return round(cpu_seconds * 1e6 / count, 1)


def split_by_outage(
    fires: Sequence[tuple[int, int]], *, killed_ms: int, taken_ms: int
) -> dict[str, list[int]]:
    """``(due_ms, lateness_ms)`` pairs by when they were due: before the kill, during the
    outage (kill to takeover) and after it."""
    out: dict[str, list[int]] = {"before": [], "during": [], "after": []}
    for due, late in fires:
        key = "before" if due < killed_ms else "during" if due <= taken_ms else "after"
        out[key].append(late)
    return out


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def table_rows(result: Mapping[str, Any]) -> dict[str, str]:
    """The printed summary: the baseline, one row per configuration, the failover."""
    base = result["baseline"]
    rows = {
        "baseline (raw)": f"{_num(base['records_per_s'])}/s; "
        f"µs CPU/record client {_num(base['client_us_per_record'], '.1f')}, "
        f"broker {_num(base['broker_us_per_record'], '.1f')}",
    }
    for d in result["drain"]:
        shards = " ".join(_num(s["fires_per_s"]) for s in d["per_shard"])
        rows[f"drain {d['config']}"] = (
            f"{_num(d['fires_per_s'])}/s first-last (x{_num(d['ratio'], '.2f')} raw; "
            f"shards {shards}); {_num(d['drain_per_s'])}/s commit-last "
            f"(x{_num(d['drain_ratio'], '.2f')}, "
            f"{d['commit_to_last_s']} s, first fire {d['first_fire_after_commit_s']} s); "
            f"µs CPU/fire emitters {_num(d['emitter_us_per_fire'], '.1f')}, "
            f"broker {_num(d['broker_us_per_fire'], '.1f')}"
        )
        if d.get("emitter_errors"):
            rows[f"drain {d['config']} errors"] = ", ".join(
                f"{n} x {what}" for what, n in sorted(d["emitter_errors"].items())
            )
    fo = result.get("failover")
    if fo:
        late = fo["shard0_fire_lateness_ms"]
        rows["failover takeover"] = (
            f"{fo['takeover_s']} s (kill -9 to shard 1 active on the survivor)"
        )
        rows["shard 0 fired-due before"] = describe(late["before"])
        rows["shard 0 fired-due outage"] = describe(late["during"])
        rows["shard 0 seen-due outage"] = describe(fo["shard0_seen_lateness_ms"]["during"])
        rows["shard 0 seen-due before"] = describe(fo["shard0_seen_lateness_ms"]["before"])
        rows["failover lost / copies (refires)"] = (
            f"{fo['lost']} / {fo['copies']} ({_num(fo['refires'])}) of {fo['timers']:,}"
        )
    return rows


# ----------------------------------------------------------------------------- plumbing


@contextlib.contextmanager
def cluster(bootstrap: str | None) -> Iterator[tuple[str, int | None]]:
    """``(bootstrap, broker pid)``: the pid only of a broker started here."""
    if bootstrap:
        yield bootstrap, None
        return
    with tempfile.TemporaryDirectory(prefix="dueflow-bench-") as tmp:
        broker = LocalBroker(port=free_port_pair(), state_dir=Path(tmp) / "broker", heap="1g")
        pid, _ = broker.start()
        try:
            yield broker.bootstrap, pid
        finally:
            broker.stop()


def shard_settings(bootstrap: str, shards: int, **emitter: Any) -> Settings:
    s = load_settings(
        env={},
        overrides={
            "bootstrap": bootstrap,
            "topic_prefix": f"shards{uuid.uuid4().hex[:8]}",
            "queues": f"{QUEUE}:6",
            "wheel": {"shards": shards},
            # Consumers, not workers, read the fires here: each is written when due.
            "emitter": {"fire_ahead_ms": 0, **emitter},
        },
    )
    ensure_topics(s)
    return s


def maybe_cpu(pid: int | None) -> float | None:
    return None if pid is None else cpu_s(pid)


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


_HEADERS = ((hdr.QUEUE, QUEUE.encode()), (hdr.KIND, hdr.KIND_JOB.encode()))
_SCHEMA = (hdr.SCHEMA, codec.schema_header("job"))


def _produce(
    producer: Producer, topic: str, placer: TimerPlacer, job_id: str, due: int, at: int
) -> None:
    """One timer, placed in its shard as of ``at``, the way any client writes it."""
    key = job_id.encode()
    part = placer.partition(due_ms=due, now_ms=at, spread=zlib.crc32(key))
    headers: list[tuple[str, str | bytes | None]] = [
        (hdr.DUE, str(due).encode()),
        *_HEADERS,
        (hdr.JOB_ID, key),
        _SCHEMA,
    ]
    value = job_value(job_id, queue=QUEUE, due_ms=due)
    while True:
        try:
            producer.produce(topic, value, key, part, headers=headers)
            return
        except BufferError:
            producer.poll(0.1)


def prefill(settings: Settings, count: int) -> float:
    """Write ``count`` overdue timers (due over the last minute, placed 0.2-50 s ahead
    of due: near and level-0 partitions of every shard) in one transaction; return the
    monotonic time of its commit, when they all became visible."""
    producer = Producer(
        settings.client_config(
            **{
                "transactional.id": f"prefill-{uuid.uuid4().hex}",
                "transaction.timeout.ms": 300_000,
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    topic = names(settings).timers
    placer = TimerPlacer(settings.wheel)
    base = now_ms() - 70_000
    delays = (200, 1_000, 1_800, 5_000, 20_000, 50_000)
    for i in range(count):
        due = base + (i * 60_000) // count
        _produce(producer, topic, placer, f"d{i}", due, due - delays[i % len(delays)])
        if i % 20_000 == 0:
            producer.poll(0)
    producer.flush(120)
    producer.commit_transaction(60)
    return time.monotonic()


class FireTally:
    """A read_committed consumer of the exec topic in a thread: fires per shard, with
    the monotonic times of each shard's first and last, and the keys seen twice."""

    def __init__(self, settings: Settings) -> None:
        self._shards = settings.wheel.shards
        self._consumer = Consumer(
            settings.client_config(
                **{
                    "group.id": f"tally-{uuid.uuid4().hex}",
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
        )
        topic = names(settings).exec(QUEUE)
        parts = settings.queue(QUEUE).partitions
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(parts)])
        self.counts = [0] * self._shards
        self.first: list[float | None] = [None] * self._shards
        self.last: list[float | None] = [None] * self._shards
        self.seen: set[bytes] = set()
        self.duplicates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FireTally:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            _, msgs = take_arrived(self._consumer, timeout_s=0.05)
            at = time.monotonic()
            for m in msgs:
                if m.error() is not None or hdr.is_command(m.headers()):
                    continue  # (a command to the partition's owner is no fire)
                key = m.key() or b""
                if key in self.seen:
                    self.duplicates += 1
                    continue
                self.seen.add(key)
                s = shard_for(zlib.crc32(key), self._shards)
                self.counts[s] += 1
                if self.first[s] is None:
                    self.first[s] = at
                self.last[s] = at

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def start_emitters(settings: Settings, workdir: Path, tag: str, n: int) -> list[EmitterSubprocess]:
    procs: list[EmitterSubprocess] = []
    for i in range(n):
        procs.append(EmitterSubprocess(settings, workdir / f"{tag}-{i}.log").start())
    return procs


def wait_spread(procs: Sequence[EmitterSubprocess], shards: int) -> None:
    wait_until(
        lambda: is_spread([p.shards_held() for p in procs], shards),
        120,
        f"{shards} shards spread over {len(procs)} emitters",
        0.2,
    )


def _wall_ms(e: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp() * 1000


def activations(p: EmitterSubprocess) -> list[tuple[int, float]]:
    """``(shard, wall ms)`` of each ``emitter is active`` in ``p``'s log."""
    return [
        (int(e.get("shard", 0)), _wall_ms(e))
        for e in p.events()
        if e.get("event") == "emitter is active"
    ]


def error_events(p: EmitterSubprocess, since_wall_ms: float) -> list[str]:
    """``event: error code`` of each error ``p`` logged from ``since_wall_ms`` on."""
    return [
        f"{e.get('event')}: {error_code(str(e.get('error', '')))}"
        for e in p.events()
        if e.get("level") == "error" and _wall_ms(e) >= since_wall_ms
    ]


def error_code(text: str) -> str:
    """The Kafka error code in a logged error (``code=NAME,``), else its first words."""
    if "code=" in text:
        return text.split("code=", 1)[1].split(",", 1)[0]
    return " ".join(text.split()[:6])


# ----------------------------------------------------------------------------- scenarios


def warm_up(bootstrap: str, count: int) -> float:
    """The baseline's work once, unmeasured: a broker started for the run compiles its
    request paths under its first load, which would count against whatever runs first."""
    t0 = time.monotonic()
    s = shard_settings(bootstrap, 1)
    prefill(s, count)
    raw_drain(s, count)
    return round(time.monotonic() - t0, 1)


def run_baseline(
    bootstrap: str, broker_pid: int | None, count: int, emitter: Mapping[str, Any]
) -> dict[str, Any]:
    s = shard_settings(bootstrap, 1, **emitter)
    prefill(s, count)
    cpu0, broker0 = time.process_time(), maybe_cpu(broker_pid)
    rate = raw_drain(s, count)
    client = time.process_time() - cpu0
    broker = _delta(maybe_cpu(broker_pid), broker0)
    what = (
        "raw confluent-kafka consume + transactional produce, offsets in the txn"
        if s.emitter.transactional
        else "raw confluent-kafka consume + idempotent produce, offsets committed once acked"
    )
    print(f"baseline: {what}: {rate:,.0f}/s", flush=True)
    return {
        "what": what,
        "records": count,
        "records_per_s": round(rate),
        "client_us_per_record": us_per(client, count),
        "broker_us_per_record": us_per(broker, count),
    }


def run_drain(
    bootstrap: str,
    broker_pid: int | None,
    cfg: Config,
    count: int,
    workdir: Path,
    emitter: Mapping[str, Any],
) -> dict[str, Any]:
    s = shard_settings(bootstrap, cfg.shards, **{"catchup_max_rate_per_s": 1e9, **emitter})
    procs: list[EmitterSubprocess] = []
    try:
        procs = start_emitters(s, workdir, f"drain-{cfg.name}", cfg.processes)
        wait_spread(procs, cfg.shards)
        held = [sorted(p.shards_held()) for p in procs]
        with FireTally(s) as tally:
            committed = prefill(s, count)
            committed_wall = now_ms()
            cpu0 = [cpu_s(p.pid) for p in procs]
            broker0 = maybe_cpu(broker_pid)
            wait_until(lambda: len(tally.seen) >= count, 300, "the backlog to drain", 0.05)
            cpu = [cpu_s(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
            broker = _delta(maybe_cpu(broker_pid), broker0)
            time.sleep(1.0)  # a quiet second, so late duplicates would be counted
        # a shard that changed hands after the backlog became visible
        moves = sum(1 for p in procs for _, at in activations(p) if at >= committed_wall)
        errors = Counter(e for p in procs for e in error_events(p, committed_wall))
        held_after = [sorted(p.shards_held()) for p in procs]
    finally:
        for p in procs:
            p.stop()
    firsts = [f for f in tally.first if f is not None]
    lasts = [f for f in tally.last if f is not None]
    total = per_s(count, min(firsts), max(lasts))
    row = {
        "config": cfg.name,
        "shards": cfg.shards,
        "processes": cfg.processes,
        "timers": count,
        "fires_per_s": None if total is None else round(total),
        "commit_to_last_s": round(max(lasts) - committed, 2),
        "drain_per_s": round(count / (max(lasts) - committed)),
        "first_fire_after_commit_s": round(min(firsts) - committed, 2),
        "per_shard": [
            {
                "shard": i,
                "fires": tally.counts[i],
                "fires_per_s": _round(per_s(tally.counts[i], tally.first[i], tally.last[i])),
                "first_fire_after_commit_s": _round(_delta(tally.first[i], committed), 2),
                "last_fire_after_commit_s": _round(_delta(tally.last[i], committed), 2),
            }
            for i in range(cfg.shards)
        ],
        "held": held,
        "shard_moves_during_drain": moves,
        "held_after": held_after,
        "emitter_cpu_s": [round(c, 2) for c in cpu],
        "emitter_us_per_fire": us_per(sum(cpu), count),
        "broker_cpu_s": _round(broker, 2),
        "broker_us_per_fire": us_per(broker, count),
        "duplicates": tally.duplicates,
        # error events in the emitters' logs once the backlog was visible, by kind
        "emitter_errors": dict(errors),
    }
    print(
        f"drain {cfg.name}: {row['fires_per_s']}/s, {row['emitter_us_per_fire']} µs "
        f"emitter CPU/fire, {row['broker_us_per_fire']} µs broker CPU/fire",
        flush=True,
    )
    return row


def _round(x: float | None, digits: int = 0) -> float | None:
    if x is None:
        return None
    return round(x) if digits == 0 else round(x, digits)


def _load(settings: Settings, rate: int, seconds: float, dues: dict[str, int]) -> None:
    """``rate`` timers a second for ``seconds``, due 0.5-2 s after they are written."""
    producer = Producer(settings.client_config(**{"linger.ms": 5, "enable.idempotence": True}))
    topic = names(settings).timers
    placer = TimerPlacer(settings.wheel)
    start = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - start) < seconds:
        while i < int(elapsed * rate):
            now = now_ms()
            due = now + 500 + (i * 7_919) % 1_500
            _produce(producer, topic, placer, f"f{i}", due, now)
            dues[f"f{i}"] = due
            i += 1
        producer.poll(0)
        time.sleep(0.01)  # pacing of the load generator
    producer.flush(30)


def run_failover(args: argparse.Namespace, bootstrap: str, workdir: Path) -> dict[str, Any]:
    s = shard_settings(
        bootstrap,
        2,
        **{
            "session_timeout_ms": args.session_timeout_ms,
            "heartbeat_interval_ms": max(100, args.session_timeout_ms // 10),
            **emitter_options(args),
        },
    )
    procs: list[EmitterSubprocess] = []
    log = ExecLog(s).start()
    stop = threading.Event()
    dues: dict[str, int] = {}

    def read() -> None:
        while not stop.is_set():
            at, msgs = take_arrived(log.consumer, timeout_s=0.02)
            log.record(msgs, at)

    reader = threading.Thread(target=read, daemon=True)
    try:
        procs = start_emitters(s, workdir, "failover", 2)
        wait_spread(procs, 2)
        victim = next(p for p in procs if p.shards_held() == {1})
        survivor = next(p for p in procs if p is not victim)
        reader.start()
        loader = threading.Thread(target=_load, args=(s, args.rate, args.load_s, dues), daemon=True)
        loader.start()
        time.sleep(args.kill_after_s)
        killed_ms = now_ms()
        victim.kill()
        wait_until(lambda: survivor.shards_held() == {0, 1}, 60, "shard 1 taken over", 0.02)
        taken_ms = round(max(at for shard, at in activations(survivor) if shard == 1))
        loader.join()
        wait_until(lambda: len({r.job_id for r in log.records}) >= len(dues), 120, "all fires")
        time.sleep(2.0)  # a quiet period, so late copies would be seen
        refires = survivor.metric("dueflow_emitter_refires_total")
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        for p in procs:
            p.stop()
        log.close()
    counts = Counter(r.job_id for r in log.records)
    firsts: dict[str, Fired] = {}
    for r in log.records:
        firsts.setdefault(r.job_id, r)
    by_shard: tuple[list[Fired], list[Fired]] = ([], [])
    for r in firsts.values():
        by_shard[shard_for(zlib.crc32(r.job_id.encode()), 2)].append(r)
    shard0, shard1 = by_shard
    fired0 = split_by_outage(
        [(r.due_ms, r.fired_ms - r.due_ms) for r in shard0], killed_ms=killed_ms, taken_ms=taken_ms
    )
    seen0 = split_by_outage(
        [(r.due_ms, r.seen_ms - r.due_ms) for r in shard0], killed_ms=killed_ms, taken_ms=taken_ms
    )
    fired1 = split_by_outage(
        [(r.due_ms, r.fired_ms - r.due_ms) for r in shard1], killed_ms=killed_ms, taken_ms=taken_ms
    )
    row = {
        "config": "2x2",
        "rate_per_s": args.rate,
        "load_s": args.load_s,
        "killed_after_s": args.kill_after_s,
        "session_timeout_s": args.session_timeout_ms / 1000,
        "timers": len(dues),
        "takeover_s": round((taken_ms - killed_ms) / 1000, 2),
        "lost": len(set(dues) - set(counts)),
        "copies": sum(c - 1 for c in counts.values()),
        "refires": refires,
        "transactional": s.emitter.transactional,
        "early": sum(1 for r in log.records if r.fired_ms < r.due_ms),
        "shard0_timers": {k: len(v) for k, v in fired0.items()},
        "shard0_fire_lateness_ms": {k: percentiles(v) for k, v in fired0.items()},
        "shard0_seen_lateness_ms": {k: percentiles(v) for k, v in seen0.items()},
        "shard1_fire_lateness_ms": {k: percentiles(v) for k, v in fired1.items()},
    }
    print(f"failover: takeover {row['takeover_s']} s, lost {row['lost']}", flush=True)
    return row


# ----------------------------------------------------------------------------- main


def emitter_options(args: argparse.Namespace) -> dict[str, str]:
    """``--emitter KEY=VALUE`` as a settings mapping."""
    return dict(item.partition("=")[::2] for item in args.emitter)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="SHARDSxPROCESSES,...")
    parser.add_argument("--timers", type=int, default=200_000, help="drain: backlog per run")
    parser.add_argument("--rate", type=int, default=2_000, help="failover: timers/s")
    parser.add_argument("--load-s", type=float, default=12.0, help="failover: seconds of load")
    parser.add_argument("--kill-after-s", type=float, default=4.0, help="failover")
    parser.add_argument("--session-timeout-ms", type=int, default=3_000, help="failover")
    parser.add_argument("--no-failover", action="store_true", help="only the drains")
    parser.add_argument("--json", metavar="PATH", default="benchmarks/results/shards.json")
    parser.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    parser.add_argument("--logs", metavar="DIR", help="keep the emitters' logs here")
    parser.add_argument(
        "--emitter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an emitter setting for every configuration, e.g. transactional=true (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        configs = parse_configs(args.configs)
    except ValueError as exc:
        parser.error(str(exc))
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="dueflow-bench-") as tmp,
        cluster(args.bootstrap) as (bootstrap, broker_pid),
    ):
        workdir = Path(args.logs) if args.logs else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {
            "timers": args.timers,
            "cores": os.cpu_count(),
            "broker_cpu_measured": broker_pid is not None,
            "warm_up_s": warm_up(bootstrap, max(1, args.timers // 4)),
            "emitter_settings": emitter_options(args),
            "baseline": run_baseline(bootstrap, broker_pid, args.timers, emitter_options(args)),
        }
        drains = [
            run_drain(bootstrap, broker_pid, c, args.timers, workdir, emitter_options(args))
            for c in configs
        ]
        base = result["baseline"]["records_per_s"]
        for d in drains:
            d["ratio"] = None if d["fires_per_s"] is None else round(d["fires_per_s"] / base, 3)
            d["drain_ratio"] = round(d["drain_per_s"] / base, 3)
        result["drain"] = drains
        if not args.no_failover:
            result["failover"] = run_failover(args, bootstrap, workdir)
    result["wall_s"] = round(time.monotonic() - started, 1)
    show(result, args.json, hide=("baseline", "drain", "failover"))
    print()
    show(table_rows(result), None)


if __name__ == "__main__":
    main()
