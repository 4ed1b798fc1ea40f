"""The steering loader tells a missing steering topic from a partition whose leader is
down: the client answers both as a missing partition, and only the first may make the
worker refuse commands (a refused cancel lets its job run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from dueflow.config import load_settings
from dueflow.consumers.steering_loader import MISSING_AFTER, SteeringLoader
from dueflow.kafka.reading import topic_exists
from dueflow.observability.metrics import Metrics
from tests.support.missing_partition import MissingPartition

TOPIC = "t.steering.q"


class _Thread:
    """The loader's consumer thread, run inline."""

    def __init__(self, cluster: MissingPartition) -> None:
        self.cluster = cluster

    async def call(self, command: Callable[[Any], Any]) -> Any:
        return command(self.cluster)


def _loader(cluster: MissingPartition) -> SteeringLoader:
    loader = SteeringLoader(
        load_settings(env={}, overrides={"topic_prefix": "t"}),
        topic=TOPIC,
        queue="q",
        quarantine=None,  # type: ignore[arg-type]  # no record is read here
        group="t.worker.q",
        metrics=Metrics(),
    )
    loader._thread = _Thread(cluster)  # type: ignore[assignment]
    return loader


def test_a_partition_whose_leader_is_down_is_asked_again_until_it_answers() -> None:
    cluster = MissingPartition(missing=3, exists=True)
    bounds = asyncio.run(_loader(cluster).bounds(TopicPartition(TOPIC, 1), retry_s=0.01))
    assert bounds == (3, 17)
    assert cluster.asked == 4


def test_a_steering_topic_that_does_not_exist_is_reported_missing() -> None:
    cluster = MissingPartition(missing=10**6, exists=False)
    assert asyncio.run(_loader(cluster).bounds(TopicPartition(TOPIC, 1), retry_s=0.01)) is None
    assert cluster.asked == MISSING_AFTER  # the metadata said so that many times in a row


def test_topic_exists_reads_the_metadata() -> None:
    assert topic_exists(MissingPartition(0, exists=True), TOPIC) is True
    assert topic_exists(MissingPartition(0, exists=False), TOPIC) is False
