"""A faust transport whose consumer reads committed records only.

faust makes its consumer ``read_committed`` only with
``processing_guarantee="exactly_once"``, and that mode is not usable: its
per-partition transactional producers crash with "Can't send messages while
not in transaction" as soon as a table changes (faust-streaming issues #177,
#323, #136; reproduced here against Kafka 4.1 with aiokafka 0.14). The status
view therefore runs ``at_least_once`` (table changes are idempotent: a
replayed outcome folds to the same view) and uses this transport, which sets
the isolation level of faust's aiokafka consumer to ``read_committed`` so
outcomes written inside aborted emitter or worker transactions never show.

The records of one topic can go to a handler a fetched list at a time instead
of through faust's streams (:func:`hand_over_batches`: the status view folds
its outcomes so, a few microseconds a record instead of tens), acknowledged
once the handler returns. The consumer also hands every other record to the
streams without the four
tasks faust makes per record (``wait_first`` of the delivery, the flow
suspension, stop and crash: most of the view's CPU per outcome). A delivery
that completes at once (the stream's buffer has room) is simply run; one that
has to wait, or any delivery while the flow is suspended, goes through
``wait_first`` as before (:func:`deliver`).
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka keeps the setting here until start() builds its fetcher.
        if not hasattr(consumer, "_isolation_level"):
            raise RuntimeError(
                "this aiokafka version has no _isolation_level: "
                "the status view cannot make its consumer read_committed"
            )
        consumer._isolation_level = "read_committed"
        return consumer


@types.coroutine
def _rest(coro: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """The rest of ``coro``, which was run up to its first suspension (it yielded
    ``pending``, a future or None, to whoever runs it: now the task running this)."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # a cancellation or an error thrown into the task
            try:
                pending = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _finish(coro: Coroutine[Any, Any, Any], pending: Any) -> Any:
    return await _rest(coro, pending)


async def deliver(consumer: Any, delivery: Awaitable[Any]) -> None:
    """Run ``delivery`` (a record handed to the streams) as faust's ``_drain_messages``
    does, ``wait_first(delivery, suspend_flow.wait())``, without its tasks when the
    delivery completes at once and nothing stops the flow."""
    if isinstance(delivery, types.CoroutineType) and not (
        consumer.suspend_flow.is_set() or consumer._stopped.is_set() or consumer._crashed.is_set()
    ):
        try:
            pending = delivery.send(None)
        except StopIteration:
            return
        delivery = _finish(delivery, pending)
    await consumer.wait_first(delivery, consumer.suspend_flow.wait())


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _hand_over(self, messages: list[Any]) -> None:
        """Give ``messages`` (records of the batch topic) to its handler, then
        acknowledge them, as a stream does once it has handled them. While the flow is
        suspended (a rebalance) they are dropped, as faust drops a delivery then: the
        rebalance seeks to the committed offsets, so they are read again."""
        batches: Batches = self.transport.batches  # type: ignore[attr-defined]
        if self.suspend_flow.is_set() or self._stopped.is_set() or self._crashed.is_set():
            return
        unacked = self._unacked_messages
        for message in messages:
            unacked.add(message)
        await batches.handler(messages)
        ack = self.ack
        for message in messages:
            ack(message)

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover
        # faust-streaming 0.15's Consumer._drain_messages, the delivery through
        # deliver() instead of wait_first (its gap and commit bookkeeping unchanged).
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        fetching = faust_consumer.CONSUMER_FETCHING
        yield_every = 100
        num_since_yield = 0
        sleep = asyncio.sleep
        batches: Batches | None = getattr(self.transport, "batches", None)
        batch_topic = None if batches is None else batches.topic
        batch_max = 1 if batches is None else batches.max_records
        batch: list[Any] = []
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(fetching)
                ait = getmany(timeout=1.0)
                await self.sleep(0)
                if not self.should_stop:
                    async for tp, message in ait:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await sleep(0)
                            num_since_yield = 0
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is None or offset >= r_offset:
                            gap = offset - (r_offset or 0)
                            if gap > 1 and r_offset and acks_enabled_for(message.topic):
                                await self._add_gap(tp, r_offset + 1, offset)
                            if commit_every is not None and self._n_acked >= commit_every:
                                self._n_acked = 0
                                await self.commit()
                            if message.topic == batch_topic:
                                batch.append(message)
                                if len(batch) >= batch_max:
                                    await self._hand_over(batch)
                                    batch = []
                            else:
                                await deliver(self, callback(message))
                            set_read_offset(tp, offset)
                    if batch:
                        await self._hand_over(batch)
                        batch = []
                    unset_flag(fetching)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(fetching)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer
    batches: Batches | None = None


@dataclass(frozen=True)
class Batches:
    """The records of ``topic`` go to ``handler`` in lists of up to ``max_records``
    (those one fetch returned), not to the streams."""

    topic: str
    handler: Callable[[list[Any]], Awaitable[None]]
    max_records: int


def hand_over_batches(
    app: Any, topic: str, handler: Callable[[list[Any]], Awaitable[None]], *, max_records: int
) -> None:
    """Have ``app``'s consumer give the records of ``topic`` to ``handler`` in lists
    (faust's Message objects: ``key``, ``value``, ``headers``, ``partition``,
    ``offset``, bytes as read) and acknowledge each list once ``handler`` returns.
    An agent must still consume ``topic``: faust subscribes to it and assigns its
    partitions (and its tables') for that agent, whose stream then stays empty."""
    app.transport.batches = Batches(topic, handler, max_records)


def install(app: Any) -> None:
    """Make ``app`` consume read_committed (call right after creating it)."""
    app.transport = ReadCommittedTransport(app.conf.broker_consumer, app)
    # faust's services log their lifecycle under their module's name, which is
    # this dueflow module: keep that chatter out of dueflow's INFO stream.
    logging.getLogger(__name__).setLevel(logging.WARNING)
