"""The emitter's timer consumer goes on where a pause said, whatever a fetch in flight
did meanwhile: it pauses a partition first and seeks it while paused."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from dueflow.config import load_settings
from dueflow.streams.emitter.wheel_source import WheelSource


class RecordingConsumer:
    """What the fetcher was asked, in order: (call, partition, offset)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def seek(self, tp: TopicPartition) -> None:
        self.calls.append(("seek", tp.partition, tp.offset))

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls.extend(("pause", tp.partition, tp.offset) for tp in tps)

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls.extend(("resume", tp.partition, tp.offset) for tp in tps)


def source(consumer: Any) -> WheelSource:
    s = WheelSource(load_settings(env={}, overrides={"topic_prefix": "t"}))
    s._consumer = consumer
    return s


def test_a_partition_is_sought_to_its_next_offset_only_once_paused() -> None:
    consumer = RecordingConsumer()
    s = source(consumer)
    s.pause(2, 7)
    s.resume(2)
    # a seek before the pause lets a fetch sent in between move the position past 7
    assert [(c[0], c[1]) for c in consumer.calls] == [("pause", 2), ("seek", 2), ("resume", 2)]
    assert ("seek", 2, 7) in consumer.calls


def test_a_held_partition_is_not_sought() -> None:
    consumer = RecordingConsumer()
    s = source(consumer)
    s.hold(3)  # goes on after what it delivered: the drainer keeps those records
    s.resume(3)
    assert [c[0] for c in consumer.calls] == ["pause", "resume"]
