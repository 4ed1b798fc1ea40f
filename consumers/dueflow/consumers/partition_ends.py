"""A partition's ends asked of the broker, by the two clients one worker process shares.

The store loads of every queue of a worker ask a partition's high watermark
(a read_uncommitted consumer's latest offset) and its last stable offset (a
read_committed consumer's). Two consumers that join no group answer every such
ask of the process: :func:`acquire` hands out the process's pair for a
cluster (its client settings), counted, and the last :meth:`PartitionEnds.release`
closes it once no ask is in flight. An ask runs on a worker thread, so the
caller's event loop goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import make_consumer

ASK_TIMEOUT_S = 10.0
_GROUP = "dueflow-partition-ends"  # never joined: the consumers read no partition

_lock = threading.Lock()
_pairs: dict[str, PartitionEnds] = {}


def acquire(settings: Settings) -> PartitionEnds:
    """The process's pair of clients for ``settings``' cluster (made on first use)."""
    key = repr(sorted(settings.client_config().items()))
    with _lock:
        ends = _pairs.get(key)
        if ends is None or ends.closed:
            ends = _pairs[key] = PartitionEnds(settings, key)
        ends.users += 1
        return ends


class PartitionEnds:
    """Two consumers that join no group: the high watermark and the LSO of any
    partition. Made by :func:`acquire`; closed by the last :meth:`release`."""

    def __init__(self, settings: Settings, key: str) -> None:
        self._key = key
        self._clients: dict[IsolationLevel, Consumer] = {
            IsolationLevel.READ_UNCOMMITTED: make_consumer(
                settings, _GROUP, **{"isolation.level": "read_uncommitted"}
            ),
            IsolationLevel.READ_COMMITTED: make_consumer(settings, _GROUP),
        }
        self.users = 0
        self.closed = False
        self._asking = 0

    def release(self) -> None:
        with _lock:
            self.users -= 1
            if self.users > 0:
                return
            self.closed = True
            if _pairs.get(self._key) is self:
                del _pairs[self._key]
            idle = not self._asking
        if idle:
            self._close_clients()

    async def end(self, tp: TopicPartition, isolation: IsolationLevel) -> int:
        """The partition's end for ``isolation`` (the LSO for READ_COMMITTED); raises the
        client's KafkaException (a timeout too) and RuntimeError once closed."""
        return (await self.bounds(tp, isolation))[1]

    async def bounds(self, tp: TopicPartition, isolation: IsolationLevel) -> tuple[int, int]:
        """The partition's first offset and its end for ``isolation``; raises as
        :meth:`end`."""
        client = self._use(isolation)
        try:
            ends: tuple[int, int] | None = await asyncio.to_thread(
                client.get_watermark_offsets,
                TopicPartition(tp.topic, tp.partition),
                timeout=ASK_TIMEOUT_S,
                cached=False,
            )
        finally:
            self._done()
        if ends is None:
            raise KafkaException(f"no answer within {ASK_TIMEOUT_S:g} s")
        return int(ends[0]), int(ends[1])

    async def refresh(self, topic: str, isolation: IsolationLevel) -> None:
        """The topic's metadata asked again on the client of ``isolation``: a client that
        reads no partition of a topic does not learn by itself that a leader moved."""
        client = self._use(isolation)
        try:
            with contextlib.suppress(KafkaException):
                await asyncio.to_thread(client.list_topics, topic, timeout=ASK_TIMEOUT_S)
        finally:
            self._done()

    def _use(self, isolation: IsolationLevel) -> Consumer:
        with _lock:
            if self.closed:
                raise RuntimeError("the partition ends' clients are closed")
            self._asking += 1
            return self._clients[isolation]

    def _done(self) -> None:
        with _lock:
            self._asking -= 1
            idle = self.closed and not self._asking
        if idle:
            self._close_clients()

    def _close_clients(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            with contextlib.suppress(KafkaException, RuntimeError):
                client.close()
