"""Read and write queues' feature records in the control topic (I/O edge of
:mod:`dueflow.records.features`)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError, UndecodableRecord
from dueflow.kafka.clients import make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.reading import Span, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names
from dueflow.records.features import (
    QueueFeatures,
    decode_features,
    encode_features,
    fold_features,
)


def read_queue_features(
    settings: Settings, consumer: Consumer, timeout_s: float = 30.0
) -> tuple[dict[str, QueueFeatures], list[str]]:
    """Every queue's features as the control topic says now, and the problems of
    ``features:`` records that are no such document."""
    topic = names(settings).control
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    found: list[QueueFeatures] = []
    problems: list[str] = []

    def take(msg: Any) -> None:
        try:
            features = decode_features(msg.key(), msg.value())
        except UndecodableRecord as exc:
            problems.append(f"{msg.partition()}:{msg.offset()}: {exc}")
            return
        if features is not None:
            found.append(features)

    read_spans(
        consumer,
        [Span(topic, p, low, high) for p, (low, high) in marks.items()],
        take,
        timeout_s=timeout_s,
    )
    return fold_features(found), problems


def write_queue_features(
    settings: Settings, features: QueueFeatures, timeout_s: float = 30.0
) -> None:
    """Write one features record and wait for the broker's acknowledgement."""
    key, value = encode_features(features)
    producer = make_producer(settings)
    errors: list[Any] = []
    producer.produce(
        names(settings).control, value, key, on_delivery=lambda err, _msg: errors.append(err)
    )
    left = served(producer.flush, timeout_s)
    if left or errors != [None]:
        raise KafkaOperationError(f"features record not written: {errors or 'timed out'}")
