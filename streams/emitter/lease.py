"""Leader election of emitters: a consumer group on the one-partition lease topic.

Every emitter process joins the group ``<prefix>.emitter`` subscribed to
``<prefix>.emitter.lease``. The member that holds partition 0 is the active
emitter; the others are hot standbys. The group coordinator does the election:
a member that stops heartbeating is removed after ``session.timeout.ms`` and
partition 0 moves to a standby. Cooperative-sticky assignment keeps partition
0 with its holder when standbys join or leave, so a new standby does not
interrupt the active emitter.

Holding the lease is not enough to write: the active emitter's transactional
producer (a fixed ``transactional.id``) fences any older holder that still runs.
"""

from __future__ import annotations

import logging
import os
import socket

from confluent_kafka import Consumer, TopicPartition

from dueflow.clients import make_consumer
from dueflow.config import Settings
from dueflow.logs import event
from dueflow.topics import names

log = logging.getLogger("dueflow.emitter.lease")


class Lease:
    """This process's membership in the emitter group; :meth:`poll` it often."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._names = names(settings)
        self._consumer: Consumer | None = None
        self._held = False
        self.acquisitions = 0

    @property
    def held(self) -> bool:
        """True while this process holds partition 0 of the lease topic."""
        return self._held

    def start(self) -> None:
        em = self._settings.emitter
        self._consumer = make_consumer(
            self._settings,
            self._names.emitter_group,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": em.session_timeout_ms,
                "heartbeat.interval.ms": em.heartbeat_interval_ms,
                # Names the active emitter in the group (status view, `dueflow status`).
                "client.id": f"dueflow-emitter-{socket.gethostname()}-{os.getpid()}",
            },
        )
        self._consumer.subscribe(
            [self._names.lease],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Serve group events (the callbacks run in here); return :attr:`held`."""
        if self._consumer is not None:
            self._consumer.poll(timeout_s)
        return self._held

    def close(self) -> None:
        """Leave the group at once, so a standby takes over without waiting."""
        consumer, self._consumer = self._consumer, None
        self._held = False
        if consumer is not None:
            consumer.close()

    # ---------------------------------------------------------------- callbacks
    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions) and not self._held:
            self._held = True
            self.acquisitions += 1
            event(log, "emitter lease acquired", lease=self._names.lease)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions) and self._held:
            self._held = False
            event(log, "emitter lease released", lease=self._names.lease)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions) and self._held:
            self._held = False
            event(log, "emitter lease lost", logging.WARNING, lease=self._names.lease)
