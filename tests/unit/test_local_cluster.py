"""The pure parts of the local cluster: ports, quorum, per-node settings, the
coordinator hash rule (values checked against Java 17's ``String.hashCode``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dueflow.broker.cluster import (
    CLUSTER_PROPERTIES,
    LocalCluster,
    bootstrap_servers,
    cluster_layout,
    coordinator_partition,
    default_replication,
    java_string_hash,
    node_properties,
    quorum_voters,
)
from dueflow.broker.local import server_properties


def test_layout_gives_each_node_a_client_port_and_the_controller_port_after_it() -> None:
    specs = cluster_layout(nodes=3, base_port=9092)
    assert [(s.node_id, s.port, s.controller_port) for s in specs] == [
        (1, 9092, 9093),
        (2, 9094, 9095),
        (3, 9096, 9097),
    ]
    assert quorum_voters(specs) == "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    assert bootstrap_servers(specs) == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"


@pytest.mark.parametrize(("nodes", "base"), [(0, 9092), (3, 0), (3, 65531)])
def test_layout_refuses_impossible_clusters(nodes: int, base: int) -> None:
    with pytest.raises(ValueError, match=r"nodes|port"):
        cluster_layout(nodes=nodes, base_port=base)


@pytest.mark.parametrize(
    ("nodes", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2))]
)
def test_default_replication(nodes: int, expected: tuple[int, int]) -> None:
    assert default_replication(nodes) == expected


def test_every_node_is_broker_and_controller_of_one_quorum_with_replicated_topics() -> None:
    specs = cluster_layout(nodes=3, base_port=20000)
    props = [
        node_properties(
            s,
            specs=specs,
            data_dir=Path(f"/d/{s.node_id}"),
            replication_factor=3,
            min_insync_replicas=2,
        )
        for s in specs
    ]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in props} == {quorum_voters(specs)}
    for s, p in zip(specs, props, strict=True):
        assert p["process.roles"] == "broker,controller"
        assert p["listeners"] == (
            f"PLAINTEXT://127.0.0.1:{s.port},CONTROLLER://127.0.0.1:{s.controller_port}"
        )
        assert p["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{s.port}"
        assert p["log.dirs"] == p["metadata.log.dir"] == f"/d/{s.node_id}"
        assert p["default.replication.factor"] == "3"
        assert p["min.insync.replicas"] == "2"
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["share.coordinator.state.topic.replication.factor"] == "3"
        assert p["share.coordinator.state.topic.min.isr"] == "2"
        for key, value in CLUSTER_PROPERTIES.items():
            assert p[key] == value


def test_one_node_settings_are_unchanged() -> None:
    p = server_properties(port=9092, controller_port=9093, data_dir=Path("/d"))
    assert p["node.id"] == "1"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:9093"
    for key in (
        "default.replication.factor",
        "min.insync.replicas",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert p[key] == "1", key
    assert not set(CLUSTER_PROPERTIES) & set(p)


def test_the_nodes_write_the_settings_of_node_properties(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=3, base_port=30000, state_dir=tmp_path)
    for spec in cluster.specs:
        broker = cluster.broker(spec.node_id)
        broker.write_config()
        written = dict(
            line.split("=", 1) for line in broker.paths.properties.read_text().splitlines()
        )
        assert written == node_properties(
            spec,
            specs=cluster.specs,
            data_dir=broker.paths.data.resolve(),
            replication_factor=3,
            min_insync_replicas=2,
        )
        assert broker.paths.root == (tmp_path / f"node-{spec.node_id}").resolve()
    assert cluster.bootstrap == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    # one cluster id, made once and kept
    cid = cluster.cluster_id()
    assert cid == cluster.cluster_id() == cluster.cluster_id_file.read_text().strip()


# Java 17: System.out.println(s.hashCode()) for each string.
@pytest.mark.parametrize(
    ("text", "hash_code"),
    [
        ("hello", 99162322),
        ("", 0),
        ("polygenelubricants", -2147483648),
        ("dueflow.worker.chaos", -416307620),
        ("chaos.emitter", -1755438336),
        ("chaos.emitter.1", 945907907),
        ("zzzzzzzz", -1910022912),
        ("été", 227742),
        ("\U0001f600x", 54959989),  # outside the BMP: two UTF-16 code units
    ],
)
def test_java_string_hash(text: str, hash_code: int) -> None:
    assert java_string_hash(text) == hash_code


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        ("hello", 50, 22),
        ("hello", 8, 2),
        ("polygenelubricants", 50, 0),  # Utils.abs(Integer.MIN_VALUE) is 0
        ("dueflow.worker.chaos", 50, 20),  # a negative hash: its absolute value
        ("chaos.emitter", 50, 36),
        ("chaos.emitter.1", 8, 3),
        ("chaos.worker.chaos", 8, 6),
        ("chaos.emitter.offsets", 50, 48),
    ],
)
def test_coordinator_partition_is_kafkas_rule(key: str, partitions: int, expected: int) -> None:
    assert coordinator_partition(key, partitions) == expected


def test_a_free_port_run_skips_a_taken_port() -> None:
    import socket

    from dueflow.broker.ports import free_port_run, ports_free

    base = free_port_run(6)
    assert ports_free(range(base, base + 6))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 3))
        taken.listen()
        assert not ports_free(range(base, base + 6))
        other = free_port_run(6, preferred=base)
        assert other != base
        assert ports_free(range(other, other + 6))


def test_free_ports_are_below_the_ephemeral_range() -> None:
    # An outgoing connection may take any ephemeral port as its source port
    # between the check and a broker's bind: a local broker died that way.
    from dueflow.broker.ports import _ephemeral_low, free_port, free_port_pair, free_port_run

    low = _ephemeral_low()
    assert all(free_port() < low for _ in range(20))
    pair = free_port_pair()
    assert pair + 1 < low
    run = free_port_run(6)
    assert run + 5 < low
