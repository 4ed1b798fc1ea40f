"""The sizes of dueflow.records.record_size are the ones the broker and librdkafka
enforce: a record of exactly the limit is taken, one byte more is refused."""

from __future__ import annotations

import os
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import NewTopic

from dueflow.kafka.clients import make_admin
from dueflow.records.record_size import PRODUCER_OVERHEAD, header_bytes, record_size
from tests.conftest import KafkaCluster

HEADERS: list[tuple[str, bytes | None]] = [
    ("df-due", b"1800000000000"),
    ("df-queue", b"default"),
    ("df-job", b"j" * 32),
]
KEY = b"k" * 40


def _topic(kafka: KafkaCluster, prefix: str, max_bytes: int) -> str:
    settings = kafka.settings(prefix)
    topic = f"{prefix}.sizes"
    admin = make_admin(settings)
    config = {"max.message.bytes": str(max_bytes)}
    for fut in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        fut.result()
    return topic


def _value_for(size: int) -> bytes:
    """Random bytes (lz4 cannot shrink them) making a record of exactly ``size`` bytes."""
    n = size - record_size(KEY, b"", HEADERS)
    while record_size(KEY, b"x" * n, HEADERS) > size:
        n -= 1
    assert record_size(KEY, b"x" * n, HEADERS) == size
    return os.urandom(n)


def _send(producer: Producer, topic: str, value: bytes) -> KafkaError | None:
    got: list[KafkaError | None] = []
    headers: Any = HEADERS
    producer.produce(topic, value, KEY, 0, headers=headers, on_delivery=lambda e, _m: got.append(e))
    assert producer.flush(30) == 0
    return got[0]


@pytest.mark.parametrize("limit", [20_000, 1_048_588])
@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_the_broker_takes_a_record_of_exactly_its_topic_limit(
    kafka: KafkaCluster, prefix: str, limit: int, compression: str
) -> None:
    topic = _topic(kafka, prefix, limit)
    producer = Producer(
        kafka.settings(prefix).client_config(
            **{"compression.type": compression, "message.max.bytes": 4 * limit, "linger.ms": 0}
        )
    )
    assert _send(producer, topic, _value_for(limit - 1)) is None
    assert _send(producer, topic, _value_for(limit)) is None
    refused = _send(producer, topic, _value_for(limit + 1))
    # lz4 sends the batch uncompressed when that is smaller, so the size counts as is
    assert refused is not None
    assert refused.code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_librdkafka_takes_a_record_of_exactly_its_message_max_bytes(
    kafka: KafkaCluster, prefix: str
) -> None:
    topic = _topic(kafka, prefix, 1_048_588)
    limit = 50_000
    producer = Producer(
        kafka.settings(prefix).client_config(**{"message.max.bytes": limit, "batch.size": 1_000})
    )
    fits = limit - PRODUCER_OVERHEAD - len(KEY) - header_bytes(HEADERS)
    assert _send(producer, topic, b"x" * fits) is None
    headers: Any = HEADERS
    with pytest.raises(KafkaException) as refused:
        producer.produce(topic, b"x" * (fits + 1), KEY, 0, headers=headers)
    assert refused.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
