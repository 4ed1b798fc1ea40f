"""The worker groups' rebalance protocol and their broker-side settings.

Workers join their queue's group with the KIP-848 consumer protocol
(``group.protocol=consumer``, Kafka 4.0+) and the broker's ``range``
assignor. That assignor co-partitions (a member owns partition p of the exec
topic and of every retry tier, and so of the idempotency topic) and is
sticky: a rebalance moves only the partitions that change owner, and
members keep running everything else. With this protocol the session
timeout and heartbeat interval are not client settings but group configs
on the broker (``consumer.session.timeout.ms``,
``consumer.heartbeat.interval.ms``, within the broker's
``group.consumer.min/max.session.timeout.ms`` and heartbeat bounds), so a
worker sets them for its groups before it joins.

``worker.group_protocol = "classic"`` keeps the eager ``range`` protocol of
older brokers: every rebalance revokes every partition of every member.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from dueflow.config import WorkerSettings
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")


def incremental(ws: WorkerSettings) -> bool:
    """True when rebalances are incremental (only moved partitions are revoked)."""
    return ws.group_protocol == "consumer"


def worker_consumer_config(ws: WorkerSettings) -> dict[str, Any]:
    """Consumer settings of a queue's group member for the chosen protocol (pure)."""
    # A revoke waits for the revoked partitions' jobs (up to rebalance_grace_s);
    # the member must not be expelled meanwhile: this is also the KIP-848
    # rebalance timeout.
    poll_ms = max(300_000, int(ws.rebalance_grace_s * 1000) + 60_000)
    if incremental(ws):
        return {
            "group.protocol": "consumer",
            "group.remote.assignor": "range",
            "max.poll.interval.ms": poll_ms,
        }
    return {
        "group.protocol": "classic",
        "partition.assignment.strategy": "range",
        "session.timeout.ms": ws.session_timeout_ms,
        "heartbeat.interval.ms": ws.heartbeat_ms,
        "max.poll.interval.ms": poll_ms,
    }


def worker_group_configs(ws: WorkerSettings) -> dict[str, str]:
    """Broker-side configs of a worker group (KIP-848 only; pure)."""
    if not incremental(ws):
        return {}
    return {
        "consumer.session.timeout.ms": str(ws.session_timeout_ms),
        "consumer.heartbeat.interval.ms": str(ws.heartbeat_ms),
    }


def apply_group_configs(
    admin: AdminClient, groups: Iterable[str], configs: dict[str, str], *, timeout_s: float = 10.0
) -> list[str]:
    """Set ``configs`` on every group (incremental: other configs stay); the problems.

    A broker may refuse (a value outside its bounds, no ALTER_CONFIGS right on
    the group): the group then keeps the broker's defaults, which the
    returned problems name. Blocking; call it off the event loop.
    """
    if not configs:
        return []
    resources = []
    for group in groups:
        res = ConfigResource(ResourceType.GROUP, group)
        for name, value in configs.items():
            res.add_incremental_config(
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            )
        resources.append(res)
    problems = []
    try:
        futures = admin.incremental_alter_configs(resources, request_timeout=timeout_s)
    except KafkaException as exc:
        return [f"setting group configs {configs} failed: {exc}"]
    for res, future in futures.items():
        try:
            future.result(timeout_s)
        except (KafkaException, TimeoutError) as exc:
            problems.append(
                f"group {res.name}: could not set {configs} ({exc}); it keeps the broker's "
                "defaults (group.consumer.session.timeout.ms, 45 s unless changed)"
            )
    for problem in problems:
        event(_LOG, "worker group config not applied", logging.WARNING, problem=problem)
    return problems
