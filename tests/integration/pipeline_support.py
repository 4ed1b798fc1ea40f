"""The whole pipeline as real processes: ``python -m dueflow emitter|worker|status-view``.

:class:`Pipeline` writes one TOML file (small wheel, short retry tiers, fast
commits) that every process and the test itself read, starts the processes
with their output in log files, and stops each one by pid at the end (the
children of ``worker --processes N`` too). :func:`scrape` reads a
``/metrics`` endpoint into a :class:`Samples` table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.pipeline_app"
QUEUE = "jobs"

# A wheel that turns in seconds (levels of 0.8 s, 4 s, 12 s), retry tiers of
# 200 and 500 ms, commits every 50 ms: a job's whole life takes about a second.
CONFIG = f"""
[wheel]
levels = "8x100,8x500,6x2000"
near_partitions = 2
near_window_ms = 300
lookahead_ms = 100

[emitter]
session_timeout_ms = 3000
heartbeat_interval_ms = 300
batch_max_ms = 10
housekeeping_interval_ms = 300

[[queues]]
name = "{QUEUE}"
partitions = 3
retry_tiers_ms = [200, 500]

[worker]
session_timeout_ms = 3000
transaction_timeout_ms = 5000
commit_interval_ms = 50
shutdown_grace_s = 5.0

[observability]
log_format = "json"
cluster_refresh_ms = 500
"""


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(0.1)


@dataclass
class Proc:
    """One started process and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def json_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.json_lines() if e.get("event") == name]

    def children(self) -> list[int]:
        """Pids of this process's children (``/proc``; empty once it has exited)."""
        out: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    out += [int(p) for p in (task / "children").read_text().split()]
        return out

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM by pid (children of a supervisor are told by it), then SIGKILL."""
        children = self.children()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(10)
        for pid in children:  # whatever the supervisor left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return self.popen.returncode


@dataclass
class Pipeline:
    """The processes of one test, sharing one settings file."""

    bootstrap: str
    prefix: str
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.config = self.tmp / "dueflow.toml"
        self.config.write_text(CONFIG)
        self.settings: Settings = load_settings(config_file=self.config, env=self._dueflow_env())
        report = TopicAdmin(make_admin(self.settings), replication_factor=1).ensure(
            topic_layout(self.settings)
        )
        assert report.ok, report.differences

    def _dueflow_env(self) -> dict[str, str]:
        return {"DUEFLOW_BOOTSTRAP": self.bootstrap, "DUEFLOW_TOPIC_PREFIX": self.prefix}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DUEFLOW_", "OTEL_", "PROMETHEUS_"))
        }
        env.update(self._dueflow_env())
        env["DUEFLOW_CONFIG"] = str(self.config)
        env["PYTHONPATH"] = str(ROOT)
        env.update(extra or {})
        return env

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Proc:
        """``python -m dueflow <argv>`` with its output in ``<tmp>/<name>.log``."""
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "dueflow", *argv],
                env=self.env(env),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def emitter(self, metrics_port: int, env: dict[str, str] | None = None) -> Proc:
        return self.start("emitter", "emitter", "--metrics-port", str(metrics_port), env=env)

    def worker(
        self, metrics_port: int, *argv: str, env: dict[str, str] | None = None, name: str = "worker"
    ) -> Proc:
        return self.start(
            name,
            "worker",
            "--app",
            APP,
            "--queues",
            QUEUE,
            "--metrics-port",
            str(metrics_port),
            *argv,
            env=env,
        )

    def logs(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-6000:]}" for p in self.procs)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


# --------------------------------------------------------------------- metrics


class Samples:
    """The samples of one scrape: ``value(name, **labels)``, ``labels_of(name)``."""

    def __init__(self, rows: Iterable[tuple[str, dict[str, str], float]]) -> None:
        self.rows = list(rows)

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the series with exactly these labels, or None."""
        for n, lbl, v in self.rows:
            if n == name and lbl == labels:
                return v
        return None

    def total(self, name: str, **labels: str) -> float:
        """Sum over the series of ``name`` whose labels include ``labels``."""
        return sum(
            v
            for n, lbl, v in self.rows
            if n == name and all(lbl.get(k) == x for k, x in labels.items())
        )

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [lbl for n, lbl, _v in self.rows if n == name]


def scrape(port: int) -> Samples | None:
    """Read ``http://127.0.0.1:<port>/metrics``; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    return Samples(
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )


def log_ms(event: Mapping[str, Any]) -> int:
    """A JSON log line's time (``2026-12-05T01:02:03.456Z``) in epoch ms; 0 if unreadable."""
    try:
        at = datetime.strptime(str(event.get("ts", "")), "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return 0
    return int(at.replace(tzinfo=UTC).timestamp() * 1000)
