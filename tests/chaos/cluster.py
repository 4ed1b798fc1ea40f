"""The processes of one chaos run: its own broker, emitters and workers.

Everything here is started by this object and stopped by pid (process group)
in :meth:`ChaosCluster.stop_all`, also after a failure. The broker is a
:class:`~dueflow.broker.local.LocalBroker` on a free port in the run's
directory, so the suite may stop, kill and restart it with the same data.
Emitters and workers are real ``python -m dueflow ...`` processes, each with
its own ``client.id`` (``DUEFLOW_KAFKA_CLIENT_ID``), which is how the driver
tells which emitter holds the lease. A child may run with a skewed wall clock
(:mod:`tests.chaos.skew`) and may be stopped (SIGSTOP) and continued; so may
the broker. :meth:`ChaosCluster.stop_all` continues whatever is stopped first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.clients import make_admin
from dueflow.config import Settings, load_settings
from dueflow.errors import BrokerError
from dueflow.topic_admin import TopicAdmin
from dueflow.topics import names, topic_layout
from tests.chaos.skew import ClockSkewer

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "chaos"

CONFIG = """\
[[queues]]
name = "{queue}"
partitions = 6
retry_tiers_ms = [500, 2000]

[wheel]
# spans: level 0 2 s, level 1 8 s, level 2 40 s (later timers are placed again)
levels = "8x250,8x1000,8x5000"
near_partitions = 2
near_window_ms = 500
lookahead_ms = 100

[emitter]
session_timeout_ms = 3000
heartbeat_interval_ms = 500
housekeeping_interval_ms = 2000

[worker]
session_timeout_ms = 6000
transaction_timeout_ms = 10000
commit_interval_ms = 100
rebalance_grace_s = 3.0
shutdown_grace_s = 5.0
concurrency = 16

