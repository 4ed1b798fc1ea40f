"""One transactional producer of the outbox's ring, and the blocking calls made
on its own thread: commit a transaction, open the next one ahead, abort.

A lane has one transaction open at most. Its commit and its open-ahead (see
:mod:`~dueflow.streams.emitter.outbox`) run on the lane's thread, so the
emitter's loop keeps writing with the next lane meanwhile; a transaction that
fails is aborted there when it can be (:class:`TransactionAborted`). A lane
whose call does not return is abandoned, never touched again.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from confluent_kafka import KafkaException, Producer, TopicPartition

from dueflow.errors import KafkaOperationError
from dueflow.kafka.blocking import DaemonThreadExecutor, abandon
from dueflow.kafka.fatal import served
from dueflow.observability.logs import event
from dueflow.streams.emitter.fence import txn_error, wrap_txn_error

log = logging.getLogger("dueflow.emitter.outbox")

# An abort is a courtesy (the next fencing aborts what is open): waited for this long.
ABORT_S = 2.0

PartitionKey = tuple[str, int]  # (topic, partition)


class TransactionAborted(KafkaOperationError):
    """The open transaction failed and was aborted: re-read from the committed offsets."""


@dataclass(eq=False)
class Lane:
    """One transactional producer, its thread, and its open transaction."""

    txn_id: str
    spares_wanted: int
    calls: DaemonThreadExecutor | None = None
    producer: Producer | None = None
    spares: list[Producer] = field(default_factory=list)
    open: bool = False
    records: int = 0
    opened_ms: int = 0  # wall clock when its transaction was opened
    first_ms: int = 0  # wall clock of the transaction's first record
    ahead: PartitionKey | None = None  # partition whose offset opened the transaction
    # The open-ahead after its last commit (on its thread), and when it was asked.
    task: concurrent.futures.Future[None] | None = None
    task_at: float = 0.0

    def begin(self, clock_ms: Callable[[], int]) -> None:
        """Open a transaction (``clock_ms``: the session's clock, for its age)."""
        producer = self.producer
        assert producer is not None, "start() first"
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            raise wrap_txn_error("begin_transaction", exc) from exc
        self.open = True
        self.records = 0
        self.ahead = None
        self.opened_ms = clock_ms()

    def commit_then_open(
        self,
        commit: concurrent.futures.Future[int],
        offsets: list[TopicPartition],
        group_metadata: Any,
        ahead: TopicPartition | None,
        *,
        timeout_s: float,
        clock_ms: Callable[[], int],
    ) -> None:
        """On the lane's thread: commit (its outcome goes to ``commit``), then, if
        it committed and ``ahead`` is given, open the next transaction ahead."""
        try:
            done_ms = self._commit_blocking(offsets, group_metadata, timeout_s, clock_ms)
        except BaseException as exc:
            commit.set_exception(exc)
            return
        commit.set_result(done_ms)
        if ahead is not None:
            self._open_ahead_blocking(ahead, group_metadata, timeout_s, clock_ms)

    def _commit_blocking(
        self,
        offsets: list[TopicPartition],
        group_metadata: Any,
        timeout_s: float,
        clock_ms: Callable[[], int],
    ) -> int:
        producer = self.producer
        assert producer is not None
        # Retriable commit errors (a timeout, the coordinator moving) are retried
        # until the transaction timeout, not forever: a commit that cannot finish
        # (seen after broker restarts: the request never leaves the producer) must
        # not wedge the process. Giving up is safe: the next active period's
        # init_transactions settles it.
        deadline = time.monotonic() + timeout_s
        try:
            # No flush() first (to keep this transaction's records ahead of the
            # next one's in each partition): measured, it made the seen lateness
            # tail two to three times longer (p99 178-366 ms against 107-123 ms at
            # 5k timers/s); commit_transaction flushes anyway.
            if offsets:
                producer.send_offsets_to_transaction(
                    offsets, group_metadata, max(0.1, deadline - time.monotonic())
                )
            while True:
                try:
                    producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                    return clock_ms()
                except KafkaException as exc:
                    err = txn_error(exc)
                    if (
                        err is not None
                        and err.retriable()
                        and not err.txn_requires_abort()
                        and time.monotonic() < deadline
                    ):
                        continue
                    raise
        except KafkaException as exc:
            self._fail_blocking("commit_transaction", exc)

    def _open_ahead_blocking(
        self,
        offset: TopicPartition,
        group_metadata: Any,
        timeout_s: float,
        clock_ms: Callable[[], int],
    ) -> None:
        """Open the lane's next transaction and wait until it can take records."""
        producer = self.producer
        assert producer is not None
        if self.open:
            return
        self.begin(clock_ms)
        self.ahead = (offset.topic, offset.partition)
        try:
            producer.send_offsets_to_transaction([offset], group_metadata, timeout_s)
        except KafkaException as exc:
            self._fail_blocking("open the next transaction", exc)

    def _fail_blocking(self, what: str, exc: KafkaException) -> NoReturn:
        """A transaction failed (on the lane's thread): abort it if it can be, and raise."""
        self.open, self.records = False, 0
        err = txn_error(exc)
        if err is not None and err.txn_requires_abort() and not err.fatal():
            self._abort_blocking()
            raise TransactionAborted(f"transaction aborted: {exc}", cause=exc) from exc
        raise wrap_txn_error(what, exc) from exc

    def abort_if_open(self) -> None:
        """On the lane's thread: abort its open transaction, if any."""
        if self.open:
            self.open, self.records = False, 0
            self._abort_blocking()

    def _abort_blocking(self) -> None:
        producer = self.producer
        assert producer is not None
        try:
            producer.abort_transaction(ABORT_S)
        except KafkaException as exc:
            event(log, "abort failed", logging.WARNING, error=str(exc))

    def abandon(self) -> None:
        """Never touch a wedged producer again (destroying it would block too)."""
        if self.producer is None:
            return
        event(log, "transactional producer wedged: abandoned", logging.ERROR, id=self.txn_id)
        abandon(self.producer)
        self.producer = None
        self.open = False
        if self.calls is not None:
            self.calls.shutdown(wait=False)
            self.calls = None

    def close(self, *, abort: bool) -> None:
        """Flush and drop the producer (briefly when ``abort``), and stop the thread."""
        self.spares.clear()
        producer, self.producer = self.producer, None
        if producer is not None:
            try:
                served(producer.flush, 1.0 if abort else 10.0)
            except (KafkaException, SystemError) as exc:
                # A fenced producer raises: closing goes on. Its error callback raises
                # once per fatal error, and a second one inside the same flush reaches
                # Python as a SystemError (an exception already set).
                event(log, "producer close failed", logging.WARNING, error=str(exc))
        calls, self.calls = self.calls, None
        if calls is not None:
            calls.shutdown(wait=False)


def serve(producer: Producer, timeout_s: float) -> None:
    """``producer.poll``: a fatal error raises there too (fenced by a newer emitter
    after this one was stopped, a sequence out of order after a leader change), as
    :class:`FencedError` like every other call's (the session ends, not the process)."""
    try:
        served(producer.poll, timeout_s)
    except KafkaException as exc:
        raise wrap_txn_error("poll", exc) from exc
