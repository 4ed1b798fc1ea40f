"""The emitter's outboxes against a real broker: the transactional one (transactions
opened ahead, fencing) and the one without transactions (acknowledged turns)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow.config import Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.kafka.topic_limits import is_too_large
from dueflow.kafka.topics import names
from dueflow.streams.emitter.acked_outbox import AckedOutbox, DeliveryFailed
from dueflow.streams.emitter.outbox import Outbox
from dueflow.streams.emitter.wheel_source import WheelSource
from tests.conftest import KafkaCluster
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics


def _settings(kafka: KafkaCluster, prefix: str, **emitter: Any) -> Settings:
    s = kafka.settings(
        prefix, queues="default:3", wheel=SMALL_WHEEL, emitter={**FAST_EMITTER, **emitter}
    )
    ensure_topics(s)
    return s


@contextlib.contextmanager
def _started(s: Settings) -> Iterator[tuple[WheelSource, Outbox]]:
    """A timer source (for the group metadata) and a started outbox, closed after."""
    source = WheelSource(s)
    source.start()
    outbox = Outbox(s)
    try:
        outbox.start()
        yield source, outbox
    finally:
        outbox.close()
        source.close()


def _committed(s: Settings) -> dict[int, tuple[int, str | None]]:
    """The timer offsets the emitter group has committed, as materialized: read
    uncommitted, so a transaction opened ahead (its offset pending) does not hold
    the answer back."""
    consumer = Consumer(
        s.client_config(
            **{"group.id": names(s).emitter_offsets_group, "isolation.level": "read_uncommitted"}
        )
    )
    try:
        tps = [TopicPartition(names(s).timers, p) for p in range(s.wheel.total_partitions)]
        got = consumer.committed(tps, timeout=15)
        return {tp.partition: (tp.offset, tp.metadata) for tp in got}
    finally:
        consumer.close()


def _settles_at(s: Settings, want: dict[int, tuple[int, str]]) -> dict[int, tuple[int, str]]:
    """The committed offsets of ``want``'s partitions once they equal ``want`` (a
    commit's markers are written just after it returns), or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        got = _committed(s)
        now = {p: (got[p][0], got[p][1] or "") for p in want}
        if now == want or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


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


