"""The broker probe of the benchmarks against the real broker: its request counts over
JMX (benchmarks/java/BrokerRequests.java) and its threads' CPU."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from benchmarks.broker_probe import BrokerRequests, request_rates, thread_cpu_s
from dueflow.kafka.clients import make_admin
from tests.conftest import KafkaCluster

pytestmark = pytest.mark.integration


def test_the_probe_counts_the_produce_requests_it_caused(kafka: KafkaCluster, prefix: str) -> None:
    if kafka.broker is None:
        pytest.skip("DUEFLOW_BOOTSTRAP: an external cluster has no local broker JVM to attach to")
    pid = kafka.broker.running_pid()
    assert pid is not None
    topic = f"{prefix}.probe"
    admin = make_admin(kafka.settings(prefix))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    with BrokerRequests(pid) as reader:
        before = reader.counts()
        for i in range(12):  # one ProduceRequest each: flushed one by one
            producer.produce(topic, str(i).encode())
            assert producer.flush(30) == 0
        after = reader.counts()
    produced = after.get("Produce", 0) - before.get("Produce", 0)
    assert produced >= 12
    rates = request_rates(before, after, 1.0)
    assert rates["Produce"] == produced
    assert rates["total"] >= produced
    # the broker's threads: its request path took CPU for those requests
    assert thread_cpu_s(pid).get("requests", 0.0) > 0
