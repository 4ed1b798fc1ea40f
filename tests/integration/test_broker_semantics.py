"""Proof that the broker under test does what dueflow's guarantees rely on."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import KafkaCluster


def _create(admin: AdminClient, topic: str, config: dict[str, str] | None = None) -> None:
    for f in admin.create_topics([NewTopic(topic, 1, 1, config=config or {})]).values():
        f.result()


def _read_all(
    bootstrap: str, topic: str, isolation: str, expect: int
) -> list[tuple[bytes | None, bytes | None]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            for m in c.consume(500, 0.2):
                if m.error() is None:
                    out.append((m.key(), m.value()))
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
            pos = c.position([TopicPartition(topic, 0)])[0].offset
            if len(out) >= expect and pos >= hi:
                break
    finally:
        c.close()
    return out


def test_aborted_records_are_invisible_to_read_committed(kafka: KafkaCluster, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    topic = f"{prefix}.txn"
    _create(admin, topic)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{prefix}-tx"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, f"aborted-{i}".encode(), key=b"a")
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"committed-{i}".encode(), key=b"c")
    p.commit_transaction()
    committed = _read_all(kafka.bootstrap, topic, "read_committed", expect=3)
    assert [v for _, v in committed] == [b"committed-0", b"committed-1", b"committed-2"]
    uncommitted = _read_all(kafka.bootstrap, topic, "read_uncommitted", expect=8)
    assert sum((v or b"").startswith(b"aborted") for _, v in uncommitted) == 5


def test_compaction_keeps_the_last_value_per_key(kafka: KafkaCluster, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    topic = f"{prefix}.compacted"
    _create(
        admin,
        topic,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "100",
        },
    )
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    for round_ in range(5):
        for key in ("a", "b", "c"):
            p.produce(topic, f"{key}{round_}".encode(), key=key.encode())
        p.flush()
        time.sleep(0.15)  # roll segments: only closed segments are compacted
    # Rolling happens on append: keep appending a filler key until the cleaner ran.
    deadline = time.monotonic() + 60
    records: list[tuple[bytes | None, bytes | None]] = []
    while time.monotonic() < deadline:
        p.produce(topic, b"x", key=b"filler")
        p.flush()
        records = _read_all(kafka.bootstrap, topic, "read_committed", expect=1)
        keyed = [r for r in records if r[0] != b"filler"]
        if len(keyed) == 3:
            break
        time.sleep(0.5)
    latest = {k: v for k, v in records if k != b"filler"}
    assert latest == {b"a": b"a4", b"b": b"b4", b"c": b"c4"}
    assert len([r for r in records if r[0] != b"filler"]) == 3  # older values were removed
