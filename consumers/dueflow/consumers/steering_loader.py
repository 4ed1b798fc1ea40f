"""Read partitions of ``<prefix>.steering.<queue>`` into their stores when they are assigned.

Only the owner of exec partition p writes steering partition p, so a worker
does not tail it: it reads ``[store.next_offset, last stable offset)`` once
per assignment of p (:meth:`SteeringLoader.catch_up`), at the same barrier as
the key store (the first records of the partition arrived: the group's
offsets are stable, a fenced previous owner's transaction is decided), and from
then on its own committed changes keep the store current. The records read
are applied at once at the end (:meth:`~dueflow.consumers.steering_store.SteeringStore.load`),
so the partition is judged only against a whole state.

A decided transaction is not yet readable everywhere: its markers are written
partition by partition, so the previous owner's command offsets can count as
committed while its steering records are still behind the last stable offset.
The read therefore first waits until the last stable offset has reached the
high watermark seen when it starts (:mod:`dueflow.consumers.stable_end`), and
reads to there; meanwhile the partition's records wait at the barrier.

A queue whose steering topic does not exist (a deployment that has not run
``dueflow topics ensure`` since upgrading) is reported, not fatal: its
partitions are marked unavailable and commands about their jobs are refused.
A partition whose leader is down answers as a missing one would: the topic's
metadata tells them apart, and such a partition is asked again until it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import Settings
from dueflow.consumers.polling import STORE_POLL_S, ConsumerThread
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.stable_end import StableEnd
from dueflow.consumers.steering_store import SteeringStore, decode_state_record
from dueflow.errors import UndecodableRecord
from dueflow.group_model import GroupState
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.reading import topic_exists
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records.group_state import decode_group_state, group_of
from dueflow.records.steering_state import Entry, store_key

# What an owner does with the groups a read found: (partition, group id -> state or
# None, whether the read started at the partition's start).
GroupsRead = Callable[[int, dict[str, GroupState | None], bool], None]

_LOG = logging.getLogger("dueflow.worker.steering")
_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION})
ASK_AGAIN_S = 0.5  # a partition of an existing topic that answers as missing: asked again
# The metadata's answers, in a row, that the topic does not exist before it counts as
# missing (a cluster that lost a node can answer from behind for a moment).
MISSING_AFTER = 3


@dataclass
class _Read:
    store: SteeringStore
    target: int
    reached: int
    done: asyncio.Future[None]
    staged: dict[bytes, Entry | None] = field(default_factory=dict)
    groups: dict[str, GroupState | None] = field(default_factory=dict)
    whole: bool = False  # read from the partition's start


class SteeringLoader:
    """One assign-only, read_committed consumer per queue that reads steering partitions
    to their end on request."""

    def __init__(
        self,
        settings: Settings,
        *,
        topic: str,
        queue: str,
        quarantine: Quarantine,
        group: str,
        metrics: Metrics,
        on_groups: GroupsRead | None = None,
        groups_unread: Callable[[int], bool] | None = None,
    ) -> None:
        self._settings = settings
        self._topic = topic
        self._end = StableEnd(settings, queue=queue, store="steering", metrics=metrics, logger=_LOG)
        self._quarantine = quarantine
        self._group = group
        self._reads: dict[int, _Read] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._thread: ConsumerThread | None = None
        self._reported_missing = False
        self._on_groups = on_groups
        # Whether this process never read a partition's groups: then the read starts
        # at the partition's start, whatever the store has read (a disk store's file).
        self._groups_unread = groups_unread

    def start(self) -> None:
        consumer = make_consumer(
            self._settings,
            f"{self._group}.steering",  # assign-only: never joined, nothing committed
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 100},
        )
        self._thread = ConsumerThread(
            consumer,
            name=f"dueflow-steering-{self._topic}",
            batch_size=2_000,
            on_batch=self._apply,
            poll_s=STORE_POLL_S,
        )
        self._thread.start()
        self._end.start()

    async def catch_up(self, partition: int, store: SteeringStore) -> bool:
        """Read partition ``partition`` from ``store.next_offset`` into ``store``, to its
        last stable offset once that has reached its high watermark (every transaction
        written to it before now has ended there); False when the topic does not exist
        (raises the client's error for anything else)."""
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:
            return await self._catch_up(partition, store)

    async def _catch_up(self, partition: int, store: SteeringStore) -> bool:
        thread = self._thread
        assert thread is not None
        tp = TopicPartition(self._topic, partition)
        # From now on the owner's own commits win over what the read finds: one that
        # lands after the end offset asked for next may not be read at all.
        store.begin_load()
        bounds = await self.bounds(tp)
        if bounds is None:
            if not self._reported_missing:
                self._reported_missing = True
                event(
                    _LOG,
                    "steering topic missing: commands are refused until it exists "
                    "(dueflow topics ensure)",
                    logging.WARNING,
                    topic=self._topic,
                )
            return False
        low, stable = bounds
        stable = await self._end.reached(tp, stable)
        if self._groups_unread is not None and self._groups_unread(partition):
            store.reset()
            store.begin_load()
        start = store.next_offset
        whole = start is None or start < low
        if start is None or start < low:  # new, or records it never read are gone
            if start is not None:
                store.reset()
                store.begin_load()
            start = low
        if start >= stable:
            store.load({}, max(start, stable))
            if self._on_groups is not None:
                self._on_groups(partition, {}, whole)
            return True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reads[partition] = _Read(store, target=stable, reached=start, done=done, whole=whole)
        thread.post(lambda c: c.incremental_assign([TopicPartition(self._topic, partition, start)]))
        try:
            await done
        finally:
            self._reads.pop(partition, None)
            thread.post(lambda c: c.incremental_unassign([tp]))
        return True

    async def bounds(
        self, tp: TopicPartition, retry_s: float = ASK_AGAIN_S
    ) -> tuple[int, int] | None:
        """``(low, last stable offset)`` of ``tp``; None when the topic does not exist.

        While a partition's leader is down the client answers as for a partition
        that does not exist; the metadata tells the two apart (:data:`MISSING_AFTER`
        answers in a row that the topic does not exist), and a partition of a topic
        that exists is asked again until it answers (refusing its commands meanwhile
        would let jobs cancelled or moved by them run).
        """
        thread = self._thread
        assert thread is not None
        absent = 0  # answers in a row that the topic does not exist
        while True:
            try:
                low, stable = await thread.call(
                    lambda c: c.get_watermark_offsets(tp, timeout=30, cached=False)
                )
                return int(low), int(stable)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not (isinstance(err, KafkaError) and err.code() in _MISSING):
                    raise
            if await thread.call(lambda c: topic_exists(c, tp.topic)):
                absent = 0
            else:
                absent += 1
                if absent >= MISSING_AFTER:
                    return None
            await asyncio.sleep(retry_s)

    def _apply(self, msgs: list[Any]) -> None:
        """A batch of steering records (on the loop)."""
        assert self._thread is not None
        self._thread.batch_taken()
        touched: set[int] = set()
        for msg in msgs:
            partition = msg.partition()
            read = self._reads.get(partition)
            if read is None:
                continue  # a read that ended: its last records were applied already
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    read.reached = max(read.reached, msg.offset())
                    touched.add(partition)
                else:
                    event(_LOG, "steering read error", logging.WARNING, error=str(err))
                continue
            offset = msg.offset()
            if offset < read.reached:
                continue  # fetched for an earlier read of the partition
            read.reached = offset + 1
            touched.add(partition)
            key = msg.key()
            job = store_key(key) if key is not None else None
            if job is None:
                group = group_of(key) if key is not None else None
                if group is not None:
                    self._stage_group(read, group, msg)
                continue
            try:
                read.staged[job] = decode_state_record(
                    msg.value(), hdr.header(msg.headers(), hdr.SCHEMA)
                )
            except UndecodableRecord as exc:
                self._quarantine.put(msg, reasons.with_detail(reasons.UNDECODABLE_STEERING, exc))
        for partition in touched:
            read = self._reads[partition]
            if read.reached >= read.target and not read.done.done():
                read.store.load(read.staged, read.reached)
                if self._on_groups is not None:
                    self._on_groups(partition, read.groups, read.whole)
                read.done.set_result(None)

    def _stage_group(self, read: _Read, group_id: str, msg: Any) -> None:
        value = msg.value()
        if value is None:
            read.groups[group_id] = None
            return
        try:
            read.groups[group_id] = decode_group_state(value, hdr.header(msg.headers(), hdr.SCHEMA))
        except UndecodableRecord as exc:
            self._quarantine.put(msg, reasons.with_detail(reasons.UNDECODABLE_STEERING, exc))

    async def close(self) -> None:
        self._end.close()
        if self._thread is not None:
            self._thread.stop()
            await self._thread.wait_closed()
            self._thread = None
        for read in self._reads.values():
            with contextlib.suppress(asyncio.InvalidStateError):
                read.done.cancel()
