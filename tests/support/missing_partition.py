"""A consumer whose partition answers "missing" for a while, the way librdkafka
answers while the partition's leader is down; its metadata says whether the topic
exists, which is how dueflow tells that apart from a topic that does not exist."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition


class _Topic:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error


class _Metadata:
    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics


class MissingPartition:
    """``get_watermark_offsets`` raises ``_UNKNOWN_PARTITION`` ``missing`` times, then
    answers ``bounds``; ``list_topics`` names the topic when ``exists``."""

    def __init__(self, missing: int, *, exists: bool, bounds: tuple[int, int] = (3, 17)) -> None:
        self.missing = missing
        self.exists = exists
        self.bounds = bounds
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        self.asked += 1
        if self.asked <= self.missing:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return self.bounds

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        if self.exists:
            return _Metadata({topic: _Topic(None)})
        return _Metadata({topic: _Topic(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))})
