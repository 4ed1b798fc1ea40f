"""A local replicated Apache Kafka cluster: N KRaft nodes on loopback ports, no Docker.

Every node is a :class:`~dueflow.broker.local.LocalBroker` (same jars, same
settings) that is also a controller of one static quorum
(``controller.quorum.voters``); every node's storage is formatted with the
same cluster id. Node ``i`` (1-based) listens on ``base + 2(i-1)`` for
clients and on the port after it for the quorum. New topics default to 3
replicas and 2 in sync, and so do the internal ones (consumer offsets,
transaction state, share-group state).

A quorum answers only when a majority of its voters runs, so :meth:`start`
spawns every node before it waits; the cluster is ready when every node
answers a metadata request that lists all N brokers. Each node can be
stopped, killed (kill -9), paused (SIGSTOP), continued and started again on
its data; :meth:`leader_of`, :meth:`group_coordinator` and
:meth:`txn_coordinator` name the node that matters for a fault.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata

from dueflow.broker.local import LocalBroker, new_cluster_id, recorded_security, server_properties
from dueflow.broker.ports import ports_free
from dueflow.broker.security import PLAINTEXT, ListenerSecurity, SecurityFiles
from dueflow.errors import BrokerError

LOOPBACK = "127.0.0.1"
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_TOPIC = "__transaction_state"

# What a cluster sets beyond one node's settings (defaults in brackets).
CLUSTER_PROPERTIES: dict[str, str] = {
    # A node that stops heartbeating is fenced (and leaves every ISR) after this, so
    # the leaders of a killed node move within seconds [9000, 2000].
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "1000",
    # A follower this far behind leaves the ISR: acks=all waits for it no longer [30000].
    "replica.lag.time.max.ms": "10000",
    # A node started again leads its preferred partitions soon [300].
    "leader.imbalance.check.interval.seconds": "30",
}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node's id and loopback ports."""

    node_id: int
    port: int
    controller_port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition as the metadata shows it: leader (None: none), replicas, ISR."""

    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def cluster_layout(*, nodes: int, base_port: int) -> list[NodeSpec]:
    """Node ``i`` (1-based): client port ``base + 2(i-1)``, controller port the next."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    if base_port < 1 or base_port + 2 * nodes - 1 > 65535:
        raise ValueError(f"base port {base_port} leaves no room for {2 * nodes} ports")
    return [
        NodeSpec(i, base_port + 2 * (i - 1), base_port + 2 * (i - 1) + 1)
        for i in range(1, nodes + 1)
    ]


def quorum_voters(specs: Iterable[NodeSpec]) -> str:
    """``controller.quorum.voters``: ``1@127.0.0.1:c1,2@127.0.0.1:c2,...``."""
    return ",".join(f"{s.node_id}@{LOOPBACK}:{s.controller_port}" for s in specs)


def bootstrap_servers(specs: Iterable[NodeSpec]) -> str:
    """Every node's client address: the bootstrap list clients are given."""
    return ",".join(s.address for s in specs)


def default_replication(nodes: int) -> tuple[int, int]:
    """``(replication factor, min in sync)``: 3 and 2 from three nodes on, else all and
    one less (at least 1)."""
    rf = min(nodes, 3)
    return rf, max(1, rf - 1)


def node_properties(
    spec: NodeSpec,
    *,
    specs: Sequence[NodeSpec],
    data_dir: Path,
    replication_factor: int,
    min_insync_replicas: int,
    security: ListenerSecurity | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """``server.properties`` of one node of the cluster ``specs`` (pure)."""
    return server_properties(
        port=spec.port,
        controller_port=spec.controller_port,
        data_dir=data_dir,
        node_id=spec.node_id,
        voters=quorum_voters(specs),
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        security=security,
        extra={**CLUSTER_PROPERTIES, **(extra or {})},
    )


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code
    units, in signed 32-bit arithmetic."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The ``__consumer_offsets`` (group id) or ``__transaction_state`` (transactional
    id) partition whose leader coordinates ``key``: Kafka's
    ``Utils.abs(key.hashCode()) % partitions``, where ``Utils.abs(MIN_VALUE)`` is 0."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def default_cluster_dir(base_port: int) -> Path:
    """``$DUEFLOW_HOME/cluster-<base port>``, default ``./.dueflow/cluster-<base port>``."""
    return Path(os.environ.get("DUEFLOW_HOME", ".dueflow")) / f"cluster-{base_port}"


