"""The visibility probe against the real broker: a record is appended before its
transaction commits, and the probe's two readers see it in that order."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from benchmarks.visibility_probe import VisibilityProbe
from dueflow.kafka.clients import consumer_config, make_admin, make_transactional_producer
from dueflow.wall_clock import wall_ms
from tests.conftest import KafkaCluster

pytestmark = pytest.mark.integration

HOLD_S = 0.4  # how long the transaction stays open after its records were sent


def test_the_probe_splits_appended_from_committed(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    settings = kafka.settings(prefix)
    topic = f"{prefix}.exec.probe"
    admin = make_admin(settings)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = make_transactional_producer(settings, f"{prefix}.probe-txn")
    producer.init_transactions(30)
    probe = VisibilityProbe(consumer_config(settings, f"{prefix}.vis"), [topic], tmp_path)
    with probe:
        producer.begin_transaction()
        for i in range(10):
            producer.produce(
                topic,
                str(i).encode(),
                key=str(i).encode(),
                headers=[("df-fired", str(wall_ms()).encode())],
            )
        producer.produce(topic, b"unstamped", key=b"u")  # not fired by an emitter: left out
        assert producer.flush(30) == 0  # appended now, inside the open transaction
        held = threading.Event()
        held.wait(HOLD_S)  # the transaction stays open this long
        producer.commit_transaction(30)
        end = wall_ms() + 30_000
        # both readers must have read everything before they are stopped
        while wall_ms() < end and min(probe.counts().values()) < 11:
            held.wait(0.05)
        assert probe.counts() == {"read_uncommitted": 11, "read_committed": 11}
    out = probe.result()
    assert out["records"] == 10
    assert out["fired_to_appended_ms"]["max"] < HOLD_S * 1000
    # every record waited in the open transaction at least the hold
    assert out["appended_to_committed_ms"]["p50"] >= HOLD_S * 1000 - 50
    assert out["fired_to_committed_ms"]["p50"] >= HOLD_S * 1000
