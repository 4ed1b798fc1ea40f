"""The Kafka-direct cluster view and the status/job commands without the status view."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.kafka.clients import make_consumer, make_producer
from dueflow.kafka.cluster_view import compute_view
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules.partitioning import partition_for_key
from dueflow.streams.status.cluster_reader import ClusterReader
from tests.conftest import KafkaCluster
from tests.integration.status_support import ensure_topics, outcome, write_outcomes

WHEEL = {
    "levels": "8x1000,4x4000",
    "near_partitions": 2,
    "near_window_ms": 1500,
    "lookahead_ms": 100,
}
WHEEL_ENV = {
    "DUEFLOW_WHEEL_LEVELS": "8x1000,4x4000",
    "DUEFLOW_WHEEL_NEAR_PARTITIONS": "2",
    "DUEFLOW_WHEEL_NEAR_WINDOW_MS": "1500",
    "DUEFLOW_WHEEL_LOOKAHEAD_MS": "100",
}
NOWHERE = "http://127.0.0.1:1"  # no status view answers here


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in WHEEL_ENV.items():
        monkeypatch.setenv(key, value)
    s = kafka.settings(
        prefix, queues=[{"name": "default", "partitions": 2, "retry_tiers_ms": [1000]}], wheel=WHEEL
    )
    ensure_topics(s)
    return s


def _produce(settings: Settings, topic: str, partition: int, n: int, value: bytes = b"x") -> None:
    p = make_producer(settings)
    for _ in range(n):
        p.produce(topic, value=value, partition=partition)
    assert p.flush(10) == 0


def _commit(settings: Settings, group: str, offsets: list[TopicPartition]) -> None:
    c = make_consumer(settings, group)
    try:
        c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()


def _dead_letter(job_id: str) -> bytes:
    return codec.encode(
        "dead_letter",
        {
            "job_id": job_id,
            "queue": "default",
            "task": "charge",
            "idempotency_key": job_id,
            "reason": "permanent_error",
            "error_type": "ValueError",
            "error_message": "bad card",
            "attempts": 1,
            "first_failure_ms": 1,
            "last_failure_ms": 2,
            "dead_ms": 3 if job_id == "d1" else 4,
            "original_topic": "x",
            "original_partition": 0,
            "original_offset": 0,
            "trace_id": None,
            "job_value": b"",
        },
    )


@pytest.fixture
def lease_member(settings: Settings) -> Iterator[Consumer]:
    """A member of the emitter group that holds the lease partition (a stand-in emitter)."""
    n = names(settings)
    assigned: list[Any] = []
    c = make_consumer(settings, n.emitter_group, **{"client.id": "emitter-under-test"})
    c.subscribe([n.lease], on_assign=lambda _c, parts: assigned.extend(parts))
    try:
        deadline = time.monotonic() + 30
        while not assigned and time.monotonic() < deadline:
            c.poll(0.2)
        assert assigned, "the stand-in emitter never got the lease partition"
        yield c
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_cluster_view_reads_lag_dlq_timers_and_emitter(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    n = names(settings)
    geo = settings.wheel
    near, level0, level1 = 0, geo.partition_of(0, 5), geo.partition_of(1, 1)
    _produce(settings, n.timers, near, 3)
    _produce(settings, n.timers, level0, 2)
    _produce(settings, n.timers, level1, 4)
    # Emitters commit into the offsets group (in transactions) or the lease group
    # (without): per partition the higher offset counts.
    _commit(
        settings,
        n.emitter_offsets_group,
        [TopicPartition(n.timers, near, 2), TopicPartition(n.timers, level1, 1)],
    )
    _commit(settings, n.emitter_group, [TopicPartition(n.timers, level1, 4)])
    _produce(settings, n.exec("default"), 0, 5)
    _produce(settings, n.retry("default", 1000), 1, 2)
    _commit(settings, n.worker_group("default"), [TopicPartition(n.exec("default"), 0, 3)])
    p = make_producer(settings)
    schema: list[tuple[str, str | bytes | None]] = [
        (hdr.SCHEMA, codec.schema_header("dead_letter"))
    ]
    for job in ("d1", "d2"):
        p.produce(n.dlq("default"), value=_dead_letter(job), partition=0, headers=schema)
    p.produce(n.dlq("default"), value=b"garbage", partition=1, headers=[(hdr.JOB_ID, b"d3")])
    assert p.flush(10) == 0

    with ClusterReader(settings) as reader:
        view = compute_view(reader.read(), settings)
    assert view.errors == ()
    assert view.timers_pending == {"near": 1, "0": 2, "1": 0}
    assert view.lag_by_queue == {"default": 2 + 2}
    assert view.dlq_depth == {"default": 3}
    assert view.active_emitter is None
    assert [(f.job_id, f.reason) for f in view.failures] == [
        ("d3", "undecodable"),  # the undecodable one carries broker time: newest
        ("d2", "permanent_error"),
        ("d1", "permanent_error"),
    ]

    # The same numbers through `dueflow status` when no status view answers.
    assert main(["status", "--bootstrap", settings.bootstrap, "--topic-prefix",
                 settings.topic_prefix, "--url", NOWHERE, "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "kafka"
    assert doc["queues"]["default"] == {
        "counts": None,
        "lag": 4,
        "dlq_depth": 3,
        "paused": None,
    }
    assert doc["timers_pending"] == {"near": 1, "0": 2, "1": 0}
    assert len(doc["dlq_tail"]) == 3


@pytest.mark.timeout(120)
def test_active_emitter_is_the_lease_holder(
    settings: Settings, lease_member: Consumer, capsys: pytest.CaptureFixture[str]
) -> None:
    with ClusterReader(settings) as reader:
        view = compute_view(reader.read(), settings)
    assert view.active_emitter is not None
    assert view.active_emitter.client_id == "emitter-under-test"
    assert view.emitter_members == 1
    assert main(["status", "--bootstrap", settings.bootstrap, "--topic-prefix",
                 settings.topic_prefix, "--url", NOWHERE]) == 0  # fmt: skip
    assert "active emitter: emitter-under-test" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_job_command_scans_the_outcomes_partition(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    t = int(time.time() * 1000)
    write_outcomes(
        settings,
        [outcome(f"other-{i}", "scheduled", at_ms=t) for i in range(20)]
        + [
            outcome("wanted", "scheduled", at_ms=t),
            outcome("wanted", "retrying", at_ms=t + 1, attempt=1, error="boom"),
            outcome("wanted", "succeeded", at_ms=t + 2, attempt=2),
        ],
    )
    common = ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix]
    assert main(["job", "wanted", *common, "--url", NOWHERE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "kafka"
    assert doc["found"] is True
    assert doc["job"]["state"] == "succeeded"
    assert doc["job"]["attempts"] == 2
    assert doc["job"]["last_error"]["message"] == "boom"
    assert doc["scan"]["partition"] == partition_for_key(b"wanted", settings.outcomes_partitions)
    assert doc["scan"]["older_records_not_read"] == 0

    assert main(["job", "missing", *common, "--kafka"]) == 1
    assert "missing: unknown: no outcome found (no such job" in capsys.readouterr().out
    # bounded: with a scan limit of 1 only the newest record of the partition is read
    assert main(["job", "wanted", *common, "--kafka", "--json", "--scan-limit", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scan"]["records_read"] == 1
    assert doc["job"]["history"] == [["succeeded", 2, t + 2]]


def test_murmur2_partitions_agree_with_librdkafka(settings: Settings) -> None:
    topic = names(settings).outcomes
    got: dict[bytes | None, int | None] = {}
    p = make_producer(settings)
    keys = [f"job-{i}".encode() for i in range(200)] + ["ünï".encode(), b"a", b"ab", b"abc"]
    for key in keys:
        p.produce(
            topic,
            key=key,
            value=b"",
            on_delivery=lambda err, msg: got.__setitem__(msg.key(), msg.partition()),
        )
    assert p.flush(10) == 0
    want: dict[bytes | None, int | None] = {
        k: partition_for_key(k, settings.outcomes_partitions) for k in keys
    }
    assert want == got


def _in_transactions(settings: Settings, topic: str, partition: int, values: list[bytes]) -> None:
    """One transaction per record (as a worker writes a rare dead letter), and one aborted."""
    p = make_producer(settings, **{"transactional.id": f"{settings.topic_prefix}.txn-test"})
    p.init_transactions(10)
    for value in values:
        p.begin_transaction()
        p.produce(topic, value=value, partition=partition)
        p.commit_transaction(10)
    p.begin_transaction()
    p.produce(topic, value=b"aborted", partition=partition)
    p.flush(10)
    p.abort_transaction(10)


@pytest.mark.timeout(120)
def test_records_are_counted_where_transaction_markers_take_offsets(settings: Settings) -> None:
    n = names(settings)
    dlq, exec_topic = n.dlq("default"), n.exec("default")
    _in_transactions(settings, dlq, 1, [_dead_letter(f"t{i}") for i in range(3)])
    _in_transactions(settings, exec_topic, 1, [b"job"] * 2)
    group = n.worker_group("default")
    # The group finished both jobs: it committed the offset after the second one,
    # which is followed by a commit marker, an aborted record and an abort marker.
    _commit(settings, group, [TopicPartition(exec_topic, 1, 3)])
    with ClusterReader(settings) as reader:
        snap = reader.read()
        view = compute_view(snap, settings)
        assert snap.watermarks[(dlq, 1)].high - snap.watermarks[(dlq, 1)].low == 8
        assert view.dlq_depth == {"default": 3}
        exec_row = [r for r in view.lag if (r.topic, r.partition) == (exec_topic, 1)]
        assert [(r.committed, r.high, r.lag) for r in exec_row] == [(3, 6, 0)]
        # The DLQ grows: counted again from where the last count stopped.
        _in_transactions(settings, dlq, 1, [_dead_letter("t9")])
        view = compute_view(reader.read(), settings)
        assert view.dlq_depth == {"default": 4}
        assert view.lag_by_queue == {"default": 0}
