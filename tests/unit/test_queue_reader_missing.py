"""The queue registry reader tells a missing registry topic from a registry partition
whose leader is down: only the first means "the static queues only"."""

from __future__ import annotations

from dueflow.config import load_settings
from dueflow.kafka.queue_reader import QueueRegistryReader
from tests.support.missing_partition import MissingPartition


def _reader(cluster: MissingPartition) -> QueueRegistryReader:
    reader = QueueRegistryReader(load_settings(env={}, overrides={"topic_prefix": "t"}))
    reader._consumer = cluster  # type: ignore[assignment]
    return reader


def test_a_registry_partition_whose_leader_is_down_is_asked_again() -> None:
    cluster = MissingPartition(missing=3, exists=True, bounds=(0, 0))
    reader = _reader(cluster)
    assert reader.catch_up(timeout_s=5.0) is True
    assert cluster.asked == 4
    assert reader.missing is False


def test_a_registry_topic_that_does_not_exist_leaves_the_static_queues() -> None:
    cluster = MissingPartition(missing=10**6, exists=False)
    reader = _reader(cluster)
    assert reader.catch_up(timeout_s=5.0) is False
    assert cluster.asked == 1
    assert reader.missing is True


def test_a_leader_down_past_the_deadline_is_not_reported_as_a_missing_topic() -> None:
    cluster = MissingPartition(missing=10**6, exists=True)
    reader = _reader(cluster)
    assert reader.catch_up(timeout_s=0.3) is False
    assert cluster.asked >= 2
    assert reader.missing is False