def test_transactions_commit_in_turn_and_never_move_an_offset_back(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    assert s.emitter.producers == 2
    timers = names(s).timers
    exec_topic = names(s).exec("default")
    with _started(s) as (source, outbox):
        gm = source.group_metadata()
        assert (outbox.in_transaction, outbox.records, outbox.committing) == (False, 0, False)
        outbox.send(exec_topic, b"v", b"a", [])
        assert (outbox.in_transaction, outbox.records) == (True, 1)
        first = [TopicPartition(timers, 0, 5, "df1:5"), TopicPartition(timers, 1, 7, "df1:9")]
        outbox.submit(first, gm)
        # The next producer takes records while the first one commits.
        assert outbox.committing
        assert (outbox.in_transaction, outbox.records) == (False, 0)
        outbox.send(exec_topic, b"v", b"b", [])
        assert outbox.records == 1
        assert isinstance(outbox.wait(), int)
        assert outbox.collect() is None  # collected by wait()
        assert _settles_at(s, {0: (5, "df1:5")}) == {0: (5, "df1:5")}
        # The second commit moves partition 0 on; the first producer's transaction
        # was opened ahead with partition 0 at 5.
        outbox.submit([TopicPartition(timers, 0, 8, "df1:8")], gm)
        assert outbox.wait() is not None
        assert outbox.in_transaction  # the first producer again, opened ahead
        assert outbox.records == 0
        # Committed as it is, it must not write partition 0 back to 5.
        outbox.submit([], gm)
        assert outbox.wait() is not None
        want = {0: (8, "df1:8"), 1: (7, "df1:9")}
        assert _settles_at(s, want) == want
        assert _visible(s) == [b"a", b"b"]
        # An aborted transaction leaves everything as it was.
        outbox.send(exec_topic, b"v", b"c", [])
        outbox.abort()
        assert _settles_at(s, {0: (8, "df1:8")}) == {0: (8, "df1:8")}
        assert _visible(s) == [b"a", b"b"]


def test_a_new_outbox_fences_every_producer_of_the_old_one(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    exec_topic = names(s).exec("default")
    source = WheelSource(s)
    source.start()
    old = Outbox(s)
    old.start()
    new = Outbox(s)
    try:
        gm = source.group_metadata()
        old.send(exec_topic, b"v", b"first", [])
        old.submit([], gm)
        assert old.wait() is not None
        old.send(exec_topic, b"v", b"zombie", [])  # open on the second producer
        new.start()
        old.submit([], gm)
        with pytest.raises(FencedError):
            old.wait()
        new.send(exec_topic, b"v", b"second", [])
        assert new.commit([], gm) is not None
        assert _visible(s) == [b"first", b"second"]
    finally:
        old.close()
        new.close()
        source.close()


def test_an_outbox_without_transactions_fences_every_producer_of_a_transactional_one(
    kafka: KafkaCluster, prefix: str
) -> None:
    """A takeover by an emitter that fires without transactions aborts what an older
    transactional holder left open (fires and offsets: never visible, no longer
    pending) and leaves it nothing it can commit, before it reads an offset."""
    s = _settings(kafka, prefix)
    timers = names(s).timers
    exec_topic = names(s).exec("default")
    source = WheelSource(s)
    source.start()
    old = Outbox(s)
    old.start()
    new = AckedOutbox(s)
    try:
        gm = source.group_metadata()
        old.send(exec_topic, b"v", b"first", [])
        assert old.commit([TopicPartition(timers, 0, 3, "df1:3")], gm) is not None
        # A zombie's open transaction with records and an offset pending, as an
        # emitter stopped (SIGSTOP) between two commits leaves it.
        old.send(exec_topic, b"v", b"zombie", [])
        new.prepare()
        new.start()
        # The offsets are settled at once: the fetch does not wait for the
        # zombie's transaction to time out (10 s here).
        started = time.monotonic()
        assert source.committed(range(1), timeout_s=5.0)[0][0] == 3
        assert time.monotonic() - started < 5.0
        old.submit([TopicPartition(timers, 0, 9, "df1:9")], gm)
        with pytest.raises(FencedError):
            old.wait()
        assert _visible(s) == [b"first"]
        assert _settles_at(s, {0: (3, "df1:3")}) == {0: (3, "df1:3")}
        assert new.fenced_ms is not None
    finally:
        old.close()
        new.close()
        source.close()


def test_one_producer_waits_for_each_commit(kafka: KafkaCluster, prefix: str) -> None:
    s = _settings(kafka, prefix, producers=1)
    timers = names(s).timers
    exec_topic = names(s).exec("default")
    with _started(s) as (source, outbox):
        gm = source.group_metadata()
        outbox.send(exec_topic, b"v", b"a", [])
        outbox.submit([TopicPartition(timers, 2, 3, "df1:3")], gm)
        # Done (and the next transaction opened ahead) when submit returns.
        assert isinstance(outbox.collect(), int)
        assert (outbox.in_transaction, outbox.records) == (True, 0)
        outbox.send(exec_topic, b"v", b"b", [])
        assert outbox.commit([], gm) is not None
        assert _settles_at(s, {2: (3, "df1:3")}) == {2: (3, "df1:3")}
        assert _visible(s) == [b"a", b"b"]


def _wait(check: Any, outbox: AckedOutbox, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        outbox.poll(force=True)
        time.sleep(0.005)


def test_without_transactions_a_seal_is_acked_once_every_record_before_it_is(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    exec_topic = names(s).exec("default")
    visible: list[tuple[dict[str, list[int]], int]] = []
    outbox = AckedOutbox(s, on_acked=lambda fired, at: visible.append((fired, at)))
    outbox.prepare()
    outbox.start()
    try:
        outbox.send(exec_topic, b"v", b"a", [])
        outbox.send(exec_topic, b"v", b"b", [])
        outbox.cut({exec_topic: [1, 2]})
        outbox.send(exec_topic, b"v", b"c", [])
        assert outbox.records == 3
        first = outbox.seal()  # covers the open turn too
        assert outbox.records == 0
        outbox.send(exec_topic, b"v", b"d", [])
        second = outbox.seal()
        assert not outbox.acked(first)
        _wait(lambda: outbox.acked(second), outbox)
        assert outbox.acked(first)
        assert outbox.pending == 0
        # Visible without a commit: read_committed sees them at once.
        assert _visible(s) == [b"a", b"b", b"c", b"d"]
        # The fired due times of each acknowledged turn, once.
        assert [fired for fired, _ in visible] == [{exec_topic: [1, 2]}]
    finally:
        outbox.close()


def test_without_transactions_a_record_not_delivered_fails_the_turn(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    outbox = AckedOutbox(s)
    outbox.start()
    try:
        outbox.send(names(s).exec("default"), b"v", b"a", [], partition=7)  # 3 partitions
        seal = outbox.seal()
        with pytest.raises(DeliveryFailed):
            _wait(lambda: outbox.acked(seal), outbox)
        assert not outbox.acked(seal)
    finally:
        outbox.close()


def test_a_record_refused_as_too_large_is_known_whatever_error_ends_the_transaction(
    kafka: KafkaCluster, prefix: str
) -> None:
    """Once the broker refused a record, the transaction's next write fails with
    librdkafka's "erroneous state", which does not say why: the outbox knows from
    the failed delivery (so the emitter measures every record, and quarantines the
    refused one when it reads it again, instead of firing it again and again)."""
    s = _settings(kafka, prefix)
    exec_topic = names(s).exec("default")
    with _started(s) as (_, outbox):
        assert not outbox.refused_too_large()
        outbox.send(exec_topic, os.urandom(1_100_000), b"big", [], 0)  # over 1,048,588
        failed = _until_a_write_fails(outbox, exec_topic)
        assert not is_too_large(failed)  # the error alone does not say it
        assert outbox.refused_too_large(wait_s=5)


def _until_a_write_fails(outbox: Outbox, topic: str) -> KafkaOperationError:
    """Write small records into the open transaction until one fails (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            outbox.send(topic, b"small", b"k", [], 0)
        except KafkaOperationError as exc:
            return exc
        time.sleep(0.01)  # a write every 10 ms, until the refusal has come back
    raise AssertionError("every write went through")
