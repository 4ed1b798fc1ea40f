"""The emitter's transactional outbox against a real broker: transactions opened ahead."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from dueflow.config import Settings
from dueflow.streams.emitter.outbox import Outbox
from dueflow.streams.emitter.wheel_source import WheelSource
from dueflow.topics import names
from tests.conftest import KafkaCluster
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics


def _settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, queues="default:3", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    ensure_topics(s)
    return s


def _committed(source: WheelSource) -> dict[int, tuple[int, str | None]]:
    return {p: (off, ck.encode() if ck else None) for p, (off, ck) in source.committed().items()}


def _visible(s: Settings) -> list[bytes]:
    consumer = Consumer(
        s.client_config(
            **{
                "group.id": f"{s.topic_prefix}.check",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
            }
        )
    )
    topic = names(s).exec("default")
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        keys: list[bytes] = []
        ends: set[int] = set()
        deadline = time.monotonic() + 15
        while len(ends) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                ends.add(m.partition() or 0)
                continue
            keys.append(m.key() or b"")
        return sorted(keys)
    finally:
        consumer.close()


def test_a_transaction_opened_ahead_takes_records_and_changes_no_offset(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    timers = names(s).timers
    exec_topic = names(s).exec("default")
    source = WheelSource(s)
    source.start()
    outbox = Outbox(s)
    outbox.start()
    try:
        gm = source.group_metadata()
        outbox.open_ahead(gm)
        # Nothing committed yet: opened on the first write.
        assert (outbox.in_transaction, outbox.records) == (False, 0)
        outbox.send(exec_topic, b"v", b"a", [])
        assert outbox.records == 1
        first = [TopicPartition(timers, 0, 5, "df1:5"), TopicPartition(timers, 1, 7, "df1:9")]
        outbox.commit(first, gm)
        assert outbox.records == 0
        outbox.open_ahead(gm)
        assert (outbox.in_transaction, outbox.records) == (True, 0)
        # An opened-ahead transaction committed as it is rewrites what was committed.
        outbox.commit([], gm)
        after = _committed(source)
        assert after[0] == (5, "df1:5")
        assert after[1] == (7, "df1:9")
        # Records written into one are visible once it commits, with its offsets.
        outbox.open_ahead(gm)
        outbox.send(exec_topic, b"v", b"b", [])
        outbox.commit([TopicPartition(timers, 0, 8, "df1:8")], gm)
        after = _committed(source)
        assert after[0] == (8, "df1:8")
        assert after[1] == (7, "df1:9")
        assert _visible(s) == [b"a", b"b"]
        # An aborted opened-ahead transaction leaves everything as it was.
        outbox.open_ahead(gm)
        outbox.send(exec_topic, b"v", b"c", [])
        outbox.abort()
        assert _committed(source)[0] == (8, "df1:8")
        assert _visible(s) == [b"a", b"b"]
    finally:
        outbox.close()
        source.close()
