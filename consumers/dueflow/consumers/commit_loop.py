"""When and how a queue's batch commits: the commit loop around the committer.

:class:`CommitLoop` cuts the batch every ``commit_interval_ms`` (or sooner,
when asked) and commits it in one transaction on its own thread
(:class:`~dueflow.consumers.committer.TransactionalCommitter`), never waiting
past the commit deadline: a commit that does not return is given up with its
producer, and the queue starts over from the committed offsets. An accepted
commit also proves that this member still owns its partitions
(:mod:`dueflow.consumers.membership`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from dueflow.config import Settings
from dueflow.consumers.committer import WEDGE_GRACE_S, CommitFailed, TransactionalCommitter
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.run_state import RunState
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor, abandon
from dueflow.kafka.group_config import incremental
from dueflow.kafka.topic_limits import is_too_large
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.wall_clock import wall_ms

_LOG = logging.getLogger("dueflow.worker")
_WEDGE_CHECK_S = 0.25  # how often a commit in progress is asked whether it is wedged


class CommitLoop:
    """Commits one queue's finished work, exactly once, on the transaction thread.

    ``every``: what else runs on the loop's ticks (gauges, expiries), as
    ``(seconds between, first after, call)``.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        queue: str,
        group: str,
        worker_id: str,
        life: RunState,
        feeds: dict[tuple[str, int], PartitionFeed],
        running: dict[bytes, Delivery],
        recorder: BatchRecorder,
        doubt: MembershipDoubt,
        soon: asyncio.Event,
        metrics: Metrics,
        stamp_now: Callable[[], int],
        restart_soon: Callable[..., None],
        read_limits: Callable[[], Awaitable[None]],
    ) -> None:
        ws = settings.worker
        self._settings = settings
        self._queue = queue
        self._group = group
        self._worker_id = worker_id
        self._incremental = incremental(ws)
        self._interval_s = ws.commit_interval_ms / 1000
        self._life = life
        self._feeds = feeds
        self._running = running
        self._batch = recorder
        self._doubt = doubt
        self.soon = soon  # set: commit now, not at the end of the interval
        self._lock = asyncio.Lock()
        self._metrics = metrics
        self._stamp_now = stamp_now
        self._restart_soon = restart_soon
        self._read_limits = read_limits
        self._loop = asyncio.get_running_loop()
        # Unique per process and queue; zombies are fenced by the group generation (KIP-447).
        self.txn_id = self._new_txn_id()
        self.committer: TransactionalCommitter | None = None
        self.txn_thread = DaemonThreadExecutor(f"dueflow-txn-{queue}")
        # A batch not committed this long after its cut is aborted (see
        # committer._still_ours): by then the member may have been expelled.
        self.window_s = max(1.0, (ws.session_timeout_ms - ws.heartbeat_ms) / 1000)
        # A commit that takes longer than this is given up (librdkafka can block
        # in send_offsets_to_transaction forever, see dueflow.kafka.blocking): the
        # producer is abandoned and the queue starts over from committed offsets.
        # A commit's own calls end by the transaction timeout (plus a bounded abort).
        self.deadline_s = max(5.0, ws.transaction_timeout_ms / 1000) + 7.0
        self._every: list[tuple[float, float, Callable[[], None]]] = []
        self._task: asyncio.Task[None] | None = None

    def every(self, seconds: float, call: Callable[[], None], *, first_after: float) -> None:
        """Call ``call`` on the loop's ticks, every ``seconds`` (the first time after
        ``first_after``); before :meth:`run`."""
        self._every.append((seconds, first_after, call))

    async def run(self) -> None:
        """Commit every interval, or when :attr:`soon` is set, until closed."""
        start = self._loop.time()
        due = [start + first for _every, first, _call in self._every]
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.soon.wait(), self._interval_s)
            self.soon.clear()
            if self._life.closed:
                return
            if not self._life.restarting:
                await self.commit_now(validate=self._doubt.in_doubt)
            now = self._loop.time()
            for i, (seconds, _first, call) in enumerate(self._every):
                if now >= due[i]:
                    due[i] = now + seconds
                    call()

    async def commit_now(self, *, validate: bool = False) -> bool:
        """Commit what finished so far in one transaction; False when it failed.

        ``validate``: also when nothing finished, send every partition's committed
        offset again: an accepted commit proves this member still owns them. A
        commit counts as proof only when it was cut after the last doubt arose.
        """
        async with self._lock:
            doubts = self._doubt.doubts
            self._batch.add_progress(self._running.values(), self._stamp_now())
            cut = self._batch.cut(list(self._feeds.values()), resend=validate)
            if cut is None:
                self._batch.flush_metrics()
                return True
            batch, finals, marks = cut
            batch.commit_by = time.monotonic() + self.window_s
            proof_only = not batch.records and not marks  # nothing of it is work
            assert self.committer is not None
            began_ms = wall_ms()
            try:
                await self.in_txn_thread(self.committer.commit, batch, wedged=self.committer.wedged)
            except ClientWedged as exc:
                self._metrics.worker_transactions.labels(self._queue, "failed").inc()
                self.abandon_producer()
                # What this commit held was in doubt from its start: another member
                # may have taken the partitions and run it again meanwhile.
                self._restart_soon(f"transactional producer wedged: {exc}", since_ms=began_ms)
                return False
            except CommitFailed as exc:
                self._metrics.worker_transactions.labels(self._queue, "failed").inc()
                await self._failed(exc, proof_only=proof_only)
                return False
            self._metrics.worker_transactions.labels(self._queue, "committed").inc()
            if batch.offsets and doubts == self._doubt.doubts:
                self._doubt.confirmed()
            self._batch.committed(finals, marks)
            self._batch.flush_metrics()
            return True

    async def _failed(self, exc: CommitFailed, *, proof_only: bool) -> None:
        """A commit failed: start over from the committed offsets, unless it only
        asked for proof of membership."""
        if proof_only and not exc.fatal:
            # Nothing to drop: stay in doubt and ask again. An expelled
            # member hears of it from the group (partitions lost) anyway.
            event(
                _LOG, "membership not confirmed", logging.WARNING, queue=self._queue, error=str(exc)
            )
            return
        if is_too_large(exc):
            # A record of the batch was refused as too large (a limit lowered
            # since the queue started): read the limits again, so that the
            # replayed jobs' records are measured against them.
            event(
                _LOG,
                "a record was refused as too large: limits read again",
                logging.WARNING,
                queue=self._queue,
            )
            await self._read_limits()
        self._restart_soon(str(exc))

    # ------------------------------------------------------------------ the producer

    async def open(self, group_metadata: Callable[[], Any]) -> None:
        """Start the transactional producer (resuming the last start when it timed
        out: never race it), its offsets bound to ``group_metadata``."""
        if self.committer is not None and self.committer.resumable:
            self.committer.bind(group_metadata)
        else:
            self.committer = TransactionalCommitter(
                self._settings,
                self.txn_id,
                group_metadata,
                queue=self._queue,
                incremental=self._incremental,
            )
        await self.in_txn_thread(self.committer.start)

    async def close_producer(self) -> None:
        if self.committer is not None:
            with contextlib.suppress(ClientWedged):
                await self.in_txn_thread(self.committer.close)

    def start(self) -> None:
        self._task = self._loop.create_task(self.run())

    async def stop(self) -> None:
        """The loop ends (the runtime is closed), then the producer and its thread."""
        self.soon.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.close_producer()
        self.txn_thread.shutdown(wait=False)

    async def in_txn_thread(
        self, fn: Any, *args: Any, wedged: Callable[[], bool] | None = None
    ) -> Any:
        """``fn(*args)`` on the transaction thread; :class:`ClientWedged` after the
        commit deadline, or as soon as ``wedged()`` says a call of it is stuck
        (asked every ``_WEDGE_CHECK_S``)."""
        future = self._loop.run_in_executor(self.txn_thread, fn, *args)
        name = getattr(fn, "__name__", repr(fn))
        deadline = self._loop.time() + self.deadline_s
        while True:
            left = deadline - self._loop.time()
            if left <= 0:
                future.cancel()
                raise ClientWedged(f"{name} did not return within {self.deadline_s:.0f} s")
            step = left if wedged is None else min(left, _WEDGE_CHECK_S)
            try:
                # shielded: a step that times out leaves the call running
                return await asyncio.wait_for(asyncio.shield(future), step)
            except TimeoutError:
                if wedged is not None and wedged():
                    future.cancel()
                    raise ClientWedged(
                        f"{name}: send_offsets_to_transaction ran past its timeout"
                        f" + {WEDGE_GRACE_S:.0f} s"
                    ) from None

    def abandon_producer(self) -> None:
        """Leave the wedged producer and its thread alone for good; use new ones.

        Its open transaction is aborted by the broker after the transaction
        timeout. Given up sooner than that (a wedged send_offsets_to_transaction),
        it could still commit if the call came back: only with offsets the
        group coordinator had accepted, and a pending offset commit makes every
        new owner of those partitions, this queue's next consumer included,
        wait for it (KIP-447) and then see its records. Offsets not yet sent go
        out with the old member's metadata, which the group refuses once that
        consumer has left, so the transaction aborts.
        """
        event(
            _LOG,
            "transactional producer wedged: abandoned",
            logging.ERROR,
            queue=self._queue,
            deadline_s=self.deadline_s,
        )
        abandon(self.committer)  # destroying it would block as well
        self.committer = None
        # The abandoned producer may still finish what it was doing (registering
        # its id): under the same id it would fence the next one mid-batch.
        self.txn_id = self._new_txn_id()
        self.txn_thread.shutdown(wait=False)
        self.txn_thread = DaemonThreadExecutor(f"dueflow-txn-{self._queue}")

    def _new_txn_id(self) -> str:
        return f"{self._group}.{self._worker_id}.{uuid.uuid4().hex[:8]}"
