from __future__ import annotations

from dueflow.config import load_settings
from dueflow.kafka.topic_admin import TopicState, compare
from dueflow.kafka.topics import tier_label, topic_layout


def _by_name(specs: list) -> dict:  # type: ignore[type-arg]
    return {s.name: s for s in specs}


def test_layout_has_every_topic_of_the_design() -> None:
    s = load_settings(env={}, overrides={"queues": "billing:12,default:3", "topic_prefix": "df"})
    specs = _by_name(topic_layout(s))
    assert set(specs) == {
        "df.timers",
        "df.emitter.lease",
        "df.emitter.cron",
        "df.schedules",
        "df.outcomes",
        "df.quarantine",
        "df.control",
        "df.queues",
        "df.clock",
        "df.exec.billing",
        "df.retry.billing.1s",
        "df.retry.billing.10s",
        "df.retry.billing.1m",
        "df.dlq.billing",
        "df.idempotency.billing",
        "df.steering.billing",
        "df.exec.default",
        "df.retry.default.1s",
        "df.retry.default.10s",
        "df.retry.default.1m",
        "df.dlq.default",
        "df.idempotency.default",
        "df.steering.default",
    }
    timers = specs["df.timers"]
    assert timers.partitions == s.wheel.total_partitions == 260
    assert timers.config["retention.ms"] == "-1"  # no pending timer can expire
    assert timers.config["cleanup.policy"] == "delete"
    assert "retention.ms" in timers.critical
    assert specs["df.emitter.lease"].partitions == 1
    assert specs["df.schedules"].config["cleanup.policy"] == "compact"
    assert specs["df.queues"].partitions == 1  # the registry: one ordered log
    assert specs["df.queues"].config["cleanup.policy"] == "compact"
    # co-partitioning: every topic of a queue has the exec topic's partition count
    for q, p in (("billing", 12), ("default", 3)):
        for name in (
            f"df.exec.{q}",
            f"df.retry.{q}.1s",
            f"df.dlq.{q}",
            f"df.idempotency.{q}",
            f"df.steering.{q}",
        ):
            assert specs[name].partitions == p
        assert specs[f"df.idempotency.{q}"].config["cleanup.policy"] == "compact,delete"
        # the state of a steered job lives as long as its timers: never time-deleted
        steering = specs[f"df.steering.{q}"]
        assert steering.config["cleanup.policy"] == "compact"
        assert "retention.ms" not in steering.config
        assert "cleanup.policy" in steering.critical


def test_tier_labels() -> None:
    assert [tier_label(x) for x in (1000, 10_000, 60_000, 1500, 3_600_000)] == [
        "1s",
        "10s",
        "1m",
        "1500ms",
        "1h",
    ]


def test_compare_reports_partition_and_policy_differences() -> None:
    s = load_settings(env={})
    spec = _by_name(topic_layout(s))["dueflow.idempotency.default"]
    state = TopicState(
        spec.name, 3, {"cleanup.policy": "delete", "retention.ms": spec.config["retention.ms"]}
    )
    diffs = compare(spec, state)
    assert {(d.what, d.critical) for d in diffs} == {("partitions", True), ("cleanup.policy", True)}
    same = TopicState(spec.name, spec.partitions, {"cleanup.policy": "delete,compact"})
    assert compare(spec, same) == []  # policy order does not matter