[observability]
log_format = "json"
"""


@dataclass
class Child:
    """One process started by the cluster."""

    role: str  # "emitter" or "worker"
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    ended_by_us: bool = False
    skew_ms: int = 0  # its wall clock runs this far ahead (negative: behind)
    stopped: bool = False  # SIGSTOP sent, no SIGCONT yet

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ChaosCluster:
    """Broker, emitters and workers of one run."""

    def __init__(self, root: Path, *, ledger: Path, prefix: str = "chaos") -> None:
        self.root = root
        self.ledger = ledger
        self.prefix = prefix
        self.config = root / "dueflow.toml"
        self.config.write_text(CONFIG.format(queue=QUEUE))
        self._use_port(free_port_pair())
        self.emitters: list[Child] = []
        self.workers: list[Child] = []
        self.every: list[Child] = []
        self._serial = 0
        self.skewer = ClockSkewer(root / "skew")
        self.broker_paused = False

    def _use_port(self, port: int) -> None:
        self.port = port
        self.broker = LocalBroker(port=port, state_dir=self.root / "broker", heap="768m")
        self.settings: Settings = load_settings(
            config_file=self.config,
            env={},
            overrides={"bootstrap": self.broker.bootstrap, "topic_prefix": self.prefix},
        )

    # ------------------------------------------------------------------ broker
    def start_broker(self) -> None:
        """The first start: on another free port when the chosen one was taken meanwhile
        (the machine is shared)."""
        for attempt in range(3):
            try:
                self.broker.start()
                return
            except BrokerError:
                if attempt == 2:
                    raise
                self._use_port(free_port_pair())

    def ensure_topics(self) -> None:
        report = TopicAdmin(make_admin(self.settings), replication_factor=1).ensure(
            topic_layout(self.settings)
        )
        assert report.ok, report.differences

    def restart_broker(self, *, kill: bool) -> float:
        """Stop (SIGTERM, or kill -9) and start the broker on the same data; return seconds
        it was unavailable."""
        began = time.monotonic()
        if kill:
            self.broker.kill()
        else:
            self.broker.stop()
        for attempt in range(3):
            try:
                self.broker.start(timeout_s=180)
                break
            except BrokerError:
                if attempt == 2:
                    raise
                time.sleep(2.0)
        return time.monotonic() - began

    # --------------------------------------------------------------- processes
    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
        env.update(
            {
                "DUEFLOW_CONFIG": str(self.config),
                "DUEFLOW_BOOTSTRAP": self.broker.bootstrap,
                "DUEFLOW_TOPIC_PREFIX": self.prefix,
                "DUEFLOW_CHAOS_LEDGER": str(self.ledger),
                "DUEFLOW_KAFKA_CLIENT_ID": name,
                "PYTHONPATH": str(ROOT),
            }
        )
        return env

    def _spawn(self, role: str, args: list[str], skew_ms: int = 0) -> Child:
        self._serial += 1
        name = f"{role}-{self._serial}"
        log_path = self.root / f"{name}.log"
        env = self.skewer.env(self.env(name), skew_ms)
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "dueflow", *args],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed as a whole
            )
        child = Child(role, name, popen, log_path, skew_ms=skew_ms)
        self.every.append(child)
        return child

    def start_emitter(self, *, skew_ms: int = 0) -> Child:
        child = self._spawn("emitter", ["emitter"], skew_ms)
        self.emitters.append(child)
        return child

    def start_worker(self, *, skew_ms: int = 0) -> Child:
        child = self._spawn(
            "worker", ["worker", "--app", "tests.chaos.handlers", "--queues", QUEUE], skew_ms
        )
        self.workers.append(child)
        return child

    def stop_process(self, child: Child) -> None:
        """SIGSTOP (the whole process group): frozen, sockets open, no heartbeats."""
        child.stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGSTOP)

    def continue_process(self, child: Child) -> None:
        """SIGCONT after :meth:`stop_process`."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGCONT)
        child.stopped = False

    # ------------------------------------------------------------ broker pause
    def pause_broker(self) -> int | None:
        """SIGSTOP the broker; its pid (None when it does not run)."""
        pid = self.broker.running_pid()
        if pid is not None:
            self.broker_paused = True
            os.kill(pid, signal.SIGSTOP)
        return pid

    def resume_broker(self) -> None:
        pid = self.broker.running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.broker_paused = False

    def group_client_ids(self, group: str) -> list[str] | None:
        """Client ids of the members of ``group`` now; None when the broker did not say."""
        admin = AdminClient(self.settings.client_config(**{"log_level": 0}))
        try:
            desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
        except KafkaException:
            return None
        return [m.client_id for m in desc.members]

    def kill(self, child: Child) -> None:
        """kill -9 (the whole process group)."""
        child.ended_by_us = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.popen.wait(30)
        self._forget(child)

    def terminate(self, child: Child, timeout_s: float = 30.0) -> int:
        """SIGTERM, then kill -9 after ``timeout_s``; the exit code."""
        child.ended_by_us = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
            if child.stopped:  # a stopped process acts on SIGTERM only once continued
                self.continue_process(child)
        try:
            code = child.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            code = child.popen.wait(30)
        self._forget(child)
        return code

    def _forget(self, child: Child) -> None:
        for group in (self.emitters, self.workers):
            if child in group:
                group.remove(child)

    def unexpected_exits(self) -> list[Child]:
        """Children that exited without being told to (removed from the live lists)."""
        gone = [c for c in [*self.emitters, *self.workers] if not c.alive()]
        for child in gone:
            self._forget(child)
        return gone

    def active_emitter(self) -> Child | None:
        """The emitter holding the lease, by its client id; None when none does (now)."""
        admin = AdminClient(self.settings.client_config(**{"log_level": 0}))
        n = names(self.settings)
        try:
            desc = admin.describe_consumer_groups([n.emitter_group], request_timeout=5)[
                n.emitter_group
            ].result(10)
        except KafkaException:
            return None
        for member in desc.members:
            tps = member.assignment.topic_partitions if member.assignment else []
            if any(tp.topic == n.lease and tp.partition == 0 for tp in tps):
                # The lease client's id ends with its process id (streams/emitter/lease.py).
                for child in self.emitters:
                    if member.client_id.endswith(f"-{child.pid}"):
                        return child
        return None

    def stop_all(self) -> None:
        """Stop every child (SIGTERM, then kill -9) and the broker, whatever happened."""
        if self.broker_paused:
            with contextlib.suppress(Exception):
                self.resume_broker()
        for child in list(self.every):
            if child.alive():
                with contextlib.suppress(Exception):
                    self.terminate(child, timeout_s=15)
        with contextlib.suppress(Exception):
            self.broker.stop()
