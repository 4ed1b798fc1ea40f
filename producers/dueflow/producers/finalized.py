"""Which queues a client steers with commands: those finalized (I/O edge).

``dueflow queue finalize`` writes a queue's features record to the control
topic (:mod:`dueflow.records.features`) once every live worker of the queue
applies commands. Until then a client cancels and reschedules with the
records of the release before (kept in the idempotency topic for the queue's
retention). A finalized queue stays finalized (one-way), so a yes is kept for
good and a no is asked again after ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from dueflow.config import Settings
from dueflow.errors import InvalidInput
from dueflow.kafka.features import read_queue_features
from dueflow.kafka.reading import ops_consumer


class Finalized(Protocol):
    def steerable(self, queue: str) -> bool:
        """Whether ``queue``'s jobs are steered with commands."""
        ...


class FinalizedQueues:
    """:class:`Finalized` read from the control topic."""

    def __init__(
        self,
        settings: Settings,
        *,
        ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._ttl = ttl_s
        self._clock = clock
        self._timeout = timeout_s
        self._yes: set[str] = set()
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def steerable(self, queue: str) -> bool:
        with self._lock:
            if queue in self._yes:
                return True
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._ttl:
                self._read_at = now
                self._yes.update(q for q, f in self._read().items() if f)
            return queue in self._yes

    def _read(self) -> dict[str, bool]:
        consumer = ops_consumer(self._settings)
        try:
            features, _problems = read_queue_features(self._settings, consumer, self._timeout)
        except InvalidInput:  # no control topic: nothing was ever finalized
            return {}
        finally:
            consumer.close()
        return {q: f.steerable for q, f in features.items()}


class AllFinalized:
    """Every queue is steered with commands (the in-memory pipeline: its workers do)."""

    def steerable(self, queue: str) -> bool:
        return True
