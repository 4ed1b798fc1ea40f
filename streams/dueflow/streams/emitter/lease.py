"""Leader election of emitters: a consumer group on the lease topic.

Every emitter process joins the group ``<prefix>.emitter`` subscribed to
``<prefix>.emitter.lease``, which has one partition per shard of the timer
topic (``wheel.shards``, 1 by default). The member that holds partition s is
the active emitter of shard s; a process may hold several, or none (a hot
standby). The group coordinator does the election: a member that stops
heartbeating is removed after ``session.timeout.ms`` and its partitions move
to the others. Cooperative-sticky assignment spreads the shards evenly over
the members and keeps each with its holder when members join or leave, so a
new standby interrupts at most the shards it is given (their holder commits
and hands them over in the revoke callback).

Holding a lease partition is not enough to write: firing in transactions, the
shard's transactional producers (fixed ``transactional.id``s per shard) fence
any older holder that still runs. Firing without them, the active emitter
commits its timer offsets through this membership (:meth:`Lease.commit`): the
group coordinator checks the member id and its generation (or, with the
consumer protocol, its epoch), so a holder the group dropped (stopped past its
session) cannot commit; it checks membership, not which partitions a member
holds, so a shard's active period ends inside the lease callback, before
librdkafka rejoins (tests/integration/test_lease_commit_fence.py).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.topics import names
from dueflow.observability.health import ClientStats
from dueflow.observability.logs import event

log = logging.getLogger("dueflow.emitter.lease")

# Told the outcome of an offset commit: None when accepted, else the error.
CommitDone = Callable[[KafkaError | None], None]


def _commit_key(offsets: list[TopicPartition]) -> frozenset[tuple[str, int, int]]:
    return frozenset((tp.topic, tp.partition, tp.offset) for tp in offsets)


class Lease:
    """This process's membership in the emitter group; :meth:`poll` it often."""

    def __init__(
        self,
        settings: Settings,
        *,
        on_release: Callable[[frozenset[int], bool], None] | None = None,
    ) -> None:
        self._settings = settings
        self._names = names(settings)
        self._shards = settings.wheel.shards
        self._consumer: Consumer | None = None
        self._held: set[int] = set()
        # Called inside poll() when shards go: (shards, lost). Revoked (a
        # rebalance): commit and hand over; lost (session expired): abort.
        self._on_release = on_release
        self.misfit: int | None = None  # a lease partition beyond wheel.shards
        self.acquisitions = 0
        # The consumer's statistics: is it a member of the emitter group (readiness)?
        self.stats = ClientStats()
        # Offset commits in flight: what each commits, and whom to tell.
        self._commits: list[tuple[frozenset[tuple[str, int, int]], CommitDone]] = []

    @property
    def held(self) -> frozenset[int]:
        """The shards (lease partitions) this process holds now."""
        return frozenset(self._held)

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
                **self.stats.client_config(),
                "on_commit": self._on_commit,
            },
        )
        self._consumer.subscribe(
            [self._names.lease],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def readiness(self) -> str | None:
        """None while this process is a member of the emitter group (standby or
        active) and connected to its coordinator; else why not."""
        if self._consumer is None:
            return "not in the emitter group"
        return self.stats.reason()

    def poll(self, timeout_s: float = 0.0) -> frozenset[int]:
        """Serve group events (the callbacks run in here); return :attr:`held`."""
        if self._consumer is not None:
            self._consumer.poll(timeout_s)
        return frozenset(self._held)

    def close(self) -> None:
        """Leave the group at once, so a standby takes over without waiting."""
        consumer, self._consumer = self._consumer, None
        self._held.clear()
        self._commits.clear()
        if consumer is not None:
            consumer.close()

    # ---------------------------------------------------------------- commits
    def commit(self, offsets: list[TopicPartition], done: CommitDone) -> None:
        """Commit ``offsets`` (of any topic) into the lease group with this member's
        current membership, asynchronously: ``done(error)`` is called from a
        later :meth:`poll` (error None: accepted, else the error)."""
        consumer = self._consumer
        if consumer is None:
            done(KafkaError(KafkaError._STATE, "the lease consumer is closed"))
            return
        self._commits.append((_commit_key(offsets), done))
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self.forget(done)
            done(exc.args[0] if exc.args else KafkaError(KafkaError._FAIL))

    def commit_now(self, offsets: list[TopicPartition]) -> bool:
        """Commit ``offsets`` and wait for the answer (a stopping emitter's last
        commit, also from inside the revoke callback); True when accepted."""
        consumer = self._consumer
        if not offsets:
            return True
        if consumer is None:
            return False
        try:
            got = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            event(log, "offset commit failed", logging.WARNING, error=str(exc))
            return False
        errors = {str(tp.error) for tp in got or [] if tp.error is not None}
        if errors:
            event(log, "offset commit failed", logging.WARNING, error=", ".join(sorted(errors)))
        return not errors

    def forget(self, done: CommitDone) -> None:
        """Tell ``done`` about no commit any more (its active period ended)."""
        self._commits = [c for c in self._commits if c[1] != done]

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit (served by ``poll``): told to whoever
        asked for exactly these offsets; an error nobody can be matched to fails
        the oldest commit in flight (failing is always safe: it is asked again)."""
        if err is None:
            err = next((tp.error for tp in partitions or [] if tp.error is not None), None)
        key = _commit_key(partitions or [])
        for i, (want, done) in enumerate(self._commits):
            if want == key:
                del self._commits[i]
                done(err)
                return
        if err is not None and self._commits:
            _, done = self._commits.pop(0)
            done(err)

    # ---------------------------------------------------------------- callbacks
    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.partition >= self._shards:
                self.misfit = tp.partition
                event(
                    log,
                    "emitter lease of an unknown shard",
                    logging.ERROR,
                    lease=self._names.lease,
                    partition=tp.partition,
                    shards=self._shards,
                )
            elif tp.partition not in self._held:
                self._held.add(tp.partition)
                self.acquisitions += 1
                event(log, "emitter lease acquired", lease=self._names.lease, shard=tp.partition)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, lost=False)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, lost=True)

    def _release(self, partitions: list[TopicPartition], *, lost: bool) -> None:
        gone = frozenset(tp.partition for tp in partitions if tp.partition in self._held)
        if not gone:
            return
        self._held -= gone
        for shard in sorted(gone):
            if lost:
                event(
                    log, "emitter lease lost", logging.WARNING, lease=self._names.lease, shard=shard
                )
            else:
                event(log, "emitter lease released", lease=self._names.lease, shard=shard)
        if self._on_release is not None:
            self._on_release(gone, lost)
