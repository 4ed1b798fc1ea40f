"""Tail the idempotency partitions this process owns into their key stores.

One assign-only, read_committed consumer per queue reads partition p of
``<prefix>.idempotency.<queue>`` for every exec partition p the process
owns: first up to its end (loading), then on (tailing), so states written
later (a producer's ``cancel()``, a ``reschedule()``'s record, which goes to
the store's reschedules: :mod:`dueflow.records.reschedule`) are seen. A store
is kept ("parked") when
its partition is revoked, and reused without reloading when the partition
comes back in the next assignment, which is what an eager rebalance does
most of the time.

:meth:`KeyTail.caught_up` answers "is everything that was committed to
partition p before now in the store?": it reads the partition's last stable
offset (a read_committed consumer's high watermark), waits until that has
reached the partition's high watermark (a decided transaction's markers land
partition by partition: the previous owner's offset commit can be visible
before its idempotency records are, :mod:`dueflow.consumers.stable_end`) and
then until the tail has read that far. The worker asks it when the first
record of an exec or retry partition arrives, which is after the group's
committed offsets for that partition are stable (KIP-447), so it also waits
for the transaction of a fenced previous owner to finish; and before a
redriven record, whose key's tombstone the redrive wrote in the same
transaction.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import Settings
from dueflow.consumers.polling import ConsumerThread
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.stable_end import StableEnd
from dueflow.consumers.store import KeyStore, StoreFactory, is_final, state_of
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.kafka.clients import make_consumer
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records import reschedule
from dueflow.records.worker_codec import decode_key_record, decode_key_state

_LOG = logging.getLogger("dueflow.worker.keys")


class KeyTail:
    """The key stores of one queue and the consumer that keeps them current."""

    def __init__(
        self,
        settings: Settings,
        *,
        topic: str,
        queue: str,
        retention_ms: int,
        stores: StoreFactory,
        quarantine: Quarantine,
        group: str,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._topic = topic
        self._end = StableEnd(settings, queue=queue, store="keys", metrics=metrics, logger=_LOG)
        self._retention = retention_ms
        self._stores = stores
        self._quarantine = quarantine
        self._group = group
        self._owned: dict[int, KeyStore] = {}
        self._parked: dict[int, KeyStore] = {}
        self._reached: dict[int, int] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._thread: ConsumerThread | None = None

    def start(self) -> None:
        """Create the consumer and its thread (on the event loop)."""
        consumer = make_consumer(
            self._settings,
            # assign-only: the group id is never joined and nothing is committed
            f"{self._group}.keys",
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 100},
        )
        self._thread = ConsumerThread(
            consumer, name=f"dueflow-keys-{self._topic}", batch_size=2_000, on_batch=self._apply
        )
        self._thread.start()
        self._end.start()

    # ------------------------------------------------------------------ ownership

    def attach(self, partition: int) -> KeyStore:
        """The store of ``partition`` (parked or new); tailing starts if it is new."""
        store = self._owned.get(partition)
        if store is not None:
            return store
        store = self._parked.pop(partition, None)
        if store is None:
            store = self._stores(self._topic, partition, self._retention)
            start = store.next_offset if store.next_offset is not None else OFFSET_BEGINNING
            self._reached.pop(partition, None)
            if store.next_offset is not None:
                self._reached[partition] = store.next_offset
            assert self._thread is not None
            tp = TopicPartition(self._topic, partition, start)
            self._thread.post(lambda c: c.incremental_assign([tp]))
        self._owned[partition] = store
        return store

    def park(self, partition: int) -> None:
        """``partition`` was revoked: keep its store current in case it comes back."""
        store = self._owned.pop(partition, None)
        if store is not None:
            self._parked[partition] = store

    def drop_parked(self) -> None:
        """Forget parked stores (their partitions went to another member)."""
        for partition in list(self._parked):
            self._drop(self._parked.pop(partition), partition)

    def drop(self, partition: int) -> None:
        store = self._owned.pop(partition, None)
        if store is None:
            store = self._parked.pop(partition, None)
        if store is not None:
            self._drop(store, partition)

    def _drop(self, store: KeyStore, partition: int) -> None:
        assert self._thread is not None
        tp = TopicPartition(self._topic, partition)
        self._thread.post(lambda c: c.incremental_unassign([tp]))
        self._reached.pop(partition, None)
        for p, _target, fut in self._waiters:
            if p == partition and not fut.done():
                fut.cancel()
        store.close()

    def store(self, partition: int) -> KeyStore | None:
        return self._owned.get(partition)

    @property
    def keys(self) -> int:
        return sum(len(s) for s in self._owned.values())

    def expire(self, now_ms: int) -> int:
        return sum(s.expire(now_ms) for s in [*self._owned.values(), *self._parked.values()])

    # ------------------------------------------------------------------ catching up

    async def caught_up(self, partition: int) -> None:
        """Wait until the store of ``partition`` holds everything committed before now."""
        tp = TopicPartition(self._topic, partition)
        low, stable = await self._end.low_and_stable(tp)
        stable = await self._end.reached(tp, stable)
        if stable <= low or self._reached.get(partition, -1) >= stable:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((partition, stable, fut))
        await fut

    # ------------------------------------------------------------------ records

    def _apply(self, msgs: list[Any]) -> None:
        """Apply a batch (on the loop)."""
        assert self._thread is not None
        self._thread.batch_taken()
        by_partition: dict[int, list[tuple[bytes, int | None, int]]] = {}
        reschedules: dict[int, list[tuple[bytes, int, int]]] = {}
        positions: dict[int, int] = {}
        stores = {**self._parked, **self._owned}
        # Keys a tombstone of this batch forgets: their later records are news.
        cleared: set[tuple[int, bytes]] = set()
        for msg in msgs:
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    positions[partition] = max(positions.get(partition, -1), msg.offset())
                else:
                    event(_LOG, "key tail error", logging.WARNING, error=str(err))
                continue
            positions[partition] = max(positions.get(partition, -1), msg.offset() + 1)
            key = msg.key()
            if key is None:
                self._quarantine.put(msg, reasons.IDEMPOTENCY_WITHOUT_KEY)
                continue
            value = msg.value()
            records = by_partition.setdefault(partition, [])
            if value is None:  # a tombstone forgets the key (a redrive clears `dead`)
                records.append((key, None, 0))
                cleared.add((partition, key))
                continue
            about = reschedule.key_of(key)
            if about is not None:  # a reschedule of key `about` (dueflow.records.reschedule)
                try:
                    _state, at_ms, due_ms = decode_key_record(value, _schema(msg))
                    if due_ms is None:
                        raise UndecodableRecord("a reschedule record without run_only_due_ms")
                except UndecodableRecord as exc:
                    self._quarantine.put(msg, _why(exc))
                    continue
                reschedules.setdefault(partition, []).append((about, due_ms, at_ms))
                continue
            store = stores.get(partition)
            if store is not None and (partition, key) not in cleared:
                known = store.get(key)
                if known is not None and is_final(known):
                    # Final already (most often: this worker's own record read back).
                    # Any final state means "skip it", so there is nothing to learn.
                    continue
            try:
                state, at_ms, attempts = decode_key_state(value, _schema(msg))
            except UndecodableRecord as exc:
                self._quarantine.put(msg, _why(exc))
                continue
            records.append((key, state_of(state, attempts), at_ms))
        for partition, position in positions.items():
            # (``is None``, not truthiness: an empty store is falsy)
            store = self._owned.get(partition)
            if store is None:
                store = self._parked.get(partition)
            if store is None:
                continue  # dropped meanwhile
            if partition in reschedules:
                store.reschedule(reschedules[partition])
            store.apply(by_partition.get(partition, ()), position)
            if position > self._reached.get(partition, -1):
                self._reached[partition] = position
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        keep = []
        for partition, target, fut in self._waiters:
            if fut.done():
                continue
            if self._reached.get(partition, -1) >= target:
                fut.set_result(None)
            else:
                keep.append((partition, target, fut))
        self._waiters = keep

    async def close(self) -> None:
        self._end.close()
        if self._thread is not None:
            self._thread.stop()
            await self._thread.wait_closed()
            self._thread = None
        for fut in (w[2] for w in self._waiters):
            fut.cancel()
        for store in [*self._owned.values(), *self._parked.values()]:
            store.close()
        self._owned.clear()
        self._parked.clear()


def _why(exc: UndecodableRecord) -> str:
    """The quarantine reason of an idempotency record that cannot be used."""
    if isinstance(exc, FieldOutOfRange):
        return reasons.with_detail(reasons.FIELD_OUT_OF_RANGE, exc)
    return reasons.with_detail(reasons.UNDECODABLE_IDEMPOTENCY, exc)


def _schema(msg: Any) -> bytes | None:
    return hdr.header(msg.headers(), hdr.SCHEMA)
