from __future__ import annotations

import json
import subprocess
import sys

from confluent_kafka.admin import NewTopic

from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout
from tests.conftest import KafkaCluster


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dueflow", *args], capture_output=True, text=True, timeout=60
    )


def test_ensure_creates_everything_then_changes_nothing(kafka: KafkaCluster, prefix: str) -> None:
    args = ("--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--queues", "billing:4")
    first = _cli("topics", "ensure", "--json", *args)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    settings = kafka.settings(prefix, queues="billing:4")
    expected = {s.name for s in topic_layout(settings)}
    assert set(report["created"]) == expected
    second = _cli("topics", "ensure", "--json", *args)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["created"] == []
    assert set(again["unchanged"]) == expected
    assert again["differences"] == []
    # the cluster holds what the layout says
    admin = TopicAdmin(make_admin(settings), replication_factor=1)
    states = {s.name: s for s in admin.describe(topic_layout(settings))}
    assert states[f"{prefix}.timers"].partitions == settings.wheel.total_partitions
    assert states[f"{prefix}.timers"].config["retention.ms"] == "-1"
    assert states[f"{prefix}.idempotency.billing"].config["cleanup.policy"] == "compact,delete"
    described = _cli("topics", "describe", *args)
    assert described.returncode == 0
    assert f"{prefix}.exec.billing" in described.stdout
    assert "MISMATCH" not in described.stdout


def test_ensure_refuses_a_mismatched_topic_and_leaves_it(kafka: KafkaCluster, prefix: str) -> None:
    settings = kafka.settings(prefix, queues="billing:4")
    admin = make_admin(settings)
    # someone made the exec topic with 2 partitions and the idempotency topic without compaction
    futures = admin.create_topics(
        [
            NewTopic(f"{prefix}.exec.billing", 2, 1),
            NewTopic(f"{prefix}.idempotency.billing", 4, 1, config={"cleanup.policy": "delete"}),
        ]
    )
    for f in futures.values():
        f.result()
    res = _cli(
        "topics",
        "ensure",
        "--bootstrap",
        kafka.bootstrap,
        "--topic-prefix",
        prefix,
        "--queues",
        "billing:4",
    )
    assert res.returncode == 1
    assert f"MISMATCH: {prefix}.exec.billing: partitions is '2', dueflow needs '4'" in res.stdout
    assert f"MISMATCH: {prefix}.idempotency.billing: cleanup.policy is 'delete'" in res.stdout
    md = admin.list_topics(timeout=10)
    assert len(md.topics[f"{prefix}.exec.billing"].partitions) == 2  # untouched
    states = {
        s.name: s for s in TopicAdmin(admin, replication_factor=1).describe(topic_layout(settings))
    }
    assert states[f"{prefix}.idempotency.billing"].config["cleanup.policy"] == "delete"
    # the other topics were still created
    assert states[f"{prefix}.timers"].partitions == settings.wheel.total_partitions
