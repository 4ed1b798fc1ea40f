"""Read and write queues' feature records in the control topic (I/O edge of
:mod:`dueflow.records.features`)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import make_producer
from dueflow.kafka.control_topic import read_control
from dueflow.kafka.fatal import served
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
    return read_control(settings, consumer, decode_features, fold_features, timeout_s)


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
