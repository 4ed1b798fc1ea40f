"""A real 3-node local cluster (``dueflow.broker.cluster``): it starts as one quorum,
replicates dueflow's and Kafka's internal topics 3 ways with 2 in sync, and keeps
every acknowledged record through kill -9 of a partition leader, of a transaction
coordinator and SIGSTOP of a leader; a node started again rejoins every ISR.

The cluster is this module's own (free loopback ports, a temporary directory),
stopped by pid at the end, also after failures; a test that takes a node down
brings it back in its teardown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from dueflow.broker.cluster import (
    OFFSETS_TOPIC,
    TRANSACTION_TOPIC,
    LocalCluster,
    bootstrap_servers,
)
from dueflow.broker.ports import free_port_run
from dueflow.kafka.topics import topic_layout
from tests.conftest import KafkaCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = Path(tmp_path_factory.mktemp("cluster"))
    c = LocalCluster(
        nodes=NODES,
        base_port=free_port_run(2 * NODES),
        state_dir=state,
        heap=os.environ.get("DUEFLOW_TEST_NODE_HEAP", "512m"),
    )
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def whole(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster; after the test every node runs again, continued, back in sync."""
    try:
        yield cluster
    finally:
        for n in cluster.paused:
            cluster.resume_node(n)
        for n, pid in cluster.running().items():
            if pid is None:
                cluster.start_node(n)
        for n in cluster.node_ids():
            cluster.wait_in_sync(n, timeout_s=60)


def _admin(c: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": c.bootstrap, "log_level": 0})


def _create(c: LocalCluster, topic: str, partitions: int = 1) -> None:
    admin = _admin(c)
    futures = admin.create_topics(
        [NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})]
    )
    for f in futures.values():
        f.result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [c.partition_state(topic, p) for p in range(partitions)]
        if all(s is not None and s.leader is not None and len(s.isr) == 3 for s in states):
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} has no leader and full ISR after 30 s")


def _config(c: LocalCluster, topic: str, key: str) -> str:
    res = ConfigResource(ResourceType.TOPIC, topic)
    admin = _admin(c)  # kept until the answer is in
    entries = admin.describe_configs([res])[res].result(30)
    return str(entries[key].value)


