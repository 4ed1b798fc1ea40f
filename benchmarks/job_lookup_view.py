"""The real status view as the job index: lookups through HTTP, its memory, its restarts.

    python -m benchmarks.job_lookup --view --pending 1000000 --finished 1000000 --json out.json

What ``Scheduler.status`` costs with ``pending`` jobs waiting (a ``scheduled``
outcome each, due up to ten years out) and ``finished`` ones (``scheduled`` then
``succeeded``), all folded by a ``dueflow status-view`` process, in one run:

- the fold: outcomes/s from the view's start to its last outcome folded, and
  the view's CPU time per outcome (less sensitive to a loaded host), with the
  SQLite store and, on the same outcomes, with ``status_store = "memory"``;
- lookups: ``Scheduler.status`` of random jobs (1% unknown ids) through HTTP,
  p50/p99 with 1 and ``--threads`` threads; every answer checked; beside
  them, the scan a client falls back to without the view (``status_scan_limit``
  200,000, a few calls);
- memory: the view's RSS (now and peak) after the fold, after the lookups,
  after a restart, after a rebuild; the job file's size per million jobs;
- a restart with the file (time to answering, changelog records read) and
  one without it (the file made again from the changelog).

The machine is shared: compare figures within a run. Uses ``DUEFLOW_BOOTSTRAP``
(or ``--bootstrap``), else starts a local broker; its topics are deleted at
the end, and the view processes are stopped by pid.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.broker.ports import free_port
from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.producers.scheduler import Scheduler
from dueflow.records.worker_codec import encode_outcome, outcome_header

YEAR_MS = 365 * 86_400_000
SCAN_CALLS = 3


def job_id(rng: random.Random, i: int) -> str:
    """A UUIDv7-shaped id (32 hex digits), as the SDK makes them."""
    return f"{i:012x}7{rng.getrandbits(12):03x}8{rng.getrandbits(60):015x}"


def load(settings: Settings, pending: int, finished: int, seed: int) -> tuple[list[str], int]:
    """Write the outcomes; return the job ids (pending first) and the record count."""
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    conf = {
        "bootstrap.servers": settings.bootstrap,
        "linger.ms": 50,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000,
        "enable.idempotence": True,
    }
    producer = Producer(conf)
    topic = names(settings).outcomes
    ids: list[str] = []
    records = 0

    def produce(jid: str, state: str, at: int, **extra: Any) -> None:
        value = encode_outcome(
            job_id=jid,
            queue="default",
            task="send_invoice",
            idempotency_key=jid,
            state=state,
            attempt=1 if state != "scheduled" else 0,
            at_ms=at,
            **extra,
        )
        while True:
            try:
                producer.produce(
                    topic, value, jid.encode(), headers=[(hdr.SCHEMA, outcome_header(state))]
                )
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(pending + finished):
        jid = job_id(rng, now + i)
        ids.append(jid)
        if i < pending:
            produce(jid, "scheduled", now, due_ms=now + 86_400_000 * (1 + i % 3650))
            records += 1
        else:
            produce(jid, "scheduled", now - 60_000, due_ms=now - 59_000)
            produce(jid, "succeeded", now - 58_000, duration_ms=12.5, worker="w-bench-1")
            records += 2
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} outcome records not delivered")
    return ids, records


# --------------------------------------------------------------------- the view


@dataclass
class ViewProc:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until /healthz answers (the view serves after its recovery)."""
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"status view exited:\n{self.tail()}")
            try:
                if self.get("/healthz")[0] == 200:
                    return time.monotonic() - t
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"status view not ready in {timeout_s}s:\n{self.tail()}")

    def metric(self, name: str) -> float:
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics: HTTP {status}")
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def memory(self) -> dict[str, float]:
        """RSS now and at its peak, MiB."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(rest.split()[0]) / 1024, 1)
        return {"rss_mib": out.get("VmRSS", 0.0), "peak_rss_mib": out.get("VmHWM", 0.0)}

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        return int(self.proc.returncode)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def start_view(
    settings: Settings, *, data_dir: Path, app_id: str, log: Path, env: dict[str, str]
) -> ViewProc:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "dueflow",
        "status-view",
        "--bootstrap",
        settings.bootstrap,
        "--topic-prefix",
        settings.topic_prefix,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--app-id",
        app_id,
        "--log-format",
        "json",
    ]
    full_env = {**os.environ, "DUEFLOW_OBSERVABILITY_CLUSTER_REFRESH_MS": "5000", **env}
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    return ViewProc(proc, port, log)


@dataclass
class Fold:
    seconds: float  # from the process start to the last outcome folded
    per_s: int
    cpu_us_per_outcome: float


def fold_all(view: ViewProc, total: int, *, timeout_s: float) -> Fold:
    """Wait until the view has folded ``total`` outcomes (started just before)."""
    t0 = time.monotonic()
    cpu0 = view.cpu_s()
    view.wait_ready(timeout_s)
    while True:
        if view.metric("dueflow_status_outcomes_total") >= total:
            break
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"not folded in {timeout_s}s:\n{view.tail()}")
        time.sleep(0.5)
    seconds = time.monotonic() - t0
    cpu = view.cpu_s() - cpu0
    return Fold(round(seconds, 1), round(total / seconds), round(cpu * 1e6 / total, 1))


# ---------------------------------------------------------------------- lookups


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def timed(
    sample: Sequence[str], threads: int, lookup: Callable[[str], bool]
) -> tuple[list[float], int, float]:
    """Latencies (ms), wrong answers and wall seconds of ``sample`` over ``threads``."""
    lat: list[float] = []
    wrong = 0
    lock = threading.Lock()

    def work(chunk: Sequence[str]) -> None:
        nonlocal wrong
        mine: list[float] = []
        bad = 0
        for jid in chunk:
            t = time.perf_counter()
            ok = lookup(jid)
            mine.append((time.perf_counter() - t) * 1000)
            bad += not ok
        with lock:
            lat.extend(mine)
            wrong += bad

    pool = [threading.Thread(target=work, args=(sample[i::threads],)) for i in range(threads)]
    t = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return lat, wrong, time.perf_counter() - t


def lookups(
    settings: Settings,
    view: ViewProc,
    ids: list[str],
    pending: int,
    *,
    count: int,
    threads: int,
    seed: int,
    out: dict[str, Any],
    tag: str,
) -> None:
    rng = random.Random(seed)
    wanted = {jid: ("scheduled" if i < pending else "succeeded") for i, jid in enumerate(ids)}
    sample = [rng.choice(ids) for _ in range(count)]
    sample += [job_id(rng, 0) for _ in range(max(1, count // 100))]  # unknown ids
    rng.shuffle(sample)
    asking = replace(settings, observability=replace(settings.observability, status_url=view.url))
    with Scheduler(asking) as s:

        def lookup(jid: str) -> bool:
            st = s.status(jid)
            if jid not in wanted:
                return st is None
            return st is not None and st.state == wanted[jid] and st.source == "status-view"

        for name, width in ((f"{tag}_1", 1), (f"{tag}_{threads}", threads)):
            lookup(sample[0])  # connect before timing
            lat, wrong, wall = timed(sample, width, lookup)
            out[f"{name}_p50_ms"] = pct(lat, 0.5)
            out[f"{name}_p99_ms"] = pct(lat, 0.99)
            out[f"{name}_max_ms"] = round(max(lat), 3)
            out[f"{name}_per_s"] = round(len(lat) / wall)
            out[f"{name}_wrong"] = wrong


def scan_baseline(settings: Settings, ids: list[str], seed: int) -> float:
    """Median ms of ``Scheduler.status`` without a view (the 200,000-record scan)."""
    rng = random.Random(seed)
    nobody = replace(
        settings,
        observability=replace(settings.observability, status_url=f"http://127.0.0.1:{free_port()}"),
    )
    times = []
    with Scheduler(nobody) as s:
        for _ in range(SCAN_CALLS):
            t = time.perf_counter()
            s.status(rng.choice(ids))
            times.append((time.perf_counter() - t) * 1000)
    return round(sorted(times)[len(times) // 2], 1)


# -------------------------------------------------------------------------- run


def run_view(
    bootstrap: str,
    *,
    pending: int,
    finished: int,
    lookup_count: int,
    threads: int,
    seed: int,
    memory_store: bool = True,
) -> dict[str, Any]:
    prefix = f"jv{uuid.uuid4().hex[:8]}"
    settings = load_settings(env={}, overrides={"bootstrap": bootstrap, "topic_prefix": prefix})
    admin = make_admin(settings)
    report = TopicAdmin(admin, replication_factor=1).ensure(topic_layout(settings))
    if not report.ok:
        raise RuntimeError(f"topics: {report.differences}")
    n = pending + finished
    per_million = 1_000_000 / n
    out: dict[str, Any] = {"mode": "view", "pending": pending, "finished": finished}
    tmp = tempfile.TemporaryDirectory(prefix="dueflow-jv-")
    root = Path(tmp.name)
    views: list[ViewProc] = []
    timeout = max(600.0, n / 200)  # a fold of 300 outcomes/s still finishes: a loaded host

    def start(app_id: str, log: str, **env: str) -> ViewProc:
        view = start_view(settings, data_dir=root / "data", app_id=app_id, log=root / log, env=env)
        views.append(view)
        return view

    try:
        t = time.perf_counter()
        ids, total = load(settings, pending, finished, seed)
        out["outcomes"] = total
        out["load_outcomes_per_s"] = round(total / (time.perf_counter() - t))

        app_id = f"{prefix}.status"
        job_file = root / "data" / f"{app_id}.jobs.sqlite"
        view = start(app_id, "sqlite.log")
        fold = fold_all(view, total, timeout_s=timeout)
        out["sqlite_fold_s"] = fold.seconds
        out["sqlite_fold_outcomes_per_s"] = fold.per_s
        out["sqlite_fold_cpu_us_per_outcome"] = fold.cpu_us_per_outcome
        time.sleep(2)  # the last acknowledgements reach the file
        for k, v in view.memory().items():
            out[f"sqlite_after_fold_{k}"] = v

        lookups(
            settings,
            view,
            ids,
            pending,
            count=lookup_count,
            threads=threads,
            seed=seed + 1,
            out=out,
            tag="status",
        )
        for k, v in view.memory().items():
            out[f"sqlite_after_lookups_{k}"] = v
        out["scan_200k_ms_median"] = scan_baseline(settings, ids, seed + 2)
        out["scan_over_status_p50"] = round(out["scan_200k_ms_median"] / out["status_1_p50_ms"])

        size = sum(
            Path(f"{job_file}{s}").stat().st_size
            for s in ("", "-wal")
            if Path(f"{job_file}{s}").exists()
        )
        out["job_file_mib_per_million"] = round(size / 2**20 * per_million, 1)
        if view.stop() != 0:
            raise RuntimeError(f"view did not stop cleanly:\n{view.tail()}")

        view = start(app_id, "restart.log")
        out["restart_with_file_s"] = round(view.wait_ready(timeout), 1)
        out["restart_with_file_changelog_read"] = int(
            view.metric("dueflow_status_changelog_restored_total")
        )
        for k, v in view.memory().items():
            out[f"restart_{k}"] = v
        view.stop()

        for s in ("", "-wal", "-shm"):
            Path(f"{job_file}{s}").unlink(missing_ok=True)
        view = start(app_id, "rebuild.log")
        out["rebuild_without_file_s"] = round(view.wait_ready(timeout), 1)
        out["rebuild_changelog_read"] = int(view.metric("dueflow_status_changelog_restored_total"))
        for k, v in view.memory().items():
            out[f"rebuild_{k}"] = v
        lookups(
            settings,
            view,
            ids,
            pending,
            count=max(100, lookup_count // 5),
            threads=threads,
            seed=seed + 3,
            out=out,
            tag="after_rebuild",
        )
        view.stop()

        if memory_store:
            view = start(
                f"{prefix}.status-mem", "memory.log", DUEFLOW_OBSERVABILITY_STATUS_STORE="memory"
            )
            fold = fold_all(view, total, timeout_s=timeout)
            out["memory_fold_s"] = fold.seconds
            out["memory_fold_outcomes_per_s"] = fold.per_s
            out["memory_fold_cpu_us_per_outcome"] = fold.cpu_us_per_outcome
            for k, v in view.memory().items():
                out[f"memory_after_fold_{k}"] = v
            view.stop()
            out["fold_sqlite_over_memory_cpu"] = round(
                out["sqlite_fold_cpu_us_per_outcome"] / out["memory_fold_cpu_us_per_outcome"], 2
            )
        out["host_load"] = round(os.getloadavg()[0], 1)
    finally:
        for started in views:
            started.stop()
        tmp.cleanup()
        doomed = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
        if doomed:
            for fut in admin.delete_topics(doomed).values():
                try:
                    fut.result(60)
                except Exception as exc:  # reported, not fatal: the figures are taken
                    print(f"could not delete a topic: {exc}", file=sys.stderr)
    return out
