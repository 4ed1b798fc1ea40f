"""The processes of one chaos run: its own broker, emitters and workers.

Everything here is started by this object and stopped by pid (process group)
in :meth:`ChaosCluster.stop_all`, also after a failure. The broker is a
:class:`~dueflow.broker.local.LocalBroker` on a free port in the run's
directory, so the suite may stop, kill and restart it with the same data;
with ``nodes=3`` it is a :class:`~dueflow.broker.cluster.LocalCluster` of
three nodes on free ports instead (topics with 3 replicas, 2 in sync), whose
nodes the driver kills and pauses through :mod:`tests.chaos.nodes`.
Emitters and workers are real ``python -m dueflow ...`` processes, each with
its own ``client.id`` (``DUEFLOW_KAFKA_CLIENT_ID``), which is how the driver
tells which emitter holds the lease. A child may run with a skewed wall clock
(:mod:`tests.chaos.skew`) and may be stopped (SIGSTOP) and continued; so may
the broker. :meth:`ChaosCluster.stop_all` continues whatever is stopped first.
Group members are asked through :class:`~dueflow.kafka.group_probe.GroupProbe`
(a child process: librdkafka's describe_consumer_groups may abort its process).
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

from dueflow.broker.cluster import LocalCluster
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair, free_port_run
from dueflow.config import Settings, load_settings
from dueflow.errors import BrokerError
from dueflow.kafka.clients import make_admin
from dueflow.kafka.group_probe import GroupProbe
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
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
shards = {shards}

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
    """Broker (or ``nodes`` of a cluster), emitters and workers of one run."""

    def __init__(
        self, root: Path, *, ledger: Path, prefix: str = "chaos", nodes: int = 1, shards: int = 1
    ) -> None:
        self.root = root
        self.ledger = ledger
        self.prefix = prefix
        self.nodes = nodes
        self.config = root / "dueflow.toml"
        self.config.write_text(CONFIG.format(queue=QUEUE, shards=shards))
        self._broker: LocalBroker | None = None
        self.local_cluster: LocalCluster | None = None
        self._probe: GroupProbe | None = None
        self._attempt = 0  # start attempts: each cluster attempt gets a fresh directory
        self._use_port(free_port_run(2 * nodes) if nodes > 1 else free_port_pair())
        self.emitters: list[Child] = []
        self.workers: list[Child] = []
        self.every: list[Child] = []
        self._serial = 0
        self.skewer = ClockSkewer(root / "skew")
        self.broker_paused = False

    def _use_port(self, port: int) -> None:
        self.port = port
        replication: dict[str, int] = {}
        if self.nodes > 1:
            # a failed start leaves its directory (logs) behind: the next one starts afresh
            name = "cluster" if self._attempt == 0 else f"cluster-{self._attempt + 1}"
            self.local_cluster = LocalCluster(
                nodes=self.nodes, base_port=port, state_dir=self.root / name, heap="512m"
            )
            replication = {
                "replication_factor": self.local_cluster.replication_factor,
                "min_insync_replicas": self.local_cluster.min_insync_replicas,
            }
        else:
            self._broker = LocalBroker(port=port, state_dir=self.root / "broker", heap="768m")
        self.settings: Settings = load_settings(
            config_file=self.config,
            env={},
            overrides={"bootstrap": self.bootstrap, "topic_prefix": self.prefix, **replication},
        )

    @property
    def broker(self) -> LocalBroker:
        """The single broker (the broker fault kinds); a cluster's nodes are faulted
        through :class:`tests.chaos.nodes.ClusterNodes` instead."""
        if self._broker is None:
            raise RuntimeError("broker faults need the single-node run; a cluster has nodes")
        return self._broker

    @property
    def bootstrap(self) -> str:
        """Every node's address (the one broker's on a single node)."""
        if self.local_cluster is not None:
            return self.local_cluster.bootstrap
        return self.broker.bootstrap

    # ------------------------------------------------------------------ broker
    def start_broker(self) -> None:
        """The first start: on other free ports when the chosen ones were taken meanwhile
        (the machine is shared)."""
        for attempt in range(3):
            try:
                if self.local_cluster is not None:
                    self.local_cluster.start(timeout_s=180)
                    self.local_cluster.create_internal_topics()
                else:
                    self.broker.start()
                return
            except BrokerError as exc:
                if self.local_cluster is not None:
                    self.local_cluster.stop()  # by pid: what started before the failure
                if attempt == 2:
                    raise
                sys.stderr.write(f"[chaos] broker start failed, trying other ports: {exc}\n")
                self._attempt += 1
                self._use_port(
                    free_port_run(2 * self.nodes) if self.nodes > 1 else free_port_pair()
                )

    def ensure_topics(self) -> None:
        report = TopicAdmin(
            make_admin(self.settings), replication_factor=self.settings.replication_factor
        ).ensure(topic_layout(self.settings))
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
                "DUEFLOW_BOOTSTRAP": self.bootstrap,
                "DUEFLOW_TOPIC_PREFIX": self.prefix,
                "DUEFLOW_REPLICATION_FACTOR": str(self.settings.replication_factor),
                "DUEFLOW_MIN_INSYNC_REPLICAS": str(self.settings.min_insync_replicas),
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

    def _group_probe(self) -> GroupProbe:
        if self._probe is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
            env["PYTHONPATH"] = str(ROOT)
            self._probe = GroupProbe({"bootstrap.servers": self.bootstrap}, cwd=ROOT, env=env)
        return self._probe

    def group_client_ids(self, group: str) -> list[str] | None:
        """Client ids of the members of ``group`` now; None when the broker did not say."""
        members = self._group_probe().members(group)
        return None if members is None else [m.client_id for m in members]

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
        """The emitter holding the lease (of shard 0, with shards), by its client id;
        None when none does (now)."""
        n = names(self.settings)
        members = self._group_probe().members(n.emitter_group)
        if members is None:  # the broker did not say: the emitters' own logs do
            return self._active_by_log()
        for member in members:
            if (n.lease, 0) in member.assignment:
                # The lease client's id ends with its process id
                # (streams/dueflow/streams/emitter/lease.py).
                for child in self.emitters:
                    if member.client_id.endswith(f"-{child.pid}"):
                        return child
        return None

    def _active_by_log(self) -> Child | None:
        """The one running emitter whose log says it holds the lease of shard 0 now."""
        holders = [
            c
            for c in self.emitters
            if c.alive() and not c.stopped and last_lease_event(c.log_path) == LEASE_ACQUIRED
        ]
        return holders[0] if len(holders) == 1 else None

    def stop_all(self) -> None:
        """Stop every child (SIGTERM, then kill -9), the group probe and the broker (every
        node, paused ones continued first), whatever happened."""
        if self.broker_paused:
            with contextlib.suppress(Exception):
                self.resume_broker()
        for child in list(self.every):
            if child.alive():
                with contextlib.suppress(Exception):
                    self.terminate(child, timeout_s=15)
        if self._probe is not None:
            with contextlib.suppress(Exception):
                self._probe.close()
        with contextlib.suppress(Exception):
            if self.local_cluster is not None:
                self.local_cluster.stop()
            else:
                self.broker.stop()


LEASE_ACQUIRED = b'"emitter lease acquired"'
LEASE_ENDS = (b'"emitter lease lost"', b'"emitter lease released"')


def last_lease_event(log: Path) -> bytes | None:
    """The last lease event of shard 0 in an emitter's JSON log (:data:`LEASE_ACQUIRED`
    or one of :data:`LEASE_ENDS`), None when there is none."""
    try:
        lines = log.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"shard":0' not in line:
            continue
        for name in (LEASE_ACQUIRED, *LEASE_ENDS):
            if name in line:
                return name
    return None
