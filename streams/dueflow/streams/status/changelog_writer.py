"""The jobs changelog's producer: librdkafka, one wait per batch (I/O edge).

The fold writes one changelog record per job a batch changed. Sent through
faust's table producer (aiokafka, pure Python, a future and a callback per
record on the event loop), those records cost the view more CPU than the fold
itself. :class:`ChangelogWriter` sends them with an idempotent librdkafka
producer instead (records of a partition stay in order through retries, so
the compacted changelog keeps each job's last view) and :meth:`stored` waits,
off the event loop, until every record sent so far is stored, then hands each
record's offset to the callback it was sent with, on the loop.

The fold awaits :meth:`stored` before faust acknowledges the batch's
outcomes, so a committed outcomes offset never runs ahead of the changelog
(faust flushes only its own producer before it commits).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import make_producer
from dueflow.observability.logs import event

log = logging.getLogger("dueflow.status")

FLUSH_STEP_S = 1.0  # one wait off the loop; repeated while records are in flight
CLOSE_FLUSH_S = 30.0

Stored = Callable[[int], None]  # called on the loop with the record's offset


def changelog_key(job_id: str) -> bytes:
    """The changelog key of ``job_id``: the JSON string faust's ``json`` key
    serializer writes (orjson: the same bytes), so records of this writer and of
    faust's producer compact together."""
    return orjson.dumps(job_id)


class ChangelogWriter:
    """Sends job views to the changelog ``topic`` (keys JSON strings, as faust's)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self._producer: Any = None
        self._reports: list[tuple[Stored, Any, int]] = []
        self._in_flight = 0
        self._lock = asyncio.Lock()
        # The flush running on a thread (one at a time: its thread runs the
        # delivery callbacks, which append to ``_reports``).
        self._flushing: asyncio.Future[int] | None = None

    def start(self) -> ChangelogWriter:
        if self._producer is None:
            self._producer = make_producer(
                self.settings,
                **{
                    "client.id": f"{self.topic}.writer",
                    "linger.ms": 20,  # :meth:`stored` sends at once: this only groups
                    "queue.buffering.max.messages": 1_000_000,
                },
            )
        return self

    def send(self, job_id: str, partition: int, value: bytes | None, then: Stored) -> None:
        """Send ``job_id``'s view (None: a tombstone); ``then(offset)`` once stored."""
        if self._producer is None:
            self.start()

        def delivered(err: Any, msg: Any) -> None:  # on the thread that flushes
            self._reports.append((then, err, -1 if err is not None else int(msg.offset())))

        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value,
                    changelog_key(job_id),
                    partition=partition,
                    on_delivery=delivered,
                )
                break
            except BufferError:  # a full local queue: let it drain (rare: batches are small)
                self._producer.poll(0.1)
        self._in_flight += 1

    @property
    def in_flight(self) -> int:
        """Records sent whose callbacks have not run yet."""
        return self._in_flight

    async def stored(self) -> None:
        """Wait until every record sent so far is stored; run their callbacks (on the
        loop, in the order the broker stored them). Raises
        :class:`~dueflow.errors.KafkaOperationError` when one could not be stored
        (after librdkafka's retries): the view stops, its file and offsets unchanged
        for what failed."""
        if self._producer is None:
            return
        loop = asyncio.get_running_loop()
        async with self._lock:
            while self._in_flight:
                if self._flushing is None or self._flushing.done():
                    self._flushing = loop.run_in_executor(None, self._producer.flush, FLUSH_STEP_S)
                # Shielded: a waiter cancelled (the view stopping) leaves the flush
                # to finish, and the next waiter waits for it, not for a second one.
                await asyncio.shield(self._flushing)
                # No thread runs callbacks now (only the flush does, one at a time).
                reports, self._reports = self._reports, []
                self._in_flight -= len(reports)
                failed = [err for _then, err, _offset in reports if err is not None]
                if failed:
                    raise KafkaOperationError(
                        f"writing the jobs changelog {self.topic}: {failed[0]} "
                        f"({len(failed)} records not stored)"
                    )
                for then, _err, offset in reports:
                    then(offset)

    def close(self) -> None:
        """Flush what is left (:data:`CLOSE_FLUSH_S` at most) and drop the producer;
        records still unsent then are logged (the view's next start folds their
        outcomes again: their offsets did not commit)."""
        if self._producer is not None:
            left = int(self._producer.flush(CLOSE_FLUSH_S))
            if left:
                event(log, "status.changelog_unsent", logging.WARNING, records=left)
            self._producer = None
