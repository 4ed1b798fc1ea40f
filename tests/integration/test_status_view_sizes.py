"""The status view goes on past an oversized record on the outcomes topic: an
outcome whose texts are megabytes long, and bytes that are no outcome at all."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.status_support import ensure_topics, outcome, start_view, write_outcomes
from tests.integration.test_size_budget import set_topic_config
from tests.integration.worker_support import read_topic


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix)
    ensure_topics(s)
    return s


@pytest.mark.timeout(180)
def test_an_oversized_outcome_does_not_stop_the_status_view(
    settings: Settings, tmp_path: Path
) -> None:
    n = names(settings)
    set_topic_config(settings, n.outcomes, "max.message.bytes", "12000000")
    producer = Producer(settings.client_config(**{"message.max.bytes": 16_000_000}))
    now = int(time.time() * 1000)
    write_outcomes(settings, [outcome("before", "succeeded", at_ms=now)], producer)
    huge = outcome("huge", "dead", at_ms=now, error_type="E", error="e" * 5_000_000)
    producer.produce(
        n.outcomes,
        key=b"huge",
        value=codec.encode("outcome", huge),
        headers=[(hdr.SCHEMA, codec.schema_header("outcome"))],
    )
    producer.produce(n.outcomes, key=b"junk", value=os.urandom(5_000_000))
    assert producer.flush(30) == 0
    after = [outcome(f"after-{i}", "succeeded", at_ms=now + 1) for i in range(12)]
    write_outcomes(settings, after, producer)
    view = start_view(
        settings, port=free_port(), data_dir=tmp_path / "data", log_path=tmp_path / "view.log"
    )
    try:
        view.wait_ready()
        for o in after:
            view.wait_job(o["job_id"], "succeeded", timeout_s=60)
        shown = view.wait_job("huge", "dead")
        assert len(shown["last_error"]["message"]) < 10_000  # kept short in the table
        assert view.get("/healthz")[0] == 200
    finally:
        assert view.stop() == 0, view.log()
    (junk,) = [
        codec.decode("quarantined", r.value or b"")
        for r in read_topic(settings, n.quarantine, until=lambda got: len(got) >= 1)
    ]
    assert junk["reason"].startswith("undecodable outcome")
    assert "value truncated from 5000000 bytes" in junk["reason"]
