"""Worker groups: the rebalance protocol's client settings and broker-side group configs."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer

from dueflow.config import Settings, WorkerSettings
from dueflow.kafka.clients import consumer_config
from dueflow.kafka.group_config import incremental, worker_consumer_config, worker_group_configs


def test_the_default_is_kip848_with_the_brokers_co_partitioning_range_assignor() -> None:
    ws = WorkerSettings(session_timeout_ms=6_000)
    assert incremental(ws)
    conf = worker_consumer_config(ws)
    assert conf["group.protocol"] == "consumer"
    assert conf["group.remote.assignor"] == "range"
    # Session and heartbeat live on the broker with this protocol.
    assert "session.timeout.ms" not in conf
    assert worker_group_configs(ws) == {
        "consumer.session.timeout.ms": "6000",
        "consumer.heartbeat.interval.ms": "2000",
    }


def test_classic_keeps_eager_range_and_client_side_sessions() -> None:
    ws = WorkerSettings(group_protocol="classic", session_timeout_ms=9_000)
    conf = worker_consumer_config(ws)
    assert conf["partition.assignment.strategy"] == "range"
    assert conf["session.timeout.ms"] == 9_000
    assert conf["heartbeat.interval.ms"] == 3_000
    assert worker_group_configs(ws) == {}


def test_a_revoke_may_wait_its_grace_without_the_member_being_expelled() -> None:
    conf = worker_consumer_config(WorkerSettings(rebalance_grace_s=600))
    assert conf["max.poll.interval.ms"] >= 600_000 + 30_000


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_librdkafka_accepts_the_whole_consumer_config(protocol: str) -> None:
    ws = WorkerSettings(group_protocol=protocol)  # type: ignore[arg-type]
    settings = Settings(bootstrap="127.0.0.1:1")
    conf: dict[str, Any] = consumer_config(settings, "g", **worker_consumer_config(ws))
    Consumer(conf).close()  # raises on a setting the protocol does not allow


def test_an_explicit_heartbeat_must_be_below_the_session() -> None:
    from dueflow.errors import ConfigError

    with pytest.raises(ConfigError, match="heartbeat_interval_ms"):
        Settings(
            worker=WorkerSettings(heartbeat_interval_ms=5_000, session_timeout_ms=5_000)
        ).validate()
