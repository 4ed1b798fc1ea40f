"""Tail the control topic: which queues an operator paused.

One assign-only, read_committed consumer per worker process reads
``<prefix>.control`` (compacted, one partition) from the beginning and
keeps tailing it. Every change of a queue's state is handed to
``on_change(queue, paused)`` on the event loop. :meth:`ControlTail.caught_up`
waits until everything written before now is applied, so a worker that
starts while its queue is paused starts no job of it. A record that is no
command is quarantined, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from dueflow import reasons
from dueflow.config import Settings
from dueflow.consumers.polling import ConsumerThread
from dueflow.consumers.quarantine import Quarantine
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.records.pause_command import QueueControl, decode_control

_LOG = logging.getLogger("dueflow.worker.control")


class ControlTail:
    """The paused queues, as the control topic says."""

    def __init__(
        self,
        settings: Settings,
        *,
        quarantine: Quarantine,
        on_change: Callable[[str, bool], None],
        group: str,
    ) -> None:
        self._settings = settings
        self._topic = names(settings).control
        self._quarantine = quarantine
        self._on_change = on_change
        self._group = group
        self.paused: dict[str, QueueControl] = {}
        self._reached = -1
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._thread: ConsumerThread | None = None

    def start(self) -> None:
        consumer = make_consumer(
            self._settings,
            self._group,  # assign-only: never joined, nothing committed
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 250},
        )
        self._thread = ConsumerThread(
            consumer, name="dueflow-control", batch_size=500, on_batch=self._apply
        )
        tp = TopicPartition(self._topic, 0, OFFSET_BEGINNING)
        self._thread.post(lambda c: c.assign([tp]))
        self._thread.start()

    def is_paused(self, queue: str) -> bool:
        return queue in self.paused

    async def caught_up(self, timeout_s: float = 30.0, *, retry_s: float = 0.2) -> bool:
        """Wait until the commands written before now are applied; False on timeout
        (the topic missing or the broker not answering: the worker goes on).

        A partition without a known leader yet (the topic just created, a leader
        moving) is asked again every ``retry_s`` until ``timeout_s``: giving up at
        once let a worker that started beside a fresh control topic start jobs of
        a queue paused before it."""
        assert self._thread is not None
        thread = self._thread
        tp = TopicPartition(self._topic, 0)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                low, high = await asyncio.wait_for(
                    thread.call(lambda c: c.get_watermark_offsets(tp, timeout=10, cached=False)),
                    max(0.0, left),
                )
                break
            except KafkaException as exc:
                if _leaderless(exc) and left > retry_s:
                    await asyncio.sleep(retry_s)
                    continue
                event(_LOG, "control topic not read", logging.WARNING, error=str(exc))
                return False
            except TimeoutError as exc:
                event(_LOG, "control topic not read", logging.WARNING, error=str(exc))
                return False
        if high <= low or self._reached >= high:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((high, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            event(_LOG, "control topic not read in time", logging.WARNING, topic=self._topic)
            return False
        return True

    def _apply(self, msgs: list[Any]) -> None:
        """A batch of control records (on the loop)."""
        assert self._thread is not None
        self._thread.batch_taken()
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._reached = max(self._reached, msg.offset())
                else:
                    event(_LOG, "control tail error", logging.WARNING, error=str(err))
                continue
            self._reached = max(self._reached, msg.offset() + 1)
            try:
                control = decode_control(msg.key(), msg.value())
            except UndecodableRecord as exc:
                why = (
                    reasons.FIELD_OUT_OF_RANGE
                    if isinstance(exc, FieldOutOfRange)
                    else reasons.BAD_CONTROL
                )
                self._quarantine.put(msg, reasons.with_detail(why, exc))
                continue
            if control is not None:
                self._set(control)
        if self._waiters:
            keep = []
            for target, fut in self._waiters:
                if fut.done():
                    continue
                if self._reached >= target:
                    fut.set_result(None)
                else:
                    keep.append((target, fut))
            self._waiters = keep

    def _set(self, control: QueueControl) -> None:
        was = control.queue in self.paused
        if control.paused:
            self.paused[control.queue] = control
        else:
            self.paused.pop(control.queue, None)
        if was != control.paused:
            event(
                _LOG,
                "queue paused" if control.paused else "queue resumed",
                queue=control.queue,
                by=control.by,
                reason=control.reason,
            )
            self._on_change(control.queue, control.paused)

    async def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            await self._thread.wait_closed()
            self._thread = None
        for _target, fut in self._waiters:
            with contextlib.suppress(asyncio.InvalidStateError):
                fut.cancel()


# The partition has no leader the client knows of yet: it will, in moments.
# (A missing topic is not waited for: the worker goes on, as the docstring says.)
_LEADERLESS = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def _leaderless(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in _LEADERLESS
