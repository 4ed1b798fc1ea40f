"""One Kafka transaction per commit batch (blocking; runs on its own thread).

A batch holds everything that finished since the last one: idempotency
records, outcome events, retry and DLQ records, and the consumer offsets up
to the lowest unfinished offset of each partition. It commits as one
transaction, with the offsets bound to the consumer group's generation
(``send_offsets_to_transaction`` with the consumer's group metadata,
KIP-447), so a member that lost its partitions cannot commit for them.

``send_offsets_to_transaction`` runs in calls of at most 5 s, called again
after a timeout; :meth:`TransactionalCommitter.wedged` says when one runs past
its timeout + 2 s, which librdkafka can do for good (#5456/#5511), so the
worker gives the producer up without waiting for the whole commit deadline.

A retriable commit error is retried; an abortable one aborts and replays
the same batch a few times (it is still this member's work while it owns
the partitions); anything else raises :class:`CommitFailed` and the caller
starts over from the committed offsets.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import make_transactional_producer
from dueflow.kafka.fatal import served
from dueflow.observability.logs import event

# (tag, topic, partition or -1 for the partitioner, key, value, headers); the tag
# is the caller's (the partition feed the record belongs to), ignored here.
OutRecord = tuple[Any, ...]

_REPLAYS = 3
_ABORT_S = 2.0  # the least an abort may take when the deadline has passed
# send_offsets_to_transaction's own timeout: a call that runs out of it (a slow
# coordinator, loading after a restart) is called again, which resumes it.
OFFSETS_TIMEOUT_S = 5.0
# A send_offsets_to_transaction still running this long after its own timeout is
# wedged (librdkafka #5456/#5511: it can ignore the timeout for good).
WEDGE_GRACE_S = 2.0
# KIP-848 error codes (not named in every confluent-kafka version).
_FENCED_MEMBER_EPOCH = getattr(KafkaError, "FENCED_MEMBER_EPOCH", 110)
_STALE_MEMBER_EPOCH = getattr(KafkaError, "STALE_MEMBER_EPOCH", 113)
_LOG = logging.getLogger("dueflow.worker.commit")
# Errors that say "not now" while a producer registers its transactional id:
# calling init_transactions again on the same producer resumes it.
PASSING_START_ERRORS = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
)


class CommitFailed(Exception):
    """The batch could not be committed; nothing of it is visible."""

    def __init__(self, message: str, *, fatal: bool, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.cause = cause


@dataclass(slots=True)
class Batch:
    records: list[OutRecord] = field(default_factory=list)
    offsets: list[TopicPartition] = field(default_factory=list)
    # Whether any partition the batch writes for has left this member since
    # (read on the transaction thread; a partition once gone stays gone).
    gone: Callable[[], bool] = lambda: False
    # Monotonic time after which the batch is not committed but aborted: its
    # member may have missed heartbeats for a session since the cut (stopped,
    # starved) and its partitions run elsewhere by now.
    commit_by: float = math.inf


def by_destination(records: list[OutRecord]) -> Iterable[list[OutRecord]]:
    """``records`` in runs of one topic and partition (-1: the partitioner's, by
    key), each run in the records' own order, the runs in the order of their
    first records.

    A batch lists a job's records together (its idempotency record, then its
    outcome, job after job); librdkafka appends a record at less cost when the
    previous one went to the same partition (measured: 1.3-1.4 against 1.6-2.1
    us a call for the idempotency records, 1.7 against 1.9-3.1 for the
    outcomes). The order that counts is kept: a partition's records, and the
    records of one key, stay in the order they were added.
    """
    runs: dict[tuple[str, int], list[OutRecord]] = {}
    for record in records:
        destination = (record[1], record[2])
        run = runs.get(destination)
        if run is None:
            runs[destination] = [record]
        else:
            run.append(record)
    return runs.values()


class TransactionalCommitter:
    """A transactional producer that commits :class:`Batch` es for one consumer."""

    def __init__(
        self,
        settings: Settings,
        transactional_id: str,
        group_metadata: Callable[[], Any],
        *,
        queue: str,
        incremental: bool = False,
    ) -> None:
        self._settings = settings
        self._txn_id = transactional_id
        self._group_metadata = group_metadata
        self._queue = queue
        self._incremental = incremental
        self._timeout_s = max(5.0, settings.worker.transaction_timeout_ms / 1000)
        self._producer: Producer | None = None
        self._started = False
        # Monotonic time after which the call now running counts as wedged.
        self._wedged_after = math.inf
        # (topic, partition) -> the offset its last committed transaction sent (read
        # on the transaction thread only: QueueRuntime.take_blocked).
        self.committed_offsets: dict[tuple[str, int], int] = {}

    def wedged(self) -> bool:
        """A ``send_offsets_to_transaction`` of this committer runs past its own
        timeout + ``WEDGE_GRACE_S``: it may never return (read from any thread)."""
        return time.monotonic() > self._wedged_after

    def bind(self, group_metadata: Callable[[], Any]) -> None:
        """Commit offsets for another consumer (the next one after a failed start)."""
        self._group_metadata = group_metadata

    @property
    def resumable(self) -> bool:
        """A start that failed in passing left its producer to be started again."""
        return self._producer is not None and not self._started

    def start(self) -> None:
        """Create the producer and register the transactional id (blocking).

        A start that times out (a coordinator loading or moving) keeps its
        producer: calling start again resumes the same registration, as
        librdkafka asks. A second producer would race the first one's
        registration, which goes on in the background, and the one that
        registers last fences the other in the middle of its work (a worker
        under load fenced itself that way and ran a batch twice)."""
        if self._producer is None:
            self._producer = make_transactional_producer(
                self._settings,
                self._txn_id,
                **{
                    "transaction.timeout.ms": self._settings.worker.transaction_timeout_ms,
                    "linger.ms": 2,
                },
            )
        try:
            self._producer.init_transactions(self._timeout_s)
        except KafkaException as exc:
            err = _error_of(exc)
            if (
                err is None
                or err.fatal()
                or not (err.retriable() or err.code() in PASSING_START_ERRORS)
            ):
                self.close()
            raise
        self._started = True

    def commit(self, batch: Batch) -> None:
        """Commit ``batch`` in one transaction or raise :class:`CommitFailed`.

        Every call of it (replays, aborts included) shares one deadline, the
        transaction timeout (an abort at least ``_ABORT_S``): a call that runs
        much longer is wedged (librdkafka #5456/#5511), not slow.
        """
        deadline = time.monotonic() + self._timeout_s
        for replay in range(_REPLAYS):
            if time.monotonic() >= deadline:
                break
            try:
                self._commit_once(batch, deadline)
                for tp in batch.offsets:
                    self.committed_offsets[(tp.topic, tp.partition)] = tp.offset
                return
            except _NotOurs as exc:
                event(_LOG, "transaction aborted", logging.WARNING, queue=self._queue, why=str(exc))
                self._abort(deadline)
                raise CommitFailed(f"not committed: {exc}", fatal=False) from exc
            except KafkaException as exc:
                err = _error_of(exc)
                if err is not None and err.fatal():
                    raise CommitFailed(
                        f"fatal transaction error: {err}", fatal=True, cause=exc
                    ) from exc
                abortable = err is not None and err.txn_requires_abort()
                event(
                    _LOG,
                    "transaction aborted",
                    logging.WARNING,
                    queue=self._queue,
                    error=str(exc),
                    replay=replay,
                )
                self._abort(deadline)
                if not abortable or _fenced(err, incremental=self._incremental):
                    raise CommitFailed(
                        f"transaction failed: {exc}", fatal=False, cause=exc
                    ) from exc
                if batch.gone():
                    # Replaying with a newer member epoch would commit for a
                    # partition another member owns now.
                    raise CommitFailed(
                        f"transaction failed and a partition of it was lost: {exc}",
                        fatal=False,
                        cause=exc,
                    ) from exc
                time.sleep(0.1 * (replay + 1))
        raise CommitFailed("transaction failed after replays", fatal=False)

    def _commit_once(self, batch: Batch, deadline: float) -> None:
        producer = self._producer
        assert producer is not None
        producer.begin_transaction()
        produce = producer.produce
        for run in by_destination(batch.records):
            for _tag, topic, partition, key, value, headers in run:
                while True:
                    try:
                        produce(topic, value, key, partition=partition, headers=headers)
                        break
                    except BufferError:
                        served(producer.poll, 0.01)
        if batch.offsets:
            # The metadata first, then the check: metadata of a new epoch comes
            # from a rejoin, which follows the lost callback that marks the
            # batch's partitions gone.
            metadata = self._group_metadata()
            _still_ours(batch)
            self._send_offsets(batch, metadata, deadline)
        _still_ours(batch)
        while True:
            try:
                producer.commit_transaction(_left(deadline))
                return
            except KafkaException as exc:
                err = _error_of(exc)
                if err is not None and err.retriable() and time.monotonic() < deadline:
                    continue
                raise

    def _send_offsets(self, batch: Batch, metadata: Any, deadline: float) -> None:
        """``send_offsets_to_transaction`` in calls of at most ``OFFSETS_TIMEOUT_S``;
        one that times out (a retriable error) is called again until ``deadline``
        (librdkafka resumes the request it has under way). :meth:`wedged` says when
        a call runs ``WEDGE_GRACE_S`` past its own timeout."""
        producer = self._producer
        assert producer is not None
        while True:
            timeout_s = min(OFFSETS_TIMEOUT_S, _left(deadline))
            self._wedged_after = time.monotonic() + timeout_s + WEDGE_GRACE_S
            try:
                producer.send_offsets_to_transaction(batch.offsets, metadata, timeout_s)
                return
            except KafkaException as exc:
                err = _error_of(exc)
                again = err is not None and err.retriable() and not err.txn_requires_abort()
                if not again or time.monotonic() >= deadline:
                    raise
                _still_ours(batch)
            finally:
                self._wedged_after = math.inf

    def _abort(self, deadline: float) -> None:
        if self._producer is None:
            return
        try:
            # Not needed for correctness (a new producer with this id fences the
            # transaction): bounded, so a failed commit gives up in time.
            self._producer.abort_transaction(max(_ABORT_S, _left(deadline)))
        except KafkaException as exc:
            event(_LOG, "abort failed", logging.WARNING, queue=self._queue, error=str(exc))

    def close(self) -> None:
        producer, self._producer = self._producer, None
        self._started = False
        if producer is not None:
            try:
                served(producer.flush, 1.0)
            except KafkaException as exc:
                # A fenced (fatal) producer raises here: closing must not fail, or
                # the restart that follows a fencing would never happen.
                event(
                    _LOG,
                    "producer close failed",
                    logging.WARNING,
                    queue=self._queue,
                    error=str(exc),
                )


class _NotOurs(Exception):
    """The batch's partitions may belong to another member by now."""


def _still_ours(batch: Batch) -> None:
    """Raise :class:`_NotOurs` when ``batch`` must not commit: one of its
    partitions left this member, or the cut is older than its commit window.

    The second closes the zombie's window. A worker stopped (SIGSTOP, a VM
    pause) between the cut and the commit wakes up with the batch in hand; its
    group metadata is read when the offsets are sent, and by then the member
    may have rejoined with a new epoch and been given the same partitions
    back, while another member ran the batch's jobs in between: the coordinator
    would accept the late commit and both runs would count (seen on the
    3-node cluster: a SIGSTOP of 8.7 s right after two jobs finished)."""
    if batch.gone():
        raise _NotOurs("a partition of the batch left this member")
    late = time.monotonic() - batch.commit_by
    if late > 0:
        raise _NotOurs(f"its commit came {late:.1f} s after the commit window closed")


def _error_of(exc: KafkaException) -> KafkaError | None:
    if exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _fenced(err: KafkaError | None, *, incremental: bool) -> bool:
    """Errors that say this member no longer owns its partitions: replaying cannot help.

    With incremental rebalances (KIP-848) the member epoch changes whenever this
    member's own assignment does, partitions gained included, and offsets sent
    with the epoch before it are refused (``ILLEGAL_GENERATION``, measured on
    Kafka 4.1): a replay with the current group metadata commits them, unless a
    partition of the batch was lost (checked by the caller). A member that was
    expelled gets ``UNKNOWN_MEMBER_ID`` or ``FENCED_MEMBER_EPOCH``.
    """
    if err is None:
        return False
    if incremental and err.code() in (KafkaError.ILLEGAL_GENERATION, _STALE_MEMBER_EPOCH):
        return False
    return err.code() in (
        KafkaError.ILLEGAL_GENERATION,
        _STALE_MEMBER_EPOCH,
        _FENCED_MEMBER_EPOCH,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )


def _left(deadline: float) -> float:
    """Seconds to ``deadline``, at least 0.1 (librdkafka reads 0 as "do not wait")."""
    return max(0.1, deadline - time.monotonic())
