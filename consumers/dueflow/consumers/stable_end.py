"""Waiting until a partition's last stable offset reaches its high watermark.

A read_committed consumer reads a partition up to its last stable offset
(LSO): the first offset of the oldest transaction on it that has no commit or
abort marker there yet. The transaction coordinator writes a transaction's
markers partition by partition once it has decided it, so for a moment an
owner's last transaction can be visible in one partition (its offset commit:
the records it covers count as done and are not read again) and not yet in
another (its steering or idempotency record: the LSO is still before it).
What was written to a partition before now is therefore readable once the
LSO has reached the high watermark seen now (:func:`wait_until_stable`):
normally at once, after a marker's round trip when a transaction was just
decided, and at most about a transaction timeout when a stopped producer left
one open that the broker aborts. :class:`StableEnd` does that for the
worker's key and steering stores, logs it and counts the time.

It asks the two ends of the worker process's shared pair of clients
(:mod:`dueflow.consumers.partition_ends`). After a failed ask (a leader moved)
the client that failed asks for the topic's metadata, then the end is asked
again on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.consumers.partition_ends import PartitionEnds, acquire
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics

FIRST_POLL_S = 0.005
MAX_POLL_S = 0.5
# The broker looks for transactions past their timeout every 10 s
# (transaction.abort.timed.out.transaction.cleanup.interval.ms), then writes markers.
ABORT_MARGIN_S = 15.0


def poll_delay(polls: int) -> float:
    """Seconds before poll number ``polls + 1`` (doubling from 5 ms, at most 0.5 s)."""
    return min(MAX_POLL_S, FIRST_POLL_S * float(2 ** min(polls, 16)))


def stable_bound_s(transaction_timeout_ms: int) -> float:
    """How long an open transaction can hold a partition's LSO back before something
    is wrong: the producers' transaction timeout, then the broker's abort of it."""
    return transaction_timeout_ms / 1000 + ABORT_MARGIN_S


async def wait_until_stable(
    stable: Callable[[], Awaitable[int]],
    high: int,
    *,
    bound_s: float,
    on_late: Callable[[float, int], None],
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Ask ``stable()`` (the partition's LSO now) until it is at least ``high``; the
    LSO it reached. It never gives up: each time another ``bound_s`` has passed,
    ``on_late(seconds waited, LSO)`` says so, and it goes on waiting."""
    start = clock()
    late_at = start + bound_s
    polls = 0
    while True:
        offset = await stable()
        if offset >= high:
            return offset
        now = clock()
        if now >= late_at:
            on_late(now - start, offset)
            late_at = now + bound_s
        await sleep(poll_delay(polls))
        polls += 1


class StableEnd:
    """Where a worker's read of one of its stores' partitions ends: the LSO, once it has
    reached the high watermark. ``store`` names the store in logs and in
    ``dueflow_store_load_wait_seconds``: ``keys`` or ``steering``."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: str,
        store: str,
        metrics: Metrics,
        logger: logging.Logger,
    ) -> None:
        self._settings = settings
        self._queue = queue
        self._store = store
        self._waited = metrics.store_load_wait.labels(queue, store)
        self._log = logger
        self._ends: PartitionEnds | None = None
        # An open transaction holding a partition back longer than this is reported.
        self.bound_s = stable_bound_s(settings.worker.transaction_timeout_ms)

    def start(self) -> None:
        self._ends = acquire(self._settings)

    def close(self) -> None:
        ends, self._ends = self._ends, None
        if ends is not None:
            ends.release()

    async def reached(self, tp: TopicPartition, stable: int) -> int:
        """The LSO of ``tp`` once it is at the high watermark seen now (``stable``: its
        LSO just read). Raises RuntimeError once closed; a client's error (a leader
        moving) is asked again, however long it lasts."""
        high = await self._asked(tp, IsolationLevel.READ_UNCOMMITTED)
        waited = 0.0
        if stable < high:
            fields: dict[str, Any] = {
                "store": self._store,
                "queue": self._queue,
                "topic": tp.topic,
                "partition": tp.partition,
            }
            event(
                self._log,
                "store load waits for a transaction",
                stable_offset=stable,
                high_watermark=high,
                **fields,
            )
            started = time.monotonic()
            stable = await wait_until_stable(
                lambda: self._asked(tp, IsolationLevel.READ_COMMITTED),
                high,
                bound_s=self.bound_s,
                on_late=lambda waited_s, lso: event(
                    self._log,
                    "store load still waits for a transaction",
                    logging.WARNING,
                    stable_offset=lso,
                    high_watermark=high,
                    waited_s=round(waited_s, 1),
                    bound_s=self.bound_s,  # longer than a transaction lives
                    **fields,
                ),
            )
            waited = time.monotonic() - started
        self._waited.observe(waited)
        return stable

    async def low_and_stable(self, tp: TopicPartition) -> tuple[int, int]:
        """The partition's first offset and its LSO now, asked as :meth:`_asked` does.

        Asked of the process's pair of clients, not of the consumer that reads the
        partition: a broker answers one connection's requests in order, so on that
        consumer's connection the ask waits behind its fetch (a long poll of up to
        ``fetch.wait.max.ms``), and a partition's first record waited 50-270 ms for it."""
        return await self._asked_bounds(tp, IsolationLevel.READ_COMMITTED)

    async def _asked(self, tp: TopicPartition, isolation: IsolationLevel) -> int:
        """The partition's end for ``isolation`` (the LSO for READ_COMMITTED)."""
        return (await self._asked_bounds(tp, isolation))[1]

    async def _asked_bounds(self, tp: TopicPartition, isolation: IsolationLevel) -> tuple[int, int]:
        """The partition's first offset and its end for ``isolation``. A failed ask (a
        leader moved: FENCED_LEADER_EPOCH, NOT_LEADER, a timeout) is asked again after
        5 ms doubling to 0.5 s; each ``bound_s`` of failing is logged, and it goes on
        asking: a store is never loaded short of what was committed to it."""
        polls = 0
        started = time.monotonic()
        late_at = started + self.bound_s
        while True:
            try:
                return await self._shared().bounds(tp, isolation)
            except KafkaException as exc:
                now = time.monotonic()
                if now >= late_at:
                    event(
                        self._log,
                        "store load cannot read a partition's offsets",
                        logging.WARNING,
                        store=self._store,
                        queue=self._queue,
                        topic=tp.topic,
                        partition=tp.partition,
                        error=str(exc.args[0] if exc.args else exc),
                        waited_s=round(now - started, 1),
                    )
                    late_at = now + self.bound_s
                await self._refresh(tp, isolation)
            await asyncio.sleep(poll_delay(polls))
            polls += 1

    async def _refresh(self, tp: TopicPartition, isolation: IsolationLevel) -> None:
        """Ask for the topic's metadata again on the client that failed: a client that
        reads no partition of it does not learn by itself that a leader moved (it went
        on answering "unknown partition" after a node restart)."""
        await self._shared().refresh(tp.topic, isolation)

    def _shared(self) -> PartitionEnds:
        ends = self._ends
        if ends is None:
            raise RuntimeError(f"the {self._store} store's reader is closed")
        return ends
