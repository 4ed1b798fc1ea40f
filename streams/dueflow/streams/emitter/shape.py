"""Before an emitter joins: the timer and lease topics have the settings' shards.

A shard is a whole wheel of the timer topic plus one lease partition. An
emitter that counts fewer shards than the topics hold would be given lease
partitions it cannot drive, and their timers would wait; one that counts more
would wait for lease partitions that do not exist. Both are refused at start,
with what to change. Topics that do not exist yet are not checked (the
emitter waits for them as before).
"""

from __future__ import annotations

from confluent_kafka import KafkaException

from dueflow.config import Settings
from dueflow.errors import TopicMismatch
from dueflow.kafka.clients import kafka_error, make_admin
from dueflow.kafka.topics import names


def shape_problem(
    *, timer_partitions: int | None, lease_partitions: int | None, settings: Settings
) -> str | None:
    """What is wrong with the topics' partition counts for ``settings`` (pure)."""
    geo = settings.wheel
    n = names(settings)
    if timer_partitions is not None and timer_partitions != geo.total_partitions:
        held = timer_partitions / geo.shard_partitions
        return (
            f"topic {n.timers} has {timer_partitions} partitions ({held:g} shards of "
            f"{geo.shard_partitions}) but these settings need {geo.total_partitions} "
            f"(wheel.shards={geo.shards}): run every emitter with the wheel.shards the "
            "topic was made for, or grow it with `dueflow topics ensure`"
        )
    if lease_partitions is not None and lease_partitions != geo.shards:
        return (
            f"topic {n.lease} has {lease_partitions} partitions but wheel.shards is "
            f"{geo.shards}: one lease partition per shard (`dueflow topics ensure` adds them)"
        )
    return None


def check_topic_shape(settings: Settings, timeout_s: float = 15.0) -> None:
    """Raise :class:`TopicMismatch` when the topics do not have the settings' shards."""
    n = names(settings)
    admin = make_admin(settings)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise kafka_error("describe the timer and lease topics", exc) from exc

    def count(topic: str) -> int | None:
        found = md.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return len(found.partitions)

    problem = shape_problem(
        timer_partitions=count(n.timers), lease_partitions=count(n.lease), settings=settings
    )
    if problem is not None:
        raise TopicMismatch(problem)
