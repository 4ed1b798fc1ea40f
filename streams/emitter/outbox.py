"""Everything the active emitter writes, one Kafka transaction at a time.

Fired jobs (to ``exec.<queue>``), timers placed again (to the timer topic),
quarantined records, cron bookkeeping and the timer offsets with their
checkpoints all commit together or not at all. The producer's
``transactional.id`` is fixed per cluster prefix: ``init_transactions`` of a
new active emitter fences the previous one and aborts its open transaction.

Opening ahead. After a commit the transaction coordinator still writes the
commit markers for a few milliseconds; a partition added to the next
transaction meanwhile is refused (``CONCURRENT_TRANSACTIONS``) and librdkafka
asks again only after a fixed 20 ms, so the first records of the next
transaction would wait that long. :meth:`Outbox.open_ahead` opens the next
transaction at once and adds the offsets group to it with
``send_offsets_to_transaction``, whose retries follow ``retry.backoff.ms``
(1 ms here): it returns as soon as the coordinator is ready, and records
written then are added at once. The offset it sends is one the last commit
wrote (the same offset and metadata again), so committing it changes
nothing; a later ``send_offsets_to_transaction`` in the same transaction
replaces it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from dueflow.blocking import ClientWedged, DaemonThreadExecutor, call_with_deadline
from dueflow.clients import make_transactional_producer
from dueflow.config import Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.logs import event
from dueflow.topics import names

log = logging.getLogger("dueflow.emitter.outbox")
_ABANDONED: list[Any] = []  # wedged producers, kept referenced: never destroyed


class TransactionAborted(KafkaOperationError):
    """The open transaction failed and was aborted: re-read from the committed offsets."""


class Outbox:
    """The transactional producer of the active emitter."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._names = names(settings)
        self._producer: Producer | None = None
        self._open = False
        self.records = 0  # records in the open transaction
        self.opened_ms = 0  # wall clock when it was opened
        self.first_ms = 0  # wall clock of its first record
        self._last_offset: list[TopicPartition] = []  # one offset the last commit wrote
        self._calls: DaemonThreadExecutor | None = None
        self._spares: list[Producer] = []  # made ahead by prepare(), not fenced yet
        em = settings.emitter
        # send offsets + commit retries + abort, each bounded by the transaction timeout
        self._deadline_s = 3 * em.transaction_timeout_ms / 1000.0 + 10.0

    @property
    def in_transaction(self) -> bool:
        return self._open

    def prepare(self) -> None:
        """Create the producers that :meth:`start` may need and learn the metadata,
        without fencing anyone (a standby does this ahead of a takeover)."""
        while len(self._spares) < _FENCE_SPARES:
            producer = self._new_producer()
            try:
                producer.list_topics(timeout=10.0)  # metadata before the first write
            except KafkaException as exc:
                raise _wrap("list_topics", exc) from exc
            self._spares.append(producer)

    def _new_producer(self) -> Producer:
        em = self._settings.emitter
        return make_transactional_producer(
            self._settings,
            self._names.emitter_transactional_id,
            **{
                "transaction.timeout.ms": em.transaction_timeout_ms,
                "linger.ms": 2,
                # A failed delivery fails the transaction (its commit raises): the
                # per-record delivery reports would only cost time.
                "delivery.report.only.error": True,
                # Adding the offsets to a transaction waits for the previous one's
                # markers: ask again soon (lateness), not after the default backoff.
                "retry.backoff.ms": 1,
                "retry.backoff.max.ms": 50,
            },
        )

    def start(self, timeout_s: float = 60.0) -> None:
        """Fence every earlier holder of the transactional id (``init_transactions``).

        When the previous holder died with a transaction open, the coordinator
        first aborts it and answers ``CONCURRENT_TRANSACTIONS`` meanwhile;
        librdkafka then asks again only after a fixed 500 ms. The abort takes a
        few milliseconds, so a producer that was refused (or has not fenced
        within :data:`_FENCE_TRY_S`) is destroyed and a fresh one (made ahead by
        :meth:`prepare`) asks 10 ms later. Safe: a destroyed producer asks
        nothing more, and a late request of one would only fence this emitter
        (which then starts over), never let two write.
        """
        self._calls = DaemonThreadExecutor("dueflow-emitter-txn")
        deadline = time.monotonic() + timeout_s
        for attempt in range(_FENCE_ATTEMPTS + 1):
            quick = attempt < _FENCE_ATTEMPTS
            if self._spares:
                producer = self._spares.pop(0)
            else:
                producer = self._new_producer()
                try:
                    producer.list_topics(timeout=max(1.0, deadline - time.monotonic()))
                except KafkaException as exc:
                    raise _wrap("list_topics", exc) from exc
            if self._fence(producer, quick=quick, deadline=deadline):
                self._producer = producer
                if attempt:
                    event(log, "fenced with a fresh producer", attempts=attempt + 1)
                break
            # Refused: dropped (destroyed when `producer` is bound to the next one;
            # close() would try an abort, and warn). The coordinator is aborting
            # the old transaction: give it a moment before the next one asks.
            time.sleep(_FENCE_PAUSE_S)
        self._spares.clear()  # never initialised: destroyed without a word

    def _fence(self, producer: Producer, *, quick: bool, deadline: float) -> bool:
        """``init_transactions``: True when done, False when ``quick`` and the
        coordinator refused (then librdkafka would ask again only in 500 ms).

        It waits in slices: a slice that ends with librdkafka's last error being
        a refusal (CONCURRENT_TRANSACTIONS, ...) means no request is in flight;
        one that ends with _TIMED_OUT means the answer has not come yet, and the
        next call resumes the wait.
        """
        limit = time.monotonic() + _FENCE_TRY_S if quick else deadline
        while True:
            left = limit - time.monotonic()
            wait_s = min(_FENCE_SLICE_S, max(0.001, left)) if quick else max(1.0, left)
            try:
                producer.init_transactions(wait_s)
                return True
            except KafkaException as exc:
                err = _error(exc)
                if not quick or err is None or (not err.retriable() and err.code() not in _REFUSED):
                    self._producer = producer  # closed by close()
                    raise _wrap("init_transactions", exc) from exc
                if err.code() != KafkaError._TIMED_OUT or time.monotonic() >= limit:
                    return False

    def _begin(self) -> Producer:
        producer = self._producer
        assert producer is not None, "start() first"
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            raise _wrap("begin_transaction", exc) from exc
        self._open = True
        self.records = 0
        self.opened_ms = time.time_ns() // 1_000_000
        return producer

    def open_ahead(self, group_metadata: Any) -> None:
        """Open the next transaction now and wait until it can take records (see
        the module doc). A no-op if one is open or nothing was committed yet."""
        if self._open or not self._last_offset:
            return
        self._begin()
        assert self._calls is not None
        try:
            call_with_deadline(
                self._calls, self._deadline_s, self._send_offsets_blocking, group_metadata
            )
        except ClientWedged:
            self._open = False
            self._abandon()
            raise
        except KafkaException as exc:
            self._fail("open the next transaction", exc)

    def _send_offsets_blocking(self, group_metadata: Any) -> None:
        producer = self._producer
        assert producer is not None
        timeout = self._settings.emitter.transaction_timeout_ms / 1000.0
        producer.send_offsets_to_transaction(self._last_offset, group_metadata, timeout)

    def _fail(self, what: str, exc: KafkaException) -> NoReturn:
        """The open transaction failed: abort it if it can be, and raise."""
        err = _error(exc)
        if err is not None and err.txn_requires_abort() and not err.fatal():
            self.abort()
            raise TransactionAborted(f"transaction aborted: {exc}", cause=exc) from exc
        self._open = False
        raise _wrap(what, exc) from exc

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Any,
        partition: int = -1,
    ) -> None:
        """Write one record in the open transaction (opening one if needed).

        ``partition`` -1 lets the murmur2 partitioner choose from the key.
        """
        producer = self._producer if self._open else self._begin()
        assert producer is not None
        while True:
            try:
                producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)
            except KafkaException as exc:
                raise _wrap(f"produce to {topic}", exc) from exc
        if not self.records:
            self.first_ms = time.time_ns() // 1_000_000
        self.records += 1

    def poll(self) -> None:
        """Serve delivery reports (keeps the producer's queues short)."""
        if self._producer is not None:
            self._producer.poll(0)

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Commit the open transaction with ``offsets`` (and their metadata).

        Raises :class:`FencedError` when another emitter took over, and
        :class:`TransactionAborted` (after aborting) when the transaction failed.
        The blocking calls run on a daemon thread with a deadline: librdkafka can
        block in ``send_offsets_to_transaction`` forever after a broker restart
        (``dueflow.blocking``); then the producer is abandoned
        (:class:`~dueflow.blocking.ClientWedged`) and the next active period,
        with a new producer, fences its transaction.
        """
        assert self._producer is not None
        assert self._calls is not None
        assert self._open
        try:
            call_with_deadline(
                self._calls, self._deadline_s, self._commit_blocking, offsets, group_metadata
            )
        except ClientWedged:
            self._abandon()
            raise
        finally:
            self._open = False
            self.records = 0
        if offsets:
            self._last_offset = [offsets[0]]

    def _commit_blocking(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        producer = self._producer
        assert producer is not None
        timeout = self._settings.emitter.transaction_timeout_ms / 1000.0
        # Retriable commit errors (a timeout, the coordinator moving) are retried
        # until the transaction timeout, not forever: a commit that cannot finish
        # (seen after broker restarts: the request never leaves the producer) must
        # not wedge the process, which stops polling the lease meanwhile. Giving
        # up is safe: the next active period's init_transactions settles it.
        deadline = time.monotonic() + timeout
        try:
            if offsets:
                producer.send_offsets_to_transaction(offsets, group_metadata, timeout)
            while True:
                try:
                    producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    err = _error(exc)
                    if (
                        err is not None
                        and err.retriable()
                        and not err.txn_requires_abort()
                        and time.monotonic() < deadline
                    ):
                        continue
                    raise
        except KafkaException as exc:
            err = _error(exc)
            if err is not None and err.txn_requires_abort() and not err.fatal():
                self._abort_blocking()
                raise TransactionAborted(f"transaction aborted: {exc}", cause=exc) from exc
            raise _wrap("commit_transaction", exc) from exc

    def abort(self) -> None:
        """Abort the open transaction, if any; never raises for a dead producer."""
        was_open, self._open = self._open, False
        self.records = 0
        if self._producer is None or self._calls is None or not was_open:
            return
        try:
            call_with_deadline(self._calls, self._deadline_s, self._abort_blocking)
        except ClientWedged:
            self._abandon()

    def _abort_blocking(self) -> None:
        producer = self._producer
        assert producer is not None
        try:
            producer.abort_transaction(self._settings.emitter.transaction_timeout_ms / 1000.0)
        except KafkaException as exc:
            event(log, "abort failed", logging.WARNING, error=str(exc))

    def _abandon(self) -> None:
        """Never touch the wedged producer again (destroying it would block too)."""
        event(log, "transactional producer wedged: abandoned", logging.ERROR)
        _ABANDONED.append(self._producer)
        self._producer = None

    def close(self, *, abort: bool = True) -> None:
        if abort:
            self.abort()
        self._spares.clear()
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(1.0 if abort else 10.0)
            except KafkaException as exc:  # a fenced producer raises: closing goes on
                event(log, "producer close failed", logging.WARNING, error=str(exc))
        calls, self._calls = self._calls, None
        if calls is not None:
            calls.shutdown(wait=False)


# Fencing: producers tried at most, and how long each waits before the next one.
_FENCE_ATTEMPTS = 4
_FENCE_TRY_S = 0.15  # at most, per producer
_FENCE_SLICE_S = 0.01
_FENCE_SPARES = 2  # made ahead; later attempts make theirs
_FENCE_PAUSE_S = 0.01
_REFUSED = (
    KafkaError._TIMED_OUT,
    KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
)


def _error(exc: KafkaException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def _wrap(what: str, exc: KafkaException) -> Exception:
    err = _error(exc)
    if err is not None and (err.fatal() or err.code() == KafkaError._FENCED):
        return FencedError(f"{what}: fenced by another emitter ({exc})", cause=exc)
    if err is not None and err.code() in (
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ):
        return FencedError(f"{what}: fenced by another emitter ({exc})", cause=exc)
    wrapped = KafkaOperationError(f"{what}: {exc}", cause=exc)
    wrapped.retriable = bool(err is not None and err.retriable())
    return wrapped
