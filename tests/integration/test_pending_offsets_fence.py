"""What the worker's zombie fence rests on, against the real broker (KIP-447).

A worker frozen (SIGSTOP) inside ``commit_transaction`` can commit its
transaction after it wakes, when the group has given its partitions to
another member. When that transaction carries the partition's offset, the
new owner cannot read on meanwhile: a read_committed consumer's fetch of the
committed offsets waits for a pending transactional offset commit, and then
starts where the old owner's transaction left it. So every worker
transaction that writes for a partition sends that partition's offset, even
when it did not move (``dueflow.consumers.recorder.Recorder.cut``). Without
the offset, the new owner reads from the older offset at once and runs the
records again while the old transaction is still open.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from dueflow.config import Settings
from dueflow.kafka.clients import (
    make_admin,
    make_consumer,
    make_producer,
    make_transactional_producer,
)
from dueflow.kafka.group_config import worker_consumer_config
from tests.conftest import KafkaCluster
from tests.integration.worker_support import wait_for

HOLD_S = 3.0  # how long the old owner's transaction stays open after it leaves


def consumer(settings: Settings, group: str, topic: str) -> Consumer:
    c = make_consumer(settings, group, **worker_consumer_config(settings.worker))
    c.subscribe([topic])
    return c


def first_record(c: Consumer, timeout_s: float = 30.0) -> tuple[int, float]:
    """The offset of the first record ``c`` gets, and when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = c.poll(0.1)
        if msg is not None and msg.error() is None:
            return int(msg.offset() or 0), time.monotonic()
    raise AssertionError(f"no record within {timeout_s} s")


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
@pytest.mark.parametrize("with_offsets", [True, False])
def test_a_new_owner_waits_for_the_old_owners_open_offset_commit(
    kafka: KafkaCluster, prefix: str, protocol: str, with_offsets: bool
) -> None:
    settings = kafka.settings(
        prefix, worker={"group_protocol": protocol, "session_timeout_ms": 6000}
    )
    topic, out = f"{prefix}.fence.in", f"{prefix}.fence.out"
    admin = make_admin(settings)
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (topic, out)]).values():
        f.result(30)
    p = make_producer(settings)
    for i in range(10):
        p.produce(topic, f"r{i}".encode())
    assert p.flush(30) == 0
    group = f"{prefix}.g"

    # The old owner: reads, then writes in a transaction that sends offset 5 (or
    # not), and leaves the group before the transaction ends.
    old = consumer(settings, group, topic)
    assert first_record(old)[0] == 0
    txn = make_transactional_producer(settings, f"{prefix}.txn.{uuid.uuid4().hex}")
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(out, b"outcome of offsets 0-4")
    if with_offsets:
        txn.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 5)], old.consumer_group_metadata(), 30
        )
    assert txn.flush(30) == 0
    old.close()

    committed: dict[str, Any] = {}

    def commit_later() -> None:
        time.sleep(HOLD_S)
        txn.commit_transaction(30)
        committed["at"] = time.monotonic()

    closer = threading.Thread(target=commit_later, daemon=True)
    new = consumer(settings, group, topic)
    try:
        closer.start()
        offset, at = first_record(new)
        closer.join(HOLD_S + 30)
        wait_for("the old owner's commit", lambda: "at" in committed, 10)
    finally:
        new.close()
    if with_offsets:
        # it waited for the old transaction, then started where that left off
        assert (offset, at >= committed["at"]) == (5, True)
    else:
        # nothing to wait for: it read the old records again while they were open
        assert (offset, at < committed["at"]) == (0, True)
