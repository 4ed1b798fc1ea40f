"""A consumer owned by one thread; the event loop talks to it by commands.

confluent-kafka serializes the calls on a client handle: a thread that calls
``pause()`` while another loops in ``consume()`` waits, and can starve. So
each consumer lives on one thread that does everything with it: it polls
with a short timeout, runs the commands the loop posted in between
(pause, resume, assign, watermark queries), and hands each batch of
records to the loop (at most two batches in transit; the loop keeps its own
per-partition backlog and pauses partitions for back pressure).

Rebalance callbacks run on that thread inside ``consume()``; each runs its
coroutine on the loop and waits for it (still serving commands meanwhile),
so a revoke finishes (drain, commit) before the group moves on, and batches
and callbacks reach the loop in the order they happened. The thread also
keeps the consumer's group metadata current for transactional offset
commits (``send_offsets_to_transaction``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")
_POLL_S = 0.05
# The steering reader's thread polls in shorter turns: a partition's first record waits
# for its answer to a command (a watermark query), and it is idle most of the time.
STORE_POLL_S = 0.01

T = TypeVar("T")
Command = Callable[[Consumer], Any]
Rebalance = Callable[[list[TopicPartition]], Coroutine[Any, Any, None]]


def read_batch(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Any]:
    """What the consumer has, waiting at most ``timeout_s`` for the first record.

    ``Consumer.consume(n, timeout)`` alone waits until it has ``n`` records or
    the whole timeout has passed, so below ``n`` records per timeout every
    record would wait up to ``timeout_s`` before its job could start.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    rest: list[Any] = consumer.consume(max_messages - 1, 0) if max_messages > 1 else []
    rest.insert(0, first)
    return rest


class ConsumerThread:
    """Owns ``consumer`` on a thread: polls, runs posted commands, hands batches over."""

    def __init__(
        self,
        consumer: Consumer,
        *,
        name: str,
        batch_size: int,
        on_batch: Callable[[list[Any]], None],
        poll_s: float = _POLL_S,
    ) -> None:
        self._consumer = consumer
        self._name = name
        self._batch = batch_size
        self._poll_s = poll_s  # the longest a posted command waits for a poll to end
        self._on_batch = on_batch
        self._loop = asyncio.get_running_loop()
        self._commands: SimpleQueue[tuple[Command, concurrent.futures.Future[Any] | None]] = (
            SimpleQueue()
        )
        # Run only between polls with no batch held back: see call_settled.
        self._settled: SimpleQueue[tuple[Command, concurrent.futures.Future[Any] | None]] = (
            SimpleQueue()
        )
        self._stop = threading.Event()
        self._leave = True
        self._handoff = threading.Semaphore(2)
        self._closed = asyncio.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ from the loop

    def post(self, command: Command) -> None:
        """Run ``command(consumer)`` on the consumer's thread soon (errors are logged)."""
        self._commands.put((command, None))

    async def call(self, command: Callable[[Consumer], T]) -> T:
        """Run ``command(consumer)`` on the consumer's thread and return its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._commands.put((command, future))
        return await asyncio.wrap_future(future)

    async def call_settled(self, command: Callable[[Consumer], T]) -> T:
        """As :meth:`call`, run where every record the consumer returned before has been
        handed to the loop: the answer reaches the loop after those batches."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._settled.put((command, future))
        return await asyncio.wrap_future(future)

    def batch_taken(self) -> None:
        """The loop took a batch: the thread may hand over another one."""
        self._handoff.release()

    def stop(self, *, leave: bool = True) -> None:
        """Stop polling; the thread then closes the consumer (leaving its group).

        ``leave=False``: the consumer is not closed, so the member keeps its
        partitions until its session times out; only for a process that exits
        right after (handler threads that cannot be stopped still run: the
        partitions must not move while they do).
        """
        self._leave = leave
        self._stop.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # ------------------------------------------------------------------ on the thread

    def setup(self, consumer: Consumer) -> None:
        """First thing the thread does (subscribe or assign)."""

    def _serve_commands(self, *, settled: bool = False) -> None:
        commands = self._settled if settled else self._commands
        while True:
            try:
                command, future = commands.get_nowait()
            except Empty:
                if settled:
                    settled = False
                    commands = self._commands
                    continue
                return
            try:
                result = command(self._consumer)
            except Exception as exc:
                if future is not None:
                    future.set_exception(exc)
                else:
                    event(_LOG, "consumer command failed", logging.DEBUG, error=repr(exc))
            else:
                if future is not None:
                    future.set_result(result)

    def run_on_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop and wait for it, serving commands meanwhile."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            try:
                future.result(timeout=self._poll_s)
                return
            except concurrent.futures.TimeoutError:
                self._serve_commands()
            except Exception as exc:
                event(_LOG, "rebalance callback failed", logging.ERROR, error=repr(exc))
                return

    def after_poll(self, consumer: Consumer) -> None:
        """Called on the thread after every poll."""

    def _main(self) -> None:
        consumer = self._consumer
        try:
            self.setup(consumer)
            while not self._stop.is_set():
                self._serve_commands(settled=True)
                try:
                    msgs = read_batch(consumer, self._batch, self._poll_s)
                except KafkaException as exc:
                    event(_LOG, "consume failed", logging.WARNING, error=str(exc))
                    continue
                self.after_poll(consumer)
                if not msgs:
                    continue
                while not self._handoff.acquire(timeout=self._poll_s):
                    self._serve_commands()
                    if self._stop.is_set():
                        break
                else:
                    self._loop.call_soon_threadsafe(self._on_batch, msgs)
            self._serve_commands()
        except RuntimeError:  # the loop closed under us: the process is exiting
            pass
        finally:
            # close() runs the final revoke callback on this thread, then leaves the group.
            if self._leave:
                with contextlib.suppress(Exception):
                    consumer.close()
            self._fail_pending()
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._closed.set)

    def _fail_pending(self) -> None:
        for commands in (self._commands, self._settled):
            while True:
                try:
                    _command, future = commands.get_nowait()
                except Empty:
                    break
                if future is not None and not future.done():
                    future.set_exception(RuntimeError(f"{self._name} is closed"))


