"""Whether a worker's member of its group may have been expelled without knowing it.

A member learns that the group expelled it (its session ran out while the
coordinator was unreachable, or while this process was stopped or starved)
only from its next heartbeat; until then it would go on starting jobs from
the records it holds, while the partitions' new owner runs them too. So after
a broker connection failure, or when the event loop finds it did not run for
a heartbeat interval, the queue starts nothing until a commit of offsets with
its current group metadata was accepted (the coordinator validates the member
and its epoch), or a rebalance told it what it owns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from dueflow.consumers.run_state import RunState
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")
ALIVE_EVERY_S = 0.1
# Consumer errors after which this member may have been expelled unawares.
_CONNECTION_LOST = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT})


class MembershipDoubt:
    """The doubt about one queue's group membership, and the watch for a stalled loop.

    ``on_doubt``: ask for a commit soon (its acceptance proves membership);
    ``on_confirmed``: start jobs again.
    """

    def __init__(
        self,
        *,
        queue: str,
        heartbeat_ms: int,
        life: RunState,
        on_doubt: Callable[[], None],
        on_confirmed: Callable[[], None],
    ) -> None:
        self._queue = queue
        self._life = life
        self._on_doubt = on_doubt
        self._on_confirmed = on_confirmed
        self._loop = asyncio.get_running_loop()
        self.in_doubt = False
        self.doubts = 0  # times doubt arose: a commit cut before the last one proves nothing
        self.alive_at = time.monotonic()
        self.stall_s = ALIVE_EVERY_S + max(1.0, heartbeat_ms / 1000)
        self._ticker: asyncio.TimerHandle | None = None

    def doubt(self, why: str) -> None:
        """This member may have lost its partitions without having been told yet:
        start nothing until a commit or a rebalance confirms it."""
        self.doubts += 1
        if self.in_doubt or self._life.closing:
            return
        self.in_doubt = True
        event(
            _LOG,
            "membership in doubt: starting nothing until confirmed",
            queue=self._queue,
            why=why,
        )
        self._on_doubt()

    def confirmed(self) -> None:
        """A commit was accepted, or the coordinator said what this member owns."""
        if not self.in_doubt:
            return
        self.in_doubt = False
        event(_LOG, "membership confirmed", queue=self._queue)
        self._on_confirmed()

    def alive(self) -> None:
        """Every 100 ms on the loop; a longer gap means this process did not run
        (stopped, starved) for long enough to have missed heartbeats."""
        now = time.monotonic()
        gap = now - self.alive_at
        self.alive_at = now
        if gap > self.stall_s:
            self.doubt(f"this process did not run for {gap:.1f} s")
        if self._ticker is not None:
            self._ticker.cancel()
        if not self._life.closed:
            self._ticker = self._loop.call_later(ALIVE_EVERY_S, self.alive)

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()

    def on_client_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (on the consumer's thread)."""
        if err.code() in _CONNECTION_LOST:
            self._loop.call_soon_threadsafe(self.doubt, f"consumer: {err.str()}")
