"""The committed timer offsets a takeover starts from: both groups, the newer
commit per partition, and a coordinator that moved asked again."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow.config import load_settings
from dueflow.rules.drain import Checkpoint
from dueflow.streams.emitter.wheel_source import WheelSource


class FakeConsumer:
    def __init__(self, offsets: dict[int, tuple[int, str | None]], failures: int = 0) -> None:
        self.offsets = offsets
        self.failures = failures
        self.asked = 0

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.asked += 1
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        out = []
        for tp in tps:
            off, meta = self.offsets.get(tp.partition, (-1001, None))
            if meta is None:
                out.append(TopicPartition(tp.topic, tp.partition, off))
            else:
                out.append(TopicPartition(tp.topic, tp.partition, off, meta))
        return out


def _source(txn: FakeConsumer, lease: FakeConsumer) -> WheelSource:
    source = WheelSource(load_settings(env={}))
    source._consumer = txn  # type: ignore[assignment]
    source._lease_reader = lease  # type: ignore[assignment]
    return source


def test_each_partition_goes_on_from_the_newer_commit_of_the_two_groups() -> None:
    txn = FakeConsumer({0: (5, "df1:9:100:0:7"), 1: (8, "df1:8")})
    lease = FakeConsumer({0: (7, "df1:7"), 2: (3, None)})
    got = _source(txn, lease).committed(range(4))
    assert got == {
        0: (7, Checkpoint(7)),  # the later one in the partition
        1: (8, Checkpoint(8)),  # only the transactional group has it
        2: (3, None),
        3: (-1, None),  # never committed
    }


def test_a_coordinator_that_moved_is_asked_again_within_the_timeout() -> None:
    lease: Any = FakeConsumer({0: (4, None)}, failures=2)
    got = _source(FakeConsumer({}), lease).committed(range(1), timeout_s=5.0)
    assert got == {0: (4, None)}
    assert lease.asked == 3
