"""A queue's clients in the group: connected at start, and again after a restart.

A restart forgets all uncommitted work and rejoins the group: redelivery from
the committed offsets and the key store do the rest. It is decided where a
commit fails or a store cannot be read, and runs in a task of its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from dueflow import __version__
from dueflow.config import Settings
from dueflow.consumers.commit_loop import CommitLoop
from dueflow.consumers.committer import PASSING_START_ERRORS
from dueflow.consumers.feed_states import RuntimeEvent
from dueflow.consumers.intake import Intake
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.polling import GroupPoller
from dueflow.consumers.rebalance import RebalanceHandler
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.run_state import RunState
from dueflow.errors import DueflowError
from dueflow.kafka.blocking import ClientWedged
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.group_config import incremental, worker_consumer_config
from dueflow.observability.health import ClientStats
from dueflow.observability.logs import event
from dueflow.records.features import worker_client_id

_LOG = logging.getLogger("dueflow.worker")


def passing(exc: BaseException) -> bool:
    """A client error that says "not now" (retry), not "never"."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (
        err.retriable() or (err.code() in PASSING_START_ERRORS and not err.fatal())
    )


class GroupConnection:
    """One queue's consumer (through its poller) and transactional producer."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: str,
        group: str,
        topics: list[str],
        life: RunState,
        intake: Intake,
        recorder: BatchRecorder,
        commits: CommitLoop,
        doubt: MembershipDoubt,
        rebalance: RebalanceHandler,
        on_batch: Callable[[list[Any]], None],
    ) -> None:
        self._settings = settings
        self._ws = settings.worker
        self._queue = queue
        self._group = group
        self._topics = topics
        self._life = life
        self._intake = intake
        self._batch = recorder
        self._commits = commits
        self._doubt = doubt
        self._rebalance = rebalance
        self._on_batch = on_batch
        self._loop = asyncio.get_running_loop()
        self.group_stats = ClientStats()  # the consumer's statistics (readiness)
        self._consumer: Consumer | None = None

    async def _connect(self) -> None:
        ws = self._ws
        self.group_stats = ClientStats()
        self._consumer = make_consumer(
            self._settings,
            self._group,
            **{
                **worker_consumer_config(ws),
                **self.group_stats.client_config(),
                # `dueflow queue finalize` reads it: this worker applies commands
                "client.id": worker_client_id(__version__, socket.gethostname()),
                "error_cb": self._doubt.on_client_error,
                # A fetch returns with its first record: a steering command
                # acknowledged within worker.steering_margin_ms of the due time of a
                # job fired ahead of it wins only if it reaches the worker by then.
                "fetch.wait.max.ms": 100,
                "queued.max.messages.kbytes": 32_768,
            },
        )
        rebalance = self._rebalance
        poller = GroupPoller(
            self._consumer,
            self._topics,
            batch_size=ws.fetch_batch,
            on_batch=self._on_batch,
            on_assign=rebalance.on_assign,
            on_revoke=rebalance.on_revoke,
            on_lost=rebalance.on_lost,
            name=f"dueflow-poll-{self._queue}",
            incremental=incremental(ws),
        )
        try:
            await self._commits.open(lambda: poller.group_metadata)
        except BaseException:
            self._consumer.close()  # never subscribed: closes at once
            raise
        self._intake.poller = poller
        poller.start()

    async def connect_until_up(self, *, first: bool) -> None:
        """Connect, again every second while the cluster is not ready for it (a
        broker restarting, a transaction coordinator moving or still loading:
        init_transactions times out or says COORDINATOR_LOAD_IN_PROGRESS). At the
        first start only such passing errors are retried; anything else (a
        refused authorization, bad settings) is raised to the caller."""
        while not self._life.closing:
            try:
                await self._connect()
                return
            except ClientWedged as exc:
                self._commits.abandon_producer()
                why = str(exc)
            except (KafkaException, DueflowError) as exc:
                if first and not passing(exc):
                    raise
                why = str(exc)
                await asyncio.sleep(1.0)
            event(
                _LOG,
                "worker start failed; again" if first else "worker reconnect failed",
                logging.WARNING,
                queue=self._queue,
                error=why,
            )

    async def restart(self, reason: str, since_ms: int | None = None) -> None:
        """Forget all uncommitted work and rejoin: redelivery and the key store do the rest.

        Called after :meth:`RunState.begin_restart` said yes.
        """
        doubt = {} if since_ms is None else {"in_doubt_since_ms": since_ms}
        event(
            _LOG,
            "worker restarting queue",
            logging.WARNING,
            queue=self._queue,
            reason=reason,
            **doubt,
        )
        self._intake.forget_all()
        self._batch.clear()
        poller = self._intake.poller
        if poller is not None:
            poller.stop()
            await poller.wait_closed()
        await self._commits.close_producer()
        await self.connect_until_up(first=False)
        self._life.move(RuntimeEvent.RESTARTED)

    async def held(self) -> tuple[str, frozenset[tuple[str, int]]] | None:
        """The member id and the partitions its consumer holds; None without one."""
        poller = self._intake.poller
        return None if poller is None else await poller.held()

    def settled(self) -> bool:
        """Connected and running, and no rebalance callback under way."""
        poller = self._intake.poller
        return poller is not None and self._life.running and not poller.in_callback

    def rejoin(self, reason: str) -> None:
        """Leave the group and join it again, keeping the clients and the work done."""
        poller = self._intake.poller
        if poller is None or not self._life.running:
            return
        event(_LOG, "worker rejoining its group", logging.WARNING, queue=self._queue, reason=reason)
        poller.rejoin()

    def restart_soon(self, reason: str, *, since_ms: int | None = None) -> None:
        """Start over from the committed offsets, in a task of its own.

        ``since_ms``: the wall time the dropped work has been in doubt since (a
        wedged commit's start), logged with the restart.

        Never awaited where it is decided: a commit can fail inside a rebalance
        callback, whose consumer thread waits for the callback, while the
        restart waits for that thread to close its consumer.
        """
        if self._life.begin_restart():
            self._loop.create_task(self.restart(reason, since_ms))
