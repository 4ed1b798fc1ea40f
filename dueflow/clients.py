"""Factories for confluent-kafka clients with dueflow's defaults (I/O edge).

Every client dueflow creates goes through here, so security settings from
:class:`~dueflow.config.Settings` reach all of them and defaults live in one
place.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError

# The exec partition of a job is chosen by its key. murmur2 is the hash of
# Java's default partitioner, so every Kafka client agrees on it.
PARTITIONER = "murmur2_random"


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "compression.type": "lz4",
        "partitioner": PARTITIONER,
        "queue.buffering.max.messages": 500_000,
    }
    conf.update(extra)
    return settings.client_config(**conf)


def make_producer(settings: Settings, **extra: Any) -> Producer:
    """An idempotent producer (acks=all)."""
    return Producer(producer_config(settings, **extra))


def make_transactional_producer(
    settings: Settings, transactional_id: str, **extra: Any
) -> Producer:
    """A transactional producer; the caller runs ``init_transactions``."""
    return Producer(producer_config(settings, **{"transactional.id": transactional_id, **extra}))


def consumer_config(settings: Settings, group_id: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "range",
    }
    conf.update(extra)
    if conf.get("group.protocol") == "consumer":
        # KIP-848: the broker assigns (group.remote.assignor); librdkafka refuses this.
        del conf["partition.assignment.strategy"]
    return settings.client_config(**conf)


def make_consumer(settings: Settings, group_id: str, **extra: Any) -> Consumer:
    """A read_committed consumer with manual commits and range assignment."""
    return Consumer(consumer_config(settings, group_id, **extra))


def make_admin(settings: Settings, **extra: Any) -> AdminClient:
    return AdminClient(settings.client_config(**extra))


def kafka_error(what: str, exc: BaseException) -> KafkaOperationError:
    """Wrap a client exception, keeping the original and its retriability."""
    err = KafkaOperationError(f"{what}: {exc}", cause=exc)
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err.retriable = bool(exc.args[0].retriable())
    return err
