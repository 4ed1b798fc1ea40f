"""Faults of one node of a multi-node cluster: which node, and how to hit it.

``python -m benchmarks.chaos --cluster 3`` kills or pauses *the* node that
matters at that moment: the leader of a partition the emitter or the workers
use, the transaction coordinator of the active emitter's transactional id, or
the group coordinator of a worker group. The cluster itself is reached through
:class:`NodeControl`, a small protocol; :class:`ClusterNodes` adapts the local
cluster (``broker/dueflow/broker/cluster.py``) that ``ChaosCluster(nodes=3)`` starts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dueflow.broker.cluster import LocalCluster
from dueflow.errors import BrokerError


class NodeControl(Protocol):
    """A cluster whose nodes a fault may kill, pause and start again."""

    def node_ids(self) -> list[int]: ...

    def pid(self, node: int) -> int | None:
        """The node's process id while it runs (for the fault log)."""
        ...

    def kill(self, node: int) -> None:
        """kill -9."""
        ...

    def pause(self, node: int) -> None:
        """SIGSTOP."""
        ...

    def resume(self, node: int) -> None:
        """SIGCONT."""
        ...

    def start(self, node: int) -> None:
        """Start a stopped node on its data; returns when it answers."""
        ...

    def leader_of(self, topic: str, partition: int) -> int | None: ...

    def txn_coordinator(self, txn_id: str) -> int | None: ...

    def group_coordinator(self, group: str) -> int | None: ...

    def wait_recovered(self, node: int, timeout_s: float) -> bool:
        """Until ``node`` is in the ISR of every partition it replicates again and leads
        the partitions it is the preferred leader of (False: not within the timeout)."""
        ...


SORTS = ("partition", "transaction", "group")


@dataclass(frozen=True, slots=True)
class LeaderTarget:
    """What a node fault aims at: ``kind`` is ``partition``, ``transaction`` or ``group``."""

    kind: str
    name: str  # topic, transactional id or group
    partition: int = -1

    def describe(self) -> str:
        if self.kind == "partition":
            return f"leader of {self.name}/{self.partition}"
        if self.kind == "transaction":
            return f"transaction coordinator of {self.name}"
        return f"group coordinator of {self.name}"


def choose_target(
    rng: random.Random,
    *,
    partitions: Sequence[tuple[str, int]],
    transactional_ids: Sequence[str],
    groups: Sequence[str],
    sort: str | None = None,
) -> LeaderTarget:
    """One target, each of the three sorts equally likely, or of ``sort`` when it has
    candidates (pure: ``rng`` draws).

    ``partitions`` are ``(topic, partition count)`` of the exec and timer topics,
    ``transactional_ids`` the active emitter's, ``groups`` the worker groups (whose
    ``__consumer_offsets`` partition the workers commit to).
    """
    sorts = [
        s
        for s, have in (
            ("partition", partitions),
            ("transaction", transactional_ids),
            ("group", groups),
        )
        if have
    ]
    if not sorts:
        raise ValueError("choose_target: no partitions, transactional ids or groups given")
    sort = sort if sort in sorts else rng.choice(sorts)
    if sort == "partition":
        topic, count = rng.choice(list(partitions))
        return LeaderTarget("partition", topic, rng.randrange(count))
    if sort == "transaction":
        return LeaderTarget("transaction", rng.choice(list(transactional_ids)))
    return LeaderTarget("group", rng.choice(list(groups)))


def resolve(nodes: NodeControl, target: LeaderTarget) -> int | None:
    """The node that ``target`` names now; None when the cluster names none."""
    if target.kind == "partition":
        return nodes.leader_of(target.name, target.partition)
    if target.kind == "transaction":
        return nodes.txn_coordinator(target.name)
    return nodes.group_coordinator(target.name)


class ClusterNodes:
    """:class:`NodeControl` over a :class:`~dueflow.broker.cluster.LocalCluster`.

    A node started again answers (with all brokers in its metadata) before
    :meth:`start` returns; lookups answer None when the metadata does not say
    (then the driver picks any node)."""

    def __init__(self, cluster: LocalCluster, *, start_timeout_s: float = 180.0) -> None:
        self.cluster = cluster
        self.start_timeout_s = start_timeout_s

    def node_ids(self) -> list[int]:
        return self.cluster.node_ids()

    def pid(self, node: int) -> int | None:
        return self.cluster.pid(node)

    def kill(self, node: int) -> None:
        self.cluster.kill_node(node)

    def pause(self, node: int) -> None:
        self.cluster.pause_node(node)

    def resume(self, node: int) -> None:
        self.cluster.resume_node(node)

    def start(self, node: int) -> None:
        self.cluster.start_node(node, timeout_s=self.start_timeout_s)

    def leader_of(self, topic: str, partition: int) -> int | None:
        try:
            return self.cluster.leader_of(topic, partition)
        except BrokerError:
            return None

    def txn_coordinator(self, txn_id: str) -> int | None:
        try:
            return self.cluster.txn_coordinator(txn_id)
        except BrokerError:
            return None

    def group_coordinator(self, group: str) -> int | None:
        try:
            return self.cluster.group_coordinator(group)
        except BrokerError:
            return None

    def wait_recovered(self, node: int, timeout_s: float) -> bool:
        """Back in every ISR, then a preferred leader election: leadership returns now,
        inside the fault, rather than at the controller's next rebalance (a coordinator
        moving back is a disturbance of its own)."""
        deadline = time.monotonic() + timeout_s
        if not self.cluster.wait_in_sync(node, timeout_s=timeout_s):
            return False
        left = max(1.0, deadline - time.monotonic())
        return self.cluster.restore_preferred_leaders(timeout_s=left)