async def settled_position(poller: ConsumerThread | None, tp: TopicPartition) -> int:
    """The consumer's position of ``tp``, read once every record it returned is on the
    loop (:meth:`ConsumerThread.call_settled`); -1 without a consumer."""
    if poller is None:
        return -1
    where = [TopicPartition(tp.topic, tp.partition)]
    positions = await poller.call_settled(lambda c: c.position(where))
    return int(positions[0].offset)


class GroupPoller(ConsumerThread):
    """The consumer-group member of one queue."""

    def __init__(
        self,
        consumer: Consumer,
        topics: Sequence[str],
        *,
        batch_size: int,
        on_batch: Callable[[list[Any]], None],
        on_assign: Rebalance,
        on_revoke: Rebalance,
        on_lost: Rebalance,
        name: str,
        incremental: bool = False,
    ) -> None:
        super().__init__(consumer, name=name, batch_size=batch_size, on_batch=on_batch)
        self._topics = list(topics)
        self._incremental = incremental
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        #: the group generation and member id, for send_offsets_to_transaction
        self.group_metadata: Any = None
        self.in_callback = False  # a rebalance callback runs (read from the loop)

    def setup(self, consumer: Consumer) -> None:
        self.group_metadata = consumer.consumer_group_metadata()
        consumer.subscribe(
            self._topics,
            on_assign=self._assigned,
            on_revoke=lambda c, parts: self._rebalance(c, self._on_revoke, parts),
            on_lost=lambda c, parts: self._rebalance(c, self._on_lost, parts),
        )

    async def held(self) -> tuple[str, frozenset[tuple[str, int]]] | None:
        """The member id and the partitions the consumer holds (None before it joined)."""

        def ask(consumer: Consumer) -> tuple[str, frozenset[tuple[str, int]]] | None:
            member = consumer.memberid()
            if not member:
                return None
            return member, frozenset((tp.topic, tp.partition) for tp in consumer.assignment())

        return await self.call(ask)

    def rejoin(self) -> None:
        """Leave the group and join it again (soon, on the consumer's thread): what the
        consumer holds is revoked through the usual callback, then assigned afresh."""

        def again(consumer: Consumer) -> None:
            consumer.unsubscribe()
            self.setup(consumer)

        self.post(again)

    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        """Take the partitions, fetching: librdkafka keeps an application's pause of a
        partition across revoke and assign, so one this member had paused when it
        lost it would never be fetched again. The runtime pauses what it must
        afterwards (its commands run after this resume)."""
        self.in_callback = True  # from the assign on: held() no longer says what ran
        try:
            if self._incremental:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)
            if parts:
                consumer.resume(parts)
        except BaseException:
            self.in_callback = False
            raise
        self._rebalance(consumer, self._on_assign, parts)

    def _rebalance(self, consumer: Consumer, callback: Rebalance, parts: list[Any]) -> None:
        self.in_callback = True
        try:
            self.group_metadata = consumer.consumer_group_metadata()
            self.run_on_loop(callback(parts))
            # A lost or revoked assignment may come with a new member epoch: offsets
            # sent from now on go with it.
            self.group_metadata = consumer.consumer_group_metadata()
        finally:
            self.in_callback = False

    def after_poll(self, consumer: Consumer) -> None:
        self.group_metadata = consumer.consumer_group_metadata()
