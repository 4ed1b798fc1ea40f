"""TopicAdmin asks again for the configs of a topic a lagging broker does not know yet
(a cluster's brokers learn a new topic one after another)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource

from dueflow.errors import DueflowError
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import TopicSpec


class Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class LaggingAdmin:
    """describe_configs says UNKNOWN_TOPIC_OR_PART ``lag`` times per topic, then answers."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.asked: list[list[str]] = []

    def describe_configs(
        self, resources: list[ConfigResource], **_: Any
    ) -> dict[ConfigResource, Future[Any]]:
        self.asked.append([r.name for r in resources])
        out: dict[ConfigResource, Future[Any]] = {}
        for res in resources:
            fut: Future[Any] = Future()
            if sum(res.name in a for a in self.asked) <= self.lag:
                fut.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            else:
                fut.set_result({"cleanup.policy": Entry("compact")})
            out[res] = fut
        return out


def _specs() -> list[TopicSpec]:
    return [TopicSpec("p.a", "lease", 1, {}), TopicSpec("p.b", "lease", 1, {})]


def test_configs_of_a_topic_a_broker_does_not_know_yet_are_asked_again() -> None:
    admin = LaggingAdmin(lag=2)
    ta = TopicAdmin(admin, replication_factor=3, timeout_s=10)  # type: ignore[arg-type]
    got = ta._configs(_specs())
    assert got == {"p.a": {"cleanup.policy": "compact"}, "p.b": {"cleanup.policy": "compact"}}
    assert admin.asked == [["p.a", "p.b"]] * 3


def test_a_topic_still_unknown_at_the_timeout_is_an_error() -> None:
    ta = TopicAdmin(LaggingAdmin(lag=10**6), replication_factor=3, timeout_s=0.5)  # type: ignore[arg-type]
    with pytest.raises(DueflowError, match="describe configs of p"):
        ta._configs(_specs())


def test_the_set_aside_topics_get_headroom_over_the_largest_other_topic() -> None:
    from dueflow.config import load_settings
    from dueflow.kafka.topic_admin import TopicState, compare, with_headroom
    from dueflow.kafka.topics import SET_ASIDE_HEADROOM, topic_layout

    specs = with_headroom(topic_layout(load_settings(env={}, overrides={})), 2_000_000)
    wanted = {s.role: s.config.get("max.message.bytes") for s in specs}
    assert wanted["dlq"] == wanted["quarantine"] == str(2_000_000 + SET_ASIDE_HEADROOM)
    assert wanted["exec"] is None
    assert wanted["timers"] is None
    (dlq,) = [s for s in specs if s.role == "dlq"]
    state = TopicState(dlq.name, dlq.partitions, {**dlq.config, "max.message.bytes": "1048588"})
    (note,) = compare(dlq, state)
    assert (note.what, note.critical) == ("max.message.bytes", False)  # reported, not refused
    roomier = TopicState(dlq.name, dlq.partitions, {**dlq.config, "max.message.bytes": "9999999"})
    assert compare(dlq, roomier) == []  # more room is as good
