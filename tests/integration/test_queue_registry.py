"""Queues as data, against the real broker: ``dueflow queue create|list|describe``.

``create`` makes a queue's topics, then registers it; ``list``/``describe``
show the static and the registered queues merged (the registry wins, a
difference is a conflict). The end-to-end runs (a queue created while an
emitter and a worker run, routing by ``@task``) are in
tests/integration/test_queue_routing.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from dueflow.apps.cli.main import main
from dueflow.config import QueueSpec
from dueflow.kafka.clients import make_admin
from dueflow.kafka.queue_reader import read_registry
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout
from dueflow.records.queue_registry import encode_queue
from tests.conftest import KafkaCluster


def _cli(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*args, "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = _cli(kafka, prefix, capsys, *args, "--json")
    assert code == 0, err
    return orjson.loads(out)


def _partitions(kafka: KafkaCluster, prefix: str) -> dict[str, int]:
    md = make_admin(kafka.settings(prefix)).list_topics(timeout=10)
    return {t: len(m.partitions) for t, m in md.topics.items() if t.startswith(prefix + ".")}


def test_create_makes_the_topics_then_registers_and_list_and_describe_show_it(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _json(
        kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "3",
        "--retry-tiers", "1s,5s", "--rate-limit", "20", "--idempotency-retention", "2d",
        "--by", "ada@ops",
    )  # fmt: skip
    topics = {
        f"{prefix}.exec.billing",
        f"{prefix}.retry.billing.1s",
        f"{prefix}.retry.billing.5s",
        f"{prefix}.dlq.billing",
        f"{prefix}.idempotency.billing",
        f"{prefix}.steering.billing",
    }
    assert created["registered"] is True
    assert set(created["topics_created"]) == topics
    on_cluster = _partitions(kafka, prefix)
    assert {t: on_cluster[t] for t in topics} == dict.fromkeys(topics, 3)
    assert f"{prefix}.queues" in on_cluster  # the registry itself, made on first use

    registry = read_registry(kafka.settings(prefix))
    entry = registry.catalog.registered["billing"]
    assert entry.spec == QueueSpec("billing", 3, (1_000, 5_000), 2 * 86_400_000, 20.0)
    assert entry.created_by == "ada@ops"

    listed = _json(kafka, prefix, capsys, "queue", "list")
    by_name = {q["queue"]: q for q in listed["queues"]}
    assert set(by_name) == {"default", "billing"}  # the built-in static queue, and the new one
    assert by_name["billing"]["source"] == "registry"
    assert by_name["billing"]["partitions"] == 3
    assert by_name["billing"]["retry_tiers_ms"] == [1_000, 5_000]
    assert listed["conflicts"] == []

    described = _json(kafka, prefix, capsys, "queue", "describe", "billing")
    assert described["spec"]["rate_limit_per_s"] == 20.0
    assert {t["topic"]: t["status"] for t in described["topics"]} == dict.fromkeys(topics, "ok")
    assert {t["actual_partitions"] for t in described["topics"]} == {3}

    # Again with the same spec: nothing new, success.
    code, out, _ = _cli(
        kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "3",
        "--retry-tiers", "1s,5s", "--rate-limit", "20", "--idempotency-retention", "2d",
    )  # fmt: skip
    assert code == 0
    assert "already registered with this spec" in out
    # Another spec under the same name: refused, the registry keeps the first.
    code, _, err = _cli(kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "4")
    assert code == 2
    assert "queue 'billing' exists with another spec: partitions 3 (asked: 4)" in err
    assert read_registry(kafka.settings(prefix)).view.get("billing") == entry.spec


def test_create_registers_nothing_when_an_existing_topic_does_not_fit(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = make_admin(kafka.settings(prefix))
    for fut in admin.create_topics([NewTopic(f"{prefix}.exec.reports", 2, 1)]).values():
        fut.result()
    code, _, err = _cli(kafka, prefix, capsys, "queue", "create", "reports", "--partitions", "4")
    assert code == 1  # as `topics ensure` with a mismatch
    assert f"{prefix}.exec.reports: partitions is '2', dueflow needs '4'" in err
    assert "nothing was created or registered" in err
    assert "reports" not in read_registry(kafka.settings(prefix)).view
    on_cluster = _partitions(kafka, prefix)
    assert on_cluster[f"{prefix}.exec.reports"] == 2  # left as it was
    assert not [t for t in on_cluster if ".reports" in t and "exec" not in t]  # none made


def test_a_static_queue_and_its_registered_spec_merge_and_the_conflict_is_shown(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _json(kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "2")
    # This process's static config says billing has 6 partitions: the registry wins.
    listed = _json(kafka, prefix, capsys, "queue", "list", "--queues", "billing:6,default")
    by_name = {q["queue"]: q for q in listed["queues"]}
    assert [q["queue"] for q in listed["queues"]] == ["billing", "default"]  # static order
    assert by_name["billing"]["partitions"] == 2
    assert by_name["billing"]["source"] == "both"
    assert by_name["default"]["source"] == "static"
    (conflict,) = listed["conflicts"]
    assert "'billing': partitions is 2 in the queue registry but 6 in the static config" in (
        conflict
    )
    code, out, _ = _cli(
        kafka, prefix, capsys, "queue", "describe", "billing", "--queues", "billing:6"
    )
    assert code == 0
    assert "partitions   2" in out
    assert "conflict: queue 'billing': partitions is 2" in out


def test_pause_accepts_a_registered_queue_and_unknown_ones_are_refused_with_the_fix(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = kafka.settings(prefix)
    control = [t for t in topic_layout(settings) if t.role == "control"]
    assert TopicAdmin(make_admin(settings), replication_factor=1).ensure(control).ok
    _json(kafka, prefix, capsys, "queue", "create", "billing", "--partitions", "1")
    code, _, err = _cli(kafka, prefix, capsys, "queue", "pause", "billing", "--reason", "x")
    assert code == 0, err
    listed = _json(kafka, prefix, capsys, "queue", "list")
    assert {q["queue"]: q["paused"] for q in listed["queues"]} == {
        "default": False,
        "billing": True,
    }
    for command in (["queue", "pause", "billingz"], ["dlq", "list", "--queue", "billingz"]):
        code, _, err = _cli(kafka, prefix, capsys, *command)
        assert code == 2
        assert "got 'billingz'" in err
        assert "dueflow queue create billingz --partitions N" in err


def test_topics_ensure_covers_registered_queues(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A registered queue whose topics are gone (a restored cluster) gets them back."""
    settings = kafka.settings(prefix)
    registry = [t for t in topic_layout(settings) if t.role == "queues"]
    assert TopicAdmin(make_admin(settings), replication_factor=1).ensure(registry).ok
    key, value, headers = encode_queue(
        QueueSpec("restored", 2, (1_000,)), created_ms=1, created_by=""
    )
    producer = Producer(settings.client_config())
    produce: Any = producer.produce  # headers: list[tuple[str, bytes]]
    produce(f"{prefix}.queues", value, key, headers=headers)
    assert producer.flush(10) == 0
    report = _json(kafka, prefix, capsys, "topics", "ensure", "--queues", "default:1")
    assert {
        f"{prefix}.exec.restored",
        f"{prefix}.retry.restored.1s",
        f"{prefix}.dlq.restored",
        f"{prefix}.idempotency.restored",
    } <= set(report["created"])
    assert _partitions(kafka, prefix)[f"{prefix}.exec.restored"] == 2
