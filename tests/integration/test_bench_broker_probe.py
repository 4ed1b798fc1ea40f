"""The broker probe of the benchmarks against the real broker: its request counts over
JMX (benchmarks/java/BrokerRequests.java) and its threads' CPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from benchmarks.broker_probe import BrokerRequests, request_rates, thread_cpu_s
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.config import load_settings
from dueflow.kafka.clients import make_admin
from tests.conftest import KafkaCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def local_broker(kafka: KafkaCluster, tmp_path: Path) -> Iterator[LocalBroker]:
    """The session's broker, or one of this test's own when DUEFLOW_BOOTSTRAP points
    at an external cluster (the probe attaches to a broker JVM on this host)."""
    if kafka.broker is not None:
        yield kafka.broker
        return
    broker = LocalBroker(port=free_port_pair(), state_dir=tmp_path / "b", heap="384m")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()  # by pid, even if the test failed half way


def test_the_probe_counts_the_produce_requests_it_caused(
    local_broker: LocalBroker, prefix: str
) -> None:
    pid = local_broker.running_pid()
    assert pid is not None
    topic = f"{prefix}.probe"
    admin = make_admin(load_settings(env={}, overrides={"bootstrap": local_broker.bootstrap}))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": local_broker.bootstrap, "linger.ms": 0})
    with BrokerRequests(pid) as reader:
        before = reader.counts()
        for i in range(12):  # one ProduceRequest each: flushed one by one
            producer.produce(topic, str(i).encode())
            assert producer.flush(30) == 0
        # The broker counts a request once its response is sent, which can be
        # after the client has it: the last one may show a moment later.
        deadline = time.monotonic() + 10
        while True:
            after = reader.counts()
            produced = after.get("Produce", 0) - before.get("Produce", 0)
            if produced >= 12 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert produced >= 12
    rates = request_rates(before, after, 1.0)
    assert rates["Produce"] == produced
    assert rates["total"] >= produced
    # the broker's threads: its request path took CPU for those requests
    assert thread_cpu_s(pid).get("requests", 0.0) > 0
