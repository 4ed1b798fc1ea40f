"""Fencing a shard's transactional ids: what every takeover does first.

An emitter that fires in transactions (``emitter.transactional``, or an
earlier release) writes with the fixed ids ``<prefix>.emitter``,
``<prefix>.emitter.1``, ... of its shard. ``init_transactions`` with such an
id bumps its epoch and aborts the transaction an older holder left open, so
that holder, stopped and resumed after the takeover, can commit nothing more:
not its fires, not the timer offsets it sends into ``<prefix>.emitter.offsets``,
not its cascades or cron placements. The transactional outbox
(:class:`~dueflow.streams.emitter.outbox.Outbox`) fences the ids it then
writes with (:func:`fence_id`); an emitter that fires without transactions
fences them with :class:`TransactionalFence` and closes those producers at
once.

Quick fencing. When the previous holder died with a transaction open, the
coordinator first aborts it and answers ``CONCURRENT_TRANSACTIONS`` meanwhile;
librdkafka then asks again only after a fixed 500 ms. The abort takes a few
milliseconds, so a producer that was refused (or has not fenced within
:data:`FENCE_TRY_S`) is dropped and a fresh one (made ahead) asks 10 ms later.
Safe: a dropped producer asks nothing more, and a late request of one would
only fence this emitter (which then starts over), never let two write.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

from dueflow.config import EMITTER_MAX_PRODUCERS, Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.kafka.blocking import DaemonThreadExecutor, abandon
from dueflow.kafka.clients import make_transactional_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.topics import names
from dueflow.observability.logs import event

log = logging.getLogger("dueflow.emitter.fence")

MAX_PRODUCERS = EMITTER_MAX_PRODUCERS  # transactional ids fenced at every takeover

# Producers tried at most per id, and how long each waits before the next one.
FENCE_ATTEMPTS = 4
FENCE_TRY_S = 0.15  # at most, per producer
FENCE_SLICE_S = 0.01
FENCE_PAUSE_S = 0.01
REFUSED = (
    KafkaError._TIMED_OUT,
    KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
)

# Makes a producer for an id with its metadata fetched, within a timeout (s).
ReadyProducer = Callable[[float], Producer]


def fence_id(
    txn_id: str,
    spares: list[Producer],
    ready: ReadyProducer,
    deadline: float,
    failed: Callable[[Producer], None],
) -> Producer:
    """``init_transactions`` for ``txn_id`` (see the module's "Quick fencing"): the
    producer that fenced it. ``spares``: producers made ahead for this id (taken
    from the list; those left are dropped). When it fails for good, the producer
    that tried is handed to ``failed`` (to be closed) and the error raised
    (:func:`wrap_txn_error`)."""
    try:
        for attempt in range(FENCE_ATTEMPTS + 1):
            quick = attempt < FENCE_ATTEMPTS
            producer = spares.pop(0) if spares else ready(max(1.0, deadline - time.monotonic()))
            if _init(producer, quick=quick, deadline=deadline, failed=failed):
                if attempt:
                    event(log, "fenced with a fresh producer", id=txn_id, attempts=attempt + 1)
                return producer
            # Refused: dropped (destroyed when `producer` is bound to the next one;
            # close() would try an abort, and warn). The coordinator is aborting
            # the old transaction: give it a moment before the next one asks.
            time.sleep(FENCE_PAUSE_S)
        raise AssertionError("the last attempt waits until the deadline")  # pragma: no cover
    finally:
        spares.clear()  # never initialised: destroyed without a word


def _init(
    producer: Producer, *, quick: bool, deadline: float, failed: Callable[[Producer], None]
) -> bool:
    """``init_transactions``: True when done, False when ``quick`` and the
    coordinator refused (then librdkafka would ask again only in 500 ms).

    It waits in slices: a slice that ends with librdkafka's last error being a
    refusal (CONCURRENT_TRANSACTIONS, ...) means no request is in flight; one
    that ends with _TIMED_OUT means the answer has not come yet, and the next
    call resumes the wait.
    """
    limit = time.monotonic() + FENCE_TRY_S if quick else deadline
    while True:
        left = limit - time.monotonic()
        wait_s = min(FENCE_SLICE_S, max(0.001, left)) if quick else max(1.0, left)
        try:
            producer.init_transactions(wait_s)
            return True
        except KafkaException as exc:
            err = txn_error(exc)
            if not quick or err is None or (not err.retriable() and err.code() not in REFUSED):
                failed(producer)
                raise wrap_txn_error("init_transactions", exc) from exc
            if err.code() != KafkaError._TIMED_OUT or time.monotonic() >= limit:
                return False


def txn_error(exc: KafkaException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def wrap_txn_error(what: str, exc: KafkaException) -> Exception:
    """A transactional producer's error as the emitter's: :class:`FencedError` when
    another emitter fenced it (or it failed for good), else a
    :class:`KafkaOperationError` that keeps the error's retriability."""
    err = txn_error(exc)
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


class TransactionalFence:
    """Fences a shard's transactional ids for an emitter that fires without them.

    :meth:`prepare` makes one producer per id ahead (a hot standby);
    :meth:`fence` runs ``init_transactions`` on all of them at once, each on a
    thread of its own, and closes them once done (off the takeover's path: the
    epoch they bumped stays bumped).
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._ids = names(settings).emitter_transactional_ids(MAX_PRODUCERS, settings.wheel.shard)
        self._spares: dict[str, list[Producer]] = {txn_id: [] for txn_id in self._ids}
        self.fenced_ms: int | None = None  # how long the last fence took

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def _ready(self, txn_id: str, timeout_s: float) -> Producer:
        producer = make_transactional_producer(
            self._settings,
            txn_id,
            **{"transaction.timeout.ms": self._settings.emitter.transaction_timeout_ms},
        )
        try:
            producer.list_topics(timeout=timeout_s)  # the brokers known before the fence
        except KafkaException as exc:
            raise wrap_txn_error("list_topics", exc) from exc
        return producer

    def prepare(self) -> None:
        """One producer per id, made ahead, metadata fetched, nobody fenced yet."""
        for txn_id, spares in self._spares.items():
            if not spares:
                spares.append(self._ready(txn_id, 10.0))

    def fence(self, timeout_s: float = 60.0) -> None:
        """Fence every id (all at once); raises when one could not be fenced in time
        (:class:`~dueflow.errors.FencedError`: another emitter fenced this one)."""
        started = time.monotonic()
        deadline = started + timeout_s
        calls: list[tuple[DaemonThreadExecutor, concurrent.futures.Future[Producer]]] = []
        fenced: list[Producer] = []  # to close: those that fenced, and those that failed
        for i, txn_id in enumerate(self._ids):
            executor = DaemonThreadExecutor(f"dueflow-emitter-fence-{i}")
            spares, self._spares[txn_id] = self._spares[txn_id], []
            ready = _bind(self._ready, txn_id)
            future = executor.submit(fence_id, txn_id, spares, ready, deadline, fenced.append)
            calls.append((executor, future))
        failure: BaseException | None = None
        for executor, future in calls:
            try:
                fenced.append(future.result(max(0.0, deadline - time.monotonic()) + 1.0))
            except concurrent.futures.TimeoutError:
                failure = failure or KafkaOperationError("fencing the transactional ids timed out")
            except (FencedError, KafkaOperationError) as exc:
                failure = failure or exc
            finally:
                executor.shutdown(wait=False)
        _close_later(fenced)
        if failure is not None:
            raise failure
        self.fenced_ms = round((time.monotonic() - started) * 1000)

    def close(self) -> None:
        """Drop the producers made ahead (never initialised)."""
        for spares in self._spares.values():
            spares.clear()


def _bind(ready: Callable[[str, float], Producer], txn_id: str) -> ReadyProducer:
    return lambda timeout_s: ready(txn_id, timeout_s)


def _close_later(producers: list[Producer]) -> None:
    """Destroy fenced producers on a daemon thread (a destroy can take a while on a
    loaded machine; one that never returns is left there)."""
    if not producers:
        return
    closing = list(producers)
    producers.clear()

    def close() -> None:
        while closing:
            producer = closing.pop()
            try:
                served(producer.flush, 1.0)
            except KafkaException:
                abandon(producer)  # failed: never destroyed, never touched again

    threading.Thread(target=close, name="dueflow-emitter-fence-close", daemon=True).start()