class LocalCluster:
    """N local nodes under one state directory (``node-<id>/`` each, ``cluster.id``)."""

    def __init__(
        self,
        *,
        nodes: int = 3,
        base_port: int = 9092,
        state_dir: Path | None = None,
        cache_dir: Path | None = None,
        heap: str = "512m",
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        extra_properties: dict[str, str] | None = None,
        java: str | None = None,
        security: str | None = None,
    ) -> None:
        """``security``: ``plaintext`` or ``sasl_ssl`` for every node (default: what the
        nodes were formatted for, else ``plaintext``); secured nodes share one CA,
        certificate and set of passwords in ``<state dir>/security`` and replicate
        over SASL_SSL."""
        self.specs = cluster_layout(nodes=nodes, base_port=base_port)
        self.root = (state_dir or default_cluster_dir(base_port)).resolve()
        first = self.root / f"node-{self.specs[0].node_id}"
        self.security = security or recorded_security(first) or PLAINTEXT
        rf, isr = default_replication(nodes)
        self.replication_factor = replication_factor or rf
        self.min_insync_replicas = min_insync_replicas or isr
        self._extra = {**CLUSTER_PROPERTIES, **(extra_properties or {})}
        self._brokers = {
            s.node_id: LocalBroker(
                port=s.port,
                controller_port=s.controller_port,
                state_dir=self.root / f"node-{s.node_id}",
                cache_dir=cache_dir,
                heap=heap,
                java=java,
                extra_properties=self._extra,
                node_id=s.node_id,
                voters=quorum_voters(self.specs),
                replication_factor=self.replication_factor,
                min_insync_replicas=self.min_insync_replicas,
                security=self.security,
                security_dir=self.root / "security",
            )
            for s in self.specs
        }
        self._paused: set[int] = set()
        self._admin: AdminClient | None = None

    # ------------------------------------------------------------------ names
    def node_ids(self) -> list[int]:
        return [s.node_id for s in self.specs]

    def broker(self, node: int) -> LocalBroker:
        try:
            return self._brokers[node]
        except KeyError:
            raise BrokerError(f"no node {node}: nodes are {self.node_ids()}") from None

    @property
    def bootstrap(self) -> str:
        return bootstrap_servers(self.specs)

    @property
    def secured(self) -> bool:
        return self.broker(self.node_ids()[0]).secured

    @property
    def security_files(self) -> SecurityFiles:
        return self.broker(self.node_ids()[0]).security_files

    def client_settings(self) -> dict[str, str]:
        """librdkafka settings a client needs besides the bootstrap (see
        :meth:`LocalBroker.client_settings`)."""
        return self.broker(self.node_ids()[0]).client_settings()

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """A librdkafka configuration for the cluster: every node, security, ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.client_settings(), **extra}

    @property
    def cluster_id_file(self) -> Path:
        return self.root / "cluster.id"

    def cluster_id(self) -> str:
        """The id every node is formatted with: made on the first start, kept in a file."""
        try:
            return self.cluster_id_file.read_text().strip()
        except FileNotFoundError:
            self.root.mkdir(parents=True, exist_ok=True)
            cid = new_cluster_id()
            self.cluster_id_file.write_text(cid + "\n")
            return cid

    # ---------------------------------------------------------- whole cluster
    def start(self, *, timeout_s: float = 120.0) -> dict[int, tuple[int, bool]]:
        """Start the nodes that do not run, all at once, and wait until the cluster is
        ready; ``{node: (pid, started_now)}``. A failure stops what this call started."""
        down = [n for n in self.node_ids() if self.broker(n).running_pid() is None]
        busy = [
            p
            for n in down
            for p in (self.broker(n).port, self.broker(n).controller_port)
            if not ports_free([p])
        ]
        if busy:
            raise BrokerError(
                f"ports {busy} on {LOOPBACK} are in use by another process; "
                "choose another base port with --port"
            )
        cid = self.cluster_id()
        for n in down:
            self.broker(n).cluster_id = cid
        result: dict[int, tuple[int, bool]] = {}
        started: list[int] = []
        try:
            if down and self.secured:
                # one CA and set of passwords, made once before the nodes read them
                self.broker(down[0]).prepare_security()
            # formatting runs a JVM per node: together; the spawns one by one (preexec_fn
            # is not safe in threads)
            with ThreadPoolExecutor(max_workers=len(self.specs)) as pool:
                for fut in [pool.submit(self.broker(n).prepare) for n in down]:
                    fut.result()
            for n in self.node_ids():
                result[n] = self.broker(n).launch()
                if result[n][1]:
                    started.append(n)
            self.wait_ready(timeout_s=timeout_s)
        except BaseException:
            for n in started:
                with contextlib.suppress(Exception):
                    self.broker(n).stop(timeout_s=10)
            raise
        return result

    def wait_ready(self, *, timeout_s: float = 120.0) -> None:
        """Until every node answers a metadata request listing all N brokers."""
        deadline = time.monotonic() + timeout_s
        for n in self.node_ids():
            left = max(1.0, deadline - time.monotonic())
            try:
                self.broker(n).wait_ready(timeout_s=left, brokers=len(self.specs))
            except BrokerError as exc:
                raise BrokerError(f"node {n}: {exc}") from exc

    def create_internal_topics(self, *, timeout_s: float = 120.0) -> None:
        """Have the cluster create ``__consumer_offsets`` and ``__transaction_state`` now
        (a committed-offsets lookup and a transactional producer's registration), and
        wait until their coordinators answer and every partition has all replicas in
        sync. Kafka creates them on first use, and the first clients then get
        ``COORDINATOR_LOAD_IN_PROGRESS`` or time-outs for seconds while three replicas
        are made."""
        deadline = time.monotonic() + timeout_s
        conf = self.client_config(log_level=0)
        consumer = Consumer({**conf, "group.id": "dueflow-cluster-warm-up"})
        try:
            _until_answered(
                deadline,
                lambda: consumer.committed([TopicPartition(OFFSETS_TOPIC, 0)], timeout=5),
            )
        finally:
            consumer.close()
        producer = Producer({**conf, "transactional.id": "dueflow-cluster-warm-up"})
        _until_answered(deadline, lambda: producer.init_transactions(5))
        while True:
            md = self.metadata(timeout_s=max(1.0, deadline - time.monotonic()))
            settled = [
                md.topics.get(t) is not None
                and bool(md.topics[t].partitions)
                and all(
                    p.leader >= 0 and len(p.isrs) == len(p.replicas) == self.replication_factor
                    for p in md.topics[t].partitions.values()
                )
                for t in (OFFSETS_TOPIC, TRANSACTION_TOPIC)
            ]
            if all(settled):
                return
            if time.monotonic() >= deadline:
                raise BrokerError(f"internal topics not in sync within {timeout_s:.0f}s")
            time.sleep(0.2)

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """Every node runs and its metadata lists all N brokers."""
        n_all = len(self.specs)
        return all(
            b.running_pid() is not None and b.is_ready(timeout_s, brokers=n_all)
            for b in self._brokers.values()
        )

    def stop(self, *, timeout_s: float = 30.0) -> dict[int, int | None]:
        """Stop every node (SIGTERM, all at once; kill -9 after ``timeout_s``);
        ``{node: pid or None}``."""
        self._paused.clear()  # LocalBroker.stop continues a stopped process
        with ThreadPoolExecutor(max_workers=len(self.specs)) as pool:
            futs = {
                n: pool.submit(self.broker(n).stop, timeout_s=timeout_s) for n in self.node_ids()
            }
            return {n: f.result() for n, f in futs.items()}

    def running(self) -> dict[int, int | None]:
        """``{node: pid or None}`` from the pid files (stale ones removed)."""
        return {n: self.broker(n).running_pid() for n in self.node_ids()}

    def destroy(self) -> None:
        """Stop every node and delete all state."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------- one node
    def pid(self, node: int) -> int | None:
        return self.broker(node).running_pid()

    def start_node(self, node: int, *, timeout_s: float = 120.0) -> tuple[int, bool]:
        """Start one node on its data; returns when it answers with all N brokers."""
        broker = self.broker(node)
        broker.cluster_id = self.cluster_id()
        self._paused.discard(node)
        pid, started = broker.launch()
        broker.wait_ready(timeout_s=timeout_s, brokers=len(self.specs))
        return pid, started

    def stop_node(self, node: int, *, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (controlled shutdown), kill -9 after ``timeout_s``; its pid."""
        self._paused.discard(node)
        return self.broker(node).stop(timeout_s=timeout_s)

    def kill_node(self, node: int) -> int | None:
        """kill -9; its pid."""
        self._paused.discard(node)
        return self.broker(node).kill()

    def pause_node(self, node: int) -> int | None:
        """SIGSTOP: the process keeps its sockets and answers nothing; its pid."""
        pid = self.pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
            self._paused.add(node)
        return pid

    def resume_node(self, node: int) -> int | None:
        """SIGCONT after :meth:`pause_node`; its pid."""
        pid = self.pid(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._paused.discard(node)
        return pid

    @property
    def paused(self) -> frozenset[int]:
        return frozenset(self._paused)

    # -------------------------------------------------------------- metadata
    def _client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                self.client_config(
                    log_level=0,  # no lines about the node a fault took down
                    **{"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500},
                )
            )
        return self._admin

    def metadata(self, topic: str | None = None, *, timeout_s: float = 15.0) -> ClusterMetadata:
        """A fresh metadata answer. A paused node keeps its connections up, and a
        client may send it request after request, so when the shared client does not
        answer, a new client asks one node alone, the nodes not paused in turn."""
        deadline = time.monotonic() + timeout_s
        turn = 0
        while True:
            try:
                return self._client().list_topics(topic=topic, timeout=2.0)
            except KafkaException as exc:
                last = exc
            candidates = [s for s in self.specs if s.node_id not in self._paused] or self.specs
            spec = candidates[turn % len(candidates)]
            turn += 1
            try:
                return self._node_client(spec).list_topics(topic=topic, timeout=2.0)
            except KafkaException as exc:
                last = exc
            if time.monotonic() >= deadline:
                raise BrokerError(f"no metadata answer within {timeout_s:.0f}s: {last}") from last
            time.sleep(0.1)

    def _node_client(self, spec: NodeSpec) -> AdminClient:
        """A client that knows one node only: its first request goes there."""
        return AdminClient({**self.client_config(log_level=0), "bootstrap.servers": spec.address})

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """Leader, replicas and ISR of ``topic``/``partition``; None when it is unknown."""
        md = self.metadata(topic)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            return None
        p = t.partitions[partition]
        return PartitionState(
            leader=p.leader if p.leader >= 0 else None,
            replicas=tuple(p.replicas),
            isr=tuple(p.isrs),
        )

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The node leading ``topic``/``partition`` now, per the metadata."""
        state = self.partition_state(topic, partition)
        return state.leader if state else None

    def _coordinator_by_hash(self, topic: str, key: str) -> int | None:
        md = self.metadata(topic)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            return None  # not created yet: no group or transaction used it so far
        return self.leader_of(topic, coordinator_partition(key, len(t.partitions)))

    def group_coordinator(self, group: str) -> int | None:
        """The coordinator of consumer group ``group``: the leader of the group's
        ``__consumer_offsets`` partition (None before any group made that topic).

        Computed from metadata rather than asked with ``describe_consumer_groups``:
        when that call times out (a paused or dead coordinator, a group being
        created) librdkafka 2.x aborts the whole process on an assertion
        (``rd_kafka_enq_once_del_source_return: eonce->refcnt > 0``,
        confluentinc/librdkafka#4605)."""
        return self._coordinator_by_hash(OFFSETS_TOPIC, group)

    def txn_coordinator(self, txn_id: str) -> int | None:
        """The transaction coordinator of ``txn_id``: the leader of its
        ``__transaction_state`` partition (confluent-kafka has no DescribeTransactions)."""
        return self._coordinator_by_hash(TRANSACTION_TOPIC, txn_id)

    def out_of_sync(self, node: int) -> list[tuple[str, int]]:
        """Partitions (every topic, internal ones too) that ``node`` replicates but is
        not in the ISR of."""
        md = self.metadata()
        return sorted(
            (name, pid)
            for name, t in md.topics.items()
            for pid, p in t.partitions.items()
            if node in p.replicas and node not in p.isrs
        )

    def misled(self) -> list[tuple[str, int]]:
        """Partitions not led by their preferred replica (the first) although it is in
        sync: what a node started again leaves behind until leadership moves back."""
        md = self.metadata()
        return sorted(
            (name, pid)
            for name, t in md.topics.items()
            for pid, p in t.partitions.items()
            if p.replicas and p.replicas[0] in p.isrs and p.leader != p.replicas[0]
        )

    def restore_preferred_leaders(self, *, timeout_s: float = 60.0) -> bool:
        """A preferred leader election on every partition now (what the controller's
        leader rebalance does on its own every 30 s), then until each is led by its
        preferred replica; True when it is."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not self.misled():
                    return True
                # (no timeouts given: confluent-kafka 2.16's binding refuses any keyword)
                self._client().elect_leaders(ElectionType.PREFERRED, None).result(timeout=30)
            except (KafkaException, BrokerError, TimeoutError):
                pass  # ELECTION_NOT_NEEDED for some, or asked too early: look again
            time.sleep(0.3)
        return False

    def wait_in_sync(self, node: int, *, timeout_s: float = 60.0) -> bool:
        """Until ``node`` is back in the ISR of every partition it replicates."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not self.out_of_sync(node):
                    return True
            except BrokerError:
                pass
            time.sleep(0.2)
        return False


def _until_answered(deadline: float, call: Callable[[], object]) -> None:
    """``call`` again while it fails, until ``deadline`` (a new cluster says
    NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or times out for a while, not all of
    which librdkafka flags retriable)."""
    while True:
        try:
            call()
            return
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                raise BrokerError(f"the cluster did not answer: {exc.args[0]}") from exc
            time.sleep(0.2)
