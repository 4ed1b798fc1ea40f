"""Run emitters for tests and benchmarks: in a thread, or as a real process to kill -9."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from dueflow.broker.ports import free_port
from dueflow.config import EmitterSettings, Settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout
from dueflow.observability.metrics import Metrics
from dueflow.streams.emitter.process import EmitterProcess

# A wheel that turns in seconds: levels of 0.8 s, 4 s and 12 s per rotation.
SMALL_WHEEL: dict[str, Any] = {
    "levels": "8x100,8x500,6x2000",
    "near_partitions": 2,
    "near_window_ms": 300,
    "lookahead_ms": 100,
}
# How long before its due time the emitter writes a job (emitter.fire_ahead_ms):
# the worker starts it at its due time.
AHEAD_MS = EmitterSettings().fire_ahead_ms
FAST_EMITTER: dict[str, Any] = {
    "session_timeout_ms": 1_500,
    "heartbeat_interval_ms": 300,
    "batch_max_ms": 10,
    "housekeeping_interval_ms": 500,
}


def ensure_topics(settings: Settings) -> None:
    report = TopicAdmin(make_admin(settings), replication_factor=1).ensure(topic_layout(settings))
    assert report.ok, report.differences


@dataclass
class ThreadedEmitter:
    """An :class:`EmitterProcess` in a thread of this process (metrics readable)."""

    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    stop: threading.Event = field(default_factory=threading.Event)
    process: EmitterProcess | None = None
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> ThreadedEmitter:
        self.stop.clear()
        self.process = EmitterProcess(self.settings, self.metrics)

        def run() -> None:
            assert self.process is not None
            try:
                self.process.run(self.stop)
            except BaseException as exc:  # surfaced by join()
                self.error = exc

        self.thread = threading.Thread(target=run, name="emitter", daemon=True)
        self.thread.start()
        return self

    def wait_active(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.session is not None:
                return
            if self.error is not None:
                raise self.error
            time.sleep(0.02)
        raise AssertionError("the emitter did not become active")

    def join(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout_s)
            assert not self.thread.is_alive(), "the emitter did not stop"
        if self.error is not None:
            raise self.error

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value


@contextlib.contextmanager
def threaded_emitter(settings: Settings) -> Iterator[ThreadedEmitter]:
    em = ThreadedEmitter(settings).start()
    try:
        yield em
    finally:
        em.join()


def emitter_env(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes ``dueflow emitter`` use ``settings``' cluster, topics and wheel."""
    geo = settings.wheel
    em = settings.emitter
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(
        {
            "DUEFLOW_BOOTSTRAP": settings.bootstrap,
            "DUEFLOW_TOPIC_PREFIX": settings.topic_prefix,
            "DUEFLOW_QUEUES": ",".join(f"{q.name}:{q.partitions}" for q in settings.queues),
            "DUEFLOW_WHEEL_LEVELS": ",".join(f"{lv.slots}x{lv.width_ms}" for lv in geo.levels),
            "DUEFLOW_WHEEL_NEAR_PARTITIONS": str(geo.near_partitions),
            "DUEFLOW_WHEEL_NEAR_WINDOW_MS": str(geo.near_window_ms),
            "DUEFLOW_WHEEL_LOOKAHEAD_MS": str(geo.lookahead_ms),
            "DUEFLOW_WHEEL_SHARDS": str(geo.shards),
            "DUEFLOW_OBSERVABILITY_LOG_FORMAT": "json",
        }
    )
    # Every emitter setting (a benchmark's --emitter KEY=VALUE must reach the process).
    env.update({f"DUEFLOW_EMITTER_{f.name.upper()}": str(getattr(em, f.name)) for f in fields(em)})
    env.update(extra or {})
    return env


@dataclass
class EmitterSubprocess:
    """``python -m dueflow emitter`` as a child process, logging JSON lines to a file."""

    settings: Settings
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = field(default_factory=free_port)

    def start(self) -> EmitterSubprocess:
        self._log = self.log_path.open("wb")
        env = {"DUEFLOW_OBSERVABILITY_METRICS_PORT": str(self.metrics_port), **self.extra_env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dueflow", "emitter"],
            env=emitter_env(self.settings, env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                doc = orjson.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample of the process's metrics now (None: not there, or no answer)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
            ) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and dict(sample.labels) == labels:
                    return float(sample.value)
        return None

    def active_count(self) -> int:
        """How many times this process became the active emitter."""
        return sum(1 for e in self.events() if e.get("event") == "emitter is active")

    def shards_held(self) -> set[int]:
        """The shards this process drives now, by its log."""
        held: set[int] = set()
        for e in self.events():
            what = e.get("event")
            if what == "emitter is active":
                held.add(int(e.get("shard", 0)))
            elif what in ("emitter is standby", "emitter shard released"):
                held.discard(int(e.get("shard", 0)))
        return held

    def activated_ms(self, shard: int) -> int | None:
        """When this process last became the active emitter of ``shard`` (epoch ms, by
        its log's own time stamps; None: never)."""
        stamps = [
            e["ts"]
            for e in self.events()
            if e.get("event") == "emitter is active" and int(e.get("shard", 0)) == shard
        ]
        if not stamps:
            return None
        return round(datetime.fromisoformat(str(stamps[-1])).timestamp() * 1000)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        """Teardown: end the child by pid, whatever state it is in."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(Exception):
            self._log.close()


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> float:
    """Poll ``predicate`` until true; return the monotonic time it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@contextlib.contextmanager
def emitter_processes(
    settings: Settings, logs: Path, count: int
) -> Iterator[list[EmitterSubprocess]]:
    """``count`` emitter processes on ``settings``' topics (made here), stopped by pid
    at the end whatever happened; their logs are ``logs/emitter-<i>.log``."""
    ensure_topics(settings)
    procs = [EmitterSubprocess(settings, logs / f"emitter-{i}.log") for i in range(count)]
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.stop()
