"""Reading topics back in integration tests: high watermarks and every record."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import make_consumer


def _consumer(settings: Settings) -> Consumer:
    return make_consumer(settings, f"test-read-{uuid.uuid4().hex}")


def high_watermarks(settings: Settings, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> high watermark`` of every partition of ``topics``."""
    c = _consumer(settings)
    try:
        out: dict[tuple[str, int], int] = {}
        for topic in topics:
            md = c.list_topics(topic, timeout=10)
            for p in md.topics[topic].partitions:
                out[topic, p] = _high(c, TopicPartition(topic, p))
        return out
    finally:
        c.close()


_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
}


def _high(c: Consumer, tp: TopicPartition, timeout_s: float = 20.0) -> int:
    """High watermark; retried while a new topic's leaders settle."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _lo, hi = c.get_watermark_offsets(tp, timeout=10)
            return int(hi)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            settling = isinstance(err, KafkaError) and (err.retriable() or err.code() in _SETTLING)
            if not settling or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def settle(settings: Settings, topics: Iterable[str], *, timeout_s: float = 10.0) -> bool:
    """Wait until no transaction is open on ``topics``: every partition's last stable
    offset (what a read_committed reader reaches) equals its high watermark. True when
    they met within ``timeout_s``.

    A committed transaction is not readable at once: the broker answers the commit
    once the coordinator logged it, and writes the commit markers to the partitions
    after that. A reader that takes its end right after a commit can stop before the
    transaction's last records."""
    topics = list(topics)
    committed = _consumer(settings)
    everything = make_consumer(
        settings, f"test-read-{uuid.uuid4().hex}", **{"isolation.level": "read_uncommitted"}
    )
    try:
        parts = [
            TopicPartition(t, p)
            for t in topics
            for p in committed.list_topics(t, timeout=10).topics[t].partitions
        ]
        deadline = time.monotonic() + timeout_s
        while True:
            if all(_high(committed, tp) == _high(everything, tp) for tp in parts):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    finally:
        committed.close()
        everything.close()


def read_all(settings: Settings, topic: str, *, timeout_s: float = 30.0) -> list[Message]:
    """Every committed record of ``topic``, from the beginning to the high watermarks
    (after waiting up to 10 s for transactions on it to settle)."""
    settle(settings, [topic])
    ends = {p: hi for (_t, p), hi in high_watermarks(settings, [topic]).items()}
    c = _consumer(settings)
    out: list[Message] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p, hi in ends.items() if hi > 0])
        done = {p for p, hi in ends.items() if hi == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end in {timeout_s}s")
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    continue
                out.append(m)
                offset = m.offset()
                if offset is not None and offset + 1 >= ends[m.partition() or 0]:
                    done.add(m.partition() or 0)
        return out
    finally:
        c.close()


def headers_of(msg: Message) -> list[tuple[str, bytes]]:
    """A record's headers as ``(name, bytes)`` pairs (the client types them loosely)."""
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return [(k, v if isinstance(v, bytes) else str(v or "").encode()) for k, v in pairs]