def _consumer(c: LocalCluster, topic: str) -> Consumer:
    """A read_committed consumer of partition 0 from its start (assigned: no group, so
    nothing but the partition's leader matters)."""
    consumer = Consumer(
        {
            "bootstrap.servers": c.bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return consumer


def _values(messages: list[Message]) -> list[int]:
    """The records' values; errors a client rides through (a node gone, a broker whose
    metadata lags a new topic) are skipped, others raised."""
    out = []
    for m in messages:
        err = m.error()
        if err is None:
            out.append(int(m.value() or b"-1"))
        elif not (err.retriable() or err.code() in TRANSIENT):
            raise KafkaException(err)
    return out


TRANSIENT = {
    KafkaError._PARTITION_EOF,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
}


def _leader(c: LocalCluster, topic: str, timeout_s: float = 30) -> int:
    """The leader of ``topic``/0 (metadata asked of any node can lag a moment behind
    a topic just created: asked again until a node answers with the leader)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = c.leader_of(topic, 0)
        if leader is not None:
            return leader
        time.sleep(0.1)
    raise AssertionError(f"{topic}/0 has no leader in the metadata after {timeout_s:.0f}s")


def _wait_leader_moved(c: LocalCluster, topic: str, away_from: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = c.leader_of(topic, 0)
        if leader is not None and leader != away_from:
            return leader
        time.sleep(0.1)
    raise AssertionError(f"{topic}/0 still led by node {away_from} after {timeout_s:.0f}s")


# ------------------------------------------------------------------------ tests


def test_three_nodes_form_one_cluster_and_the_cli_sees_it(cluster: LocalCluster) -> None:
    md = cluster.metadata()
    assert sorted(md.brokers) == [1, 2, 3]
    assert {f"{b.host}:{b.port}" for b in md.brokers.values()} == set(cluster.bootstrap.split(","))
    cid = cluster.cluster_id()
    assert str(md.cluster_id) == cid  # (typed None in confluent-kafka's metadata class)
    for n in cluster.node_ids():
        broker = cluster.broker(n)
        meta = broker.paths.formatted_marker.read_text()
        assert f"cluster.id={cid}" in meta
        assert f"node.id={n}" in meta
        assert broker.is_ready(brokers=3)  # every node answers and knows all three
    assert md.controller_id in (1, 2, 3)

    base = str(cluster.specs[0].port)
    args = ["--nodes", "3", "--port", base, "--dir", str(cluster.root), "--json"]
    cli = [sys.executable, "-m", "dueflow", "broker"]
    status = subprocess.run([*cli, "status", *args], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["ready"] is True
    assert report["bootstrap"] == cluster.bootstrap
    assert [x["pid"] for x in report["nodes"]] == [cluster.pid(n) for n in (1, 2, 3)]
    again = subprocess.run([*cli, "start", *args], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["started"] is False  # a no-op on a running cluster


def test_topics_ensure_replicates_every_topic_three_ways(cluster: LocalCluster) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DUEFLOW_REPLICATION_FACTOR": "3",
        "DUEFLOW_MIN_INSYNC_REPLICAS": "2",
    }
    res = subprocess.run(
        [
            *(sys.executable, "-m", "dueflow", "topics", "ensure", "--json"),
            *("--bootstrap", cluster.bootstrap, "--topic-prefix", prefix, "--queues", "billing:4"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    settings = KafkaCluster(cluster.bootstrap, None).settings(prefix, queues="billing:4")
    expected = {s.name for s in topic_layout(settings)}
    assert set(json.loads(res.stdout)["created"]) == expected
    md = _metadata_naming(cluster, expected)
    for name in expected:
        parts = md.topics[name].partitions.values()
        assert parts, name
        assert all(sorted(p.replicas) == [1, 2, 3] for p in parts), name
        assert _config(cluster, name, "min.insync.replicas") == "2", name
    admin = _admin(cluster)
    for f in admin.delete_topics(sorted(expected)).values():
        f.result()


def _metadata_naming(c: LocalCluster, topics: set[str], timeout_s: float = 30.0) -> ClusterMetadata:
    """A metadata answer that names every one of ``topics`` with its partitions. A node
    learns of a topic created through another node a moment later, so an answer from
    it may not name the topic yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = c.metadata()
        missing = sorted(t for t in topics if t not in md.topics or not md.topics[t].partitions)
        if not missing:
            return md
        assert time.monotonic() < deadline, f"metadata never named {missing}"
        time.sleep(0.2)


def _rdkafka_log(name: str) -> tuple[logging.Logger, list[str]]:
    """A logger for a client's ``debug`` lines, and the list they are collected in."""
    said: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    log = logging.getLogger(f"rdkafka.{name}")
    log.addHandler(Lines())
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log, said


def _joined_group_coordinator(c: LocalCluster, group: str, timeout_s: float = 60) -> int:
    """A consumer joins ``group``; the coordinator librdkafka's FindCoordinator named."""
    log, said = _rdkafka_log(group)
    consumer = Consumer(
        {"bootstrap.servers": c.bootstrap, "group.id": group, "debug": "cgrp", "logger": log}
    )
    pattern = re.compile(rf'Group "{re.escape(group)}" coordinator is \S+ id (\d+)')
    try:
        consumer.subscribe([f"t{uuid.uuid4().hex[:10]}.none"])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            consumer.poll(0.2)
            named = {int(m) for line in list(said) for m in pattern.findall(line)}
            if named:
                assert len(named) == 1, named
                return named.pop()
    finally:
        consumer.close()
    raise AssertionError(f"no coordinator found for {group} in {timeout_s:.0f}s")


def test_internal_topics_have_three_replicas(cluster: LocalCluster) -> None:
    # an offsets lookup of a group creates __consumer_offsets, a transactional
    # producer __transaction_state; both answer, all replicas in sync
    cluster.create_internal_topics(timeout_s=120)
    md = cluster.metadata()
    for topic in (OFFSETS_TOPIC, TRANSACTION_TOPIC):
        parts = md.topics[topic].partitions.values()
        assert len(parts) == 8, topic
        assert all(sorted(x.replicas) == [1, 2, 3] for x in parts), topic
    assert _config(cluster, TRANSACTION_TOPIC, "min.insync.replicas") == "2"
    assert _config(cluster, OFFSETS_TOPIC, "min.insync.replicas") == "2"


def test_group_coordinator_is_the_leader_of_the_groups_offsets_partition(
    cluster: LocalCluster,
) -> None:
    for i in range(4):
        group = f"g-{i}-{uuid.uuid4().hex[:6]}"
        named = _joined_group_coordinator(cluster, group)  # FindCoordinator's answer
        assert named == cluster.group_coordinator(group), group


def test_acknowledged_records_survive_kill_of_the_partition_leader(whole: LocalCluster) -> None:
    c = whole
    topic = f"t{uuid.uuid4().hex[:10]}.acks"
    _create(c, topic)
    victim = _leader(c, topic)
    acked: list[int] = []
    failed: list[int] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        (failed if err is not None else acked).append(int(msg.value() or b"-1"))

    producer = Producer(
        {
            "bootstrap.servers": c.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "log_level": 0,
        }
    )
    consumer = _consumer(c, topic)
    total, kill_after = 3000, 1000
    read: list[int] = []
    sent = 0
    killed_at_ack = -1
    deadline = time.monotonic() + 120
    try:
        # one loop produces, serves delivery reports and consumes; the leader is
        # killed -9 while records are in flight
        while time.monotonic() < deadline:
            for _ in range(min(20, total - sent)):
                producer.produce(topic, str(sent).encode(), on_delivery=on_delivery)
                sent += 1
            producer.poll(0)
            read.extend(_values(consumer.consume(500, 0.05)))
            if killed_at_ack < 0 and len(acked) >= kill_after:
                killed_at_ack = len(acked)
                c.kill_node(victim)
            if sent == total and len(acked) + len(failed) == total and set(acked) <= set(read):
                break
        new_leader = _wait_leader_moved(c, topic, victim)
        state = c.partition_state(topic, 0)
    finally:
        producer.flush(30)
        consumer.close()
    assert killed_at_ack >= kill_after
    assert failed == []  # min ISR 2 of 3: every record was acknowledged, none refused
    assert sorted(acked) == list(range(total))
    assert set(acked) <= set(read), f"lost: {sorted(set(acked) - set(read))[:20]}"
    assert len(read) == len(set(read)), "a record was read twice (idempotence)"
    assert new_leader != victim
    assert state is not None
    assert victim not in state.isr

    # started again on its data, the node catches up and rejoins every ISR
    c.start_node(victim)
    assert c.wait_in_sync(victim, timeout_s=60), c.out_of_sync(victim)
    state = c.partition_state(topic, 0)
    assert state is not None
    assert sorted(state.isr) == [1, 2, 3]


def _finish(producer: Producer) -> bool:
    """Commit the open transaction: True when committed, False when it had to be
    aborted (its records are then written again); a fatal error is raised."""
    while True:
        try:
            producer.commit_transaction(30)
            return True
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable():
                continue
            if err.txn_requires_abort():
                producer.abort_transaction(30)
                return False
            raise


def _commit(producer: Producer, topic: str, values: range) -> bool:
    """One transaction of ``values`` (see :func:`_finish`)."""
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, str(v).encode())
    return _finish(producer)


def test_a_transactional_producer_survives_kill_of_its_coordinator(whole: LocalCluster) -> None:
    c = whole
    topic = f"t{uuid.uuid4().hex[:10]}.txn"
    _create(c, topic)
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    rk_log, said = _rdkafka_log(txn_id)
    producer = Producer(
        {
            "bootstrap.servers": c.bootstrap,
            "transactional.id": txn_id,
            "debug": "eos",
            "logger": rk_log,
        }
    )
    producer.init_transactions(60)
    assert _commit(producer, topic, range(0, 10))
    coordinator = c.txn_coordinator(txn_id)
    assert coordinator is not None
    # librdkafka's FindCoordinator answer names the node Kafka's hash rule names
    named = {
        int(m) for m in re.findall(r"Transaction coordinator is broker (\d+)", "\n".join(said))
    }
    assert named == {coordinator}

    # a transaction open when its coordinator dies, then more on the same producer
    producer.begin_transaction()
    for v in range(10, 20):
        producer.produce(topic, str(v).encode())
    producer.flush(30)
    c.kill_node(coordinator)
    committed = list(range(0, 10))
    if _finish(producer):
        committed += range(10, 20)
    base = 20
    done = 0
    deadline = time.monotonic() + 120
    while done < 5 and time.monotonic() < deadline:
        batch = range(base, base + 10)
        if _commit(producer, topic, batch):
            committed += batch
            done += 1
        base += 10
    assert done == 5, "the producer did not commit 5 transactions after the kill"
    new_coordinator = c.txn_coordinator(txn_id)
    assert new_coordinator is not None
    assert new_coordinator != coordinator

    consumer = _consumer(c, topic)
    read: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while set(read) < set(committed) and time.monotonic() < deadline:
            read.extend(_values(consumer.consume(500, 0.2)))
    finally:
        consumer.close()
    assert sorted(read) == sorted(committed)  # every commit, nothing aborted, once

    c.start_node(coordinator)
    assert c.wait_in_sync(coordinator, timeout_s=60), c.out_of_sync(coordinator)


def test_a_paused_leader_is_replaced_and_catches_up_after_sigcont(whole: LocalCluster) -> None:
    c = whole
    topic = f"t{uuid.uuid4().hex[:10]}.pause"
    _create(c, topic)
    victim = _leader(c, topic)
    c.pause_node(victim)
    try:
        new_leader = _wait_leader_moved(c, topic, victim)
        # Made now and told only of the nodes left: a producer that still knew the
        # paused node as leader waited a request timeout (30 s) on it first.
        live = bootstrap_servers(s for s in c.specs if s.node_id != victim)
        producer = Producer({"bootstrap.servers": live, "acks": "all", "enable.idempotence": True})
        for v in range(100):
            producer.produce(topic, str(v).encode())
        assert producer.flush(60) == 0  # acknowledged by the two nodes left
        state = c.partition_state(topic, 0)
        assert state is not None
        assert victim not in state.isr
    finally:
        c.resume_node(victim)
    assert new_leader != victim
    assert c.wait_in_sync(victim, timeout_s=60), c.out_of_sync(victim)
    consumer = _consumer(c, topic)
    read: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(read) < 100 and time.monotonic() < deadline:
            read.extend(_values(consumer.consume(500, 0.2)))
    finally:
        consumer.close()
    assert sorted(read) == list(range(100))
