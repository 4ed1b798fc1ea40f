"""Everything the active emitter writes, in Kafka transactions.

Fired jobs (to ``exec.<queue>``), timers placed again (to the timer topic),
quarantined records, cron bookkeeping and the timer offsets with their
checkpoints all commit together or not at all.

Producers in a ring. The outbox writes with ``emitter.producers``
transactional producers (fixed ids ``<prefix>.emitter``, ``<prefix>.emitter.1``,
...), one transaction open on each at most. Records go to the current one;
:meth:`Outbox.submit` hands its transaction to a thread of its own to commit
and moves on to the next producer in the ring, so the loop keeps firing while
a commit is in flight: a timer that comes due meanwhile is written at once,
not after the commit's round trips. Commits stay in order: the next one is
submitted only once the previous one finished (its offsets are then the newest).
With one producer, :meth:`submit` waits for the commit, as a single
transactional producer must.

Fencing. :meth:`Outbox.start` runs ``init_transactions`` for every id up to
:data:`MAX_PRODUCERS`, whatever ``emitter.producers`` says, so a new active
emitter fences every producer an earlier one may still hold (also one that ran
with more producers), and aborts their open transactions, before it reads a
committed offset.

Opening ahead. After a commit the transaction coordinator still writes the
commit markers for a few milliseconds; a partition added to the next
transaction of the same id meanwhile is refused (``CONCURRENT_TRANSACTIONS``)
and librdkafka asks again only after a fixed 20 ms. So after its commit a
producer opens its next transaction at once, on its thread, and adds the
offsets group to it with ``send_offsets_to_transaction``, whose retries follow
``retry.backoff.ms`` (1 ms here): the producer becomes the current one again
only when that returned, and records written then are added at once. The offset
it sends is one of those its commit wrote. Another producer may commit a newer
offset for that partition before this transaction commits, so every commit
sends, besides its own offsets, the newest offset known for the partition its
transaction was opened with: a transaction never commits an offset older than
one committed before it.

Records refused as too large. A record the broker refuses fails its
transaction, and the failure does not always say why: the next ``produce`` or
the commit may fail with librdkafka's "erroneous state" instead. The failed
delivery itself says it (only failed deliveries are reported):
:meth:`Outbox.refused_too_large` tells the process, which then measures every
record (:mod:`dueflow.streams.emitter.limits`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor, abandon
from dueflow.kafka.clients import make_transactional_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.topic_limits import TOO_LARGE_CODES
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.streams.emitter.fence import MAX_PRODUCERS, fence_id, txn_error, wrap_txn_error
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.emitter.outbox")


_Key = tuple[str, int]
POLL_EVERY_NS = 10_000_000


class TransactionAborted(KafkaOperationError):
    """The open transaction failed and was aborted: re-read from the committed offsets."""


@dataclass(eq=False)
class _Lane:
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
    ahead: _Key | None = None  # partition whose offset opened the transaction
    # The open-ahead after its last commit (on its thread), and when it was asked.
    task: concurrent.futures.Future[None] | None = None
    task_at: float = 0.0


# An abort is a courtesy (the next fencing aborts what is open): waited for this long.
_ABORT_S = 2.0


class Outbox:
    """The transactional producers of the active emitter."""

    def __init__(self, settings: Settings, *, clock_ms: Callable[[], int] = wall_ms) -> None:
        self._settings = settings
        self._clock = clock_ms  # the session's clock: ages and commit times compare with it
        self._names = names(settings)
        em = settings.emitter
        self.shard = settings.wheel.shard
        ids = self._names.emitter_transactional_ids(MAX_PRODUCERS, settings.wheel.shard)
        self._ring = em.producers
        self._lanes = [
            _Lane(txn_id, _FENCE_SPARES if i < self._ring else 1) for i, txn_id in enumerate(ids)
        ]
        self._cur = 0
        self._polled_ns = 0
        self._latest: dict[_Key, TopicPartition] = {}  # newest offset sent per partition
        # The commit in flight: its future and when it was asked.
        self._commit: concurrent.futures.Future[int] | None = None
        self._commit_at = 0.0
        self.submitted_ms = 0  # wall clock when the commit in flight was handed over
        # A commit's calls share the transaction timeout, an abort after it takes at
        # most _ABORT_S: a commit running longer than this is wedged (librdkafka
        # #5456/#5511 after broker restarts), and its producers are abandoned.
        self._deadline_s = em.transaction_timeout_ms / 1000.0 + _ABORT_S + 5.0
        self._too_large = False  # the broker refused a record of this outbox as too large

    # ------------------------------------------------------------------ state
    @property
    def _lane(self) -> _Lane:
        return self._lanes[self._cur]

    @property
    def in_transaction(self) -> bool:
        """A transaction is open on the current producer."""
        return self._lane.open

    @property
    def records(self) -> int:
        """Records in the current producer's open transaction."""
        return self._lane.records

    @property
    def opened_ms(self) -> int:
        return self._lane.opened_ms

    @property
    def first_ms(self) -> int:
        return self._lane.first_ms

    @property
    def committing(self) -> bool:
        """A commit was submitted and its outcome not collected yet."""
        return self._commit is not None

    # ------------------------------------------------------------------ start
    def prepare(self) -> None:
        """Create the producers that :meth:`start` may need and learn the metadata,
        without fencing anyone (a standby does this ahead of a takeover)."""
        for lane in self._lanes:
            while len(lane.spares) < lane.spares_wanted:
                lane.spares.append(self._ready_producer(lane.txn_id, 10.0))

    def _new_producer(self, txn_id: str) -> Producer:
        em = self._settings.emitter
        return make_transactional_producer(
            self._settings,
            txn_id,
            **{
                "transaction.timeout.ms": em.transaction_timeout_ms,
                # Records go out while the transaction is open, so the commit's
                # flush has little left to send. A long linger (records sent only
                # by the commit) halves the broker's requests but not its CPU, and
                # makes every commit a round trip longer: a longer tail.
                "linger.ms": 2,
                # A failed delivery fails the transaction (its commit raises): the
                # per-record delivery reports would only cost time. The failures
                # are reported: one says whether the broker refused a record as too
                # large, which the error that ends the transaction may not.
                "delivery.report.only.error": True,
                "on_delivery": self._delivered,
                # Adding the offsets to a transaction waits for the previous one's
                # markers: ask again soon (lateness), not after the default backoff.
                "retry.backoff.ms": 1,
                "retry.backoff.max.ms": 50,
            },
        )

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None and err.code() in TOO_LARGE_CODES:
            self._too_large = True

    def refused_too_large(self, wait_s: float = 0.0) -> bool:
        """True when the broker refused a record of this outbox as too large (the
        failed deliveries not served yet are served first, for up to ``wait_s``: the
        report of a refused record may reach the client just after the error that
        the refusal caused)."""
        deadline = time.monotonic() + wait_s
        while True:
            for lane in self._lanes:
                if lane.producer is not None:
                    with contextlib.suppress(KafkaException):  # fatal: the session ends anyway
                        served(lane.producer.poll, 0 if wait_s <= 0 else 0.05)
            if self._too_large or time.monotonic() >= deadline:
                return self._too_large

    def _ready_producer(self, txn_id: str, timeout_s: float) -> Producer:
        producer = self._new_producer(txn_id)
        try:
            producer.list_topics(timeout=timeout_s)  # metadata before the first write
        except KafkaException as exc:
            raise wrap_txn_error("list_topics", exc) from exc
        return producer

    def start(self, timeout_s: float = 60.0) -> None:
        """Fence every earlier holder of each transactional id, all ids at once
        (each on its producer's thread; see :meth:`_fence_lane`)."""
        deadline = time.monotonic() + timeout_s
        for i, lane in enumerate(self._lanes):
            lane.calls = DaemonThreadExecutor(f"dueflow-emitter-txn-{i}")
        fencing = [
            lane.calls.submit(self._fence_lane, lane, deadline)
            for lane in self._lanes
            if lane.calls is not None
        ]
        try:
            for future in fencing:
                future.result(max(0.0, deadline - time.monotonic()) + 1.0)
        except concurrent.futures.TimeoutError:
            raise KafkaOperationError("fencing the earlier emitters did not finish") from None
        for lane in self._lanes[self._ring :]:  # fenced only: never written with
            self._close_lane(lane, abort=False)

    def _fence_lane(self, lane: _Lane, deadline: float) -> None:
        """``init_transactions`` for one id (:func:`~dueflow.streams.emitter.fence.fence_id`:
        a producer the coordinator refused while it aborts the old transaction is
        dropped, and a fresh one, made ahead by :meth:`prepare`, asks again)."""

        def failed(producer: Producer) -> None:
            lane.producer = producer  # closed by close()

        lane.producer = fence_id(
            lane.txn_id,
            lane.spares,
            lambda timeout_s: self._ready_producer(lane.txn_id, timeout_s),
            deadline,
            failed,
        )

    # ------------------------------------------------------------------ writing
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Any,
        partition: int = -1,
    ) -> None:
        """Write one record in the current producer's transaction (opening one if
        needed). ``partition`` -1 lets the murmur2 partitioner choose from the key."""
        lane = self._lanes[self._cur]
        if not lane.open:
            self._begin(lane)
        producer = lane.producer
        assert producer is not None
        while True:
            try:
                producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:  # local queue full: let deliveries drain
                _serve(producer, 0.05)
            except KafkaException as exc:
                raise wrap_txn_error(f"produce to {topic}", exc) from exc
        if not lane.records:
            lane.first_ms = self._clock()
        lane.records += 1

    def _begin(self, lane: _Lane) -> None:
        producer = lane.producer
        assert producer is not None, "start() first"
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            raise wrap_txn_error("begin_transaction", exc) from exc
        lane.open = True
        lane.records = 0
        lane.ahead = None
        lane.opened_ms = self._clock()

    def poll(self) -> None:
        """Serve the producers' events (failed deliveries, errors) at most every
        ``POLL_EVERY_NS``: the loop turns thousands of times a second while a
        backlog drains, and a poll per turn cost it 7 % of its time. (Deliveries
        are reported only when they fail; a full local queue polls at once.)"""
        now = time.monotonic_ns()
        if now - self._polled_ns < POLL_EVERY_NS:
            return
        self._polled_ns = now
        for lane in self._lanes[: self._ring]:
            if lane.producer is not None:
                _serve(lane.producer, 0)

    # ------------------------------------------------------------------ commits
    def can_submit(self) -> bool:
        """True when :meth:`submit` would not wait: no commit is in flight and
        the next producer's transaction is open ahead (or need not be)."""
        if self._commit is not None or self._ring == 1:
            return self._commit is None
        nxt = self._lanes[(self._cur + 1) % self._ring]
        return self._task_done(nxt)

    def wait_submittable(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until :meth:`can_submit` would say True."""
        waits: list[concurrent.futures.Future[Any]] = []
        if self._commit is not None:
            waits.append(self._commit)
        task = self._lanes[(self._cur + 1) % self._ring].task
        if task is not None:
            waits.append(task)
        if waits:
            concurrent.futures.wait(waits, timeout_s)

    def submit(
        self, offsets: list[TopicPartition], group_metadata: Any, *, reopen: bool = True
    ) -> None:
        """Commit the current transaction with ``offsets`` (and their metadata) on
        its producer's thread, and write on with the next producer.

        Its outcome is :meth:`collect`-ed (or :meth:`wait`-ed for). With one
        producer this waits for the commit (and the open-ahead, ``reopen``). A
        transaction nothing was written to is committed too (it keeps an opened-
        ahead transaction young). The previous commit must have been collected.
        """
        assert self._commit is None, "collect() the previous commit first"
        lane = self._lanes[self._cur]
        assert lane.calls is not None, "start() first"
        if not lane.open:
            return
        sent = {(tp.topic, tp.partition) for tp in offsets}
        if lane.ahead is not None and lane.ahead not in sent:
            offsets = [*offsets, self._latest[lane.ahead]]
        for tp in offsets:
            self._latest[(tp.topic, tp.partition)] = tp
        ahead = offsets[0] if offsets else next(iter(self._latest.values()), None)
        commit: concurrent.futures.Future[int] = concurrent.futures.Future()
        lane.open, lane.records, lane.ahead = False, 0, None
        lane.task = lane.calls.submit(
            self._commit_then_open,
            lane,
            commit,
            offsets,
            group_metadata,
            ahead if reopen and self._ring < _NO_OPEN_AHEAD_FROM else None,
        )
        self._commit = commit
        self._commit_at = lane.task_at = time.monotonic()
        self.submitted_ms = self._clock()
        if self._ring == 1:
            self._wait_task(lane, block=True)
            return
        nxt = (self._cur + 1) % self._ring
        self._wait_task(self._lanes[nxt], block=True)
        self._cur = nxt

    def collect(self) -> int | None:
        """Wall-clock ms when the submitted commit finished, once it did (then
        forgotten); None while none finished. Raises what the commit raised:
        :class:`FencedError`, :class:`TransactionAborted`, :class:`ClientWedged`, ..."""
        future = self._commit
        if future is None or not future.done():
            if future is not None and time.monotonic() - self._commit_at > self._deadline_s:
                self._commit = None
                self._abandon_all()
                raise ClientWedged(f"commit did not return within {self._deadline_s:.0f} s")
            return None
        self._commit = None
        return future.result()

    def wait(self) -> int | None:
        """Block until the submitted commit finished: :meth:`collect`'s answer."""
        future = self._commit
        if future is None:
            return None
        concurrent.futures.wait(
            [future], max(0.0, self._commit_at + self._deadline_s - time.monotonic()) + 0.01
        )
        return self.collect()

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> int | None:
        """Commit the current transaction and wait for it (no open-ahead): when
        the emitter stops, and in tests. Wall-clock ms when it finished."""
        if self._commit is not None:
            self.wait()
        self.submit(offsets, group_metadata, reopen=False)
        return self.wait()

    def _commit_then_open(
        self,
        lane: _Lane,
        commit: concurrent.futures.Future[int],
        offsets: list[TopicPartition],
        group_metadata: Any,
        ahead: TopicPartition | None,
    ) -> None:
        """On the lane's thread: commit (its outcome goes to ``commit``), then, if
        it committed and ``ahead`` is given, open the next transaction ahead."""
        try:
            done_ms = self._commit_blocking(lane, offsets, group_metadata)
        except BaseException as exc:
            commit.set_exception(exc)
            return
        commit.set_result(done_ms)
        if ahead is not None:
            self._open_ahead_blocking(lane, ahead, group_metadata)

    def _commit_blocking(
        self, lane: _Lane, offsets: list[TopicPartition], group_metadata: Any
    ) -> int:
        producer = lane.producer
        assert producer is not None
        timeout = self._settings.emitter.transaction_timeout_ms / 1000.0
        # Retriable commit errors (a timeout, the coordinator moving) are retried
        # until the transaction timeout, not forever: a commit that cannot finish
        # (seen after broker restarts: the request never leaves the producer) must
        # not wedge the process. Giving up is safe: the next active period's
        # init_transactions settles it.
        deadline = time.monotonic() + timeout
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
                    return self._clock()
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
            self._fail_blocking(lane, "commit_transaction", exc)

    def _open_ahead_blocking(
        self, lane: _Lane, offset: TopicPartition, group_metadata: Any
    ) -> None:
        """Open the lane's next transaction and wait until it can take records."""
        producer = lane.producer
        assert producer is not None
        if lane.open:
            return
        self._begin(lane)
        lane.ahead = (offset.topic, offset.partition)
        timeout = self._settings.emitter.transaction_timeout_ms / 1000.0
        try:
            producer.send_offsets_to_transaction([offset], group_metadata, timeout)
        except KafkaException as exc:
            self._fail_blocking(lane, "open the next transaction", exc)

    def _fail_blocking(self, lane: _Lane, what: str, exc: KafkaException) -> NoReturn:
        """A transaction failed (on the lane's thread): abort it if it can be, and raise."""
        lane.open, lane.records = False, 0
        err = txn_error(exc)
        if err is not None and err.txn_requires_abort() and not err.fatal():
            self._abort_blocking(lane)
            raise TransactionAborted(f"transaction aborted: {exc}", cause=exc) from exc
        raise wrap_txn_error(what, exc) from exc

    def _task_done(self, lane: _Lane) -> bool:
        """The lane's open-ahead finished (raising what it raised), or none is pending."""
        task = lane.task
        if task is None:
            return True
        if not task.done():
            if time.monotonic() - lane.task_at > self._deadline_s:
                self._wait_task(lane, block=False)
            return False
        self._wait_task(lane, block=False)
        return True

    def _wait_task(self, lane: _Lane, *, block: bool) -> None:
        task = lane.task
        if task is None:
            return
        left = lane.task_at + self._deadline_s - time.monotonic()
        if not block and not task.done() and left > 0:
            return
        try:
            task.result(max(0.0, left))
        except concurrent.futures.TimeoutError:
            lane.task = None
            self._abandon_all()
            raise ClientWedged(
                f"opening a transaction did not return within {self._deadline_s:.0f} s"
            ) from None
        finally:
            if task.done():
                lane.task = None

    # ------------------------------------------------------------------ aborts
    def abort(self, wait_s: float = _ABORT_S) -> None:
        """Abort every open transaction (after the commit in flight, if any), waiting
        at most ``wait_s`` in all; never raises for a dead producer.

        A lane that does not finish in time is abandoned: the abort is a courtesy
        (the next active period's producers fence these transactional ids, which
        aborts what is open), and an emitter that has lost the lease must get back
        to its lease consumer (a rebalance waits for it) and to SIGTERM.
        """
        until = time.monotonic() + wait_s
        pending = []
        for lane in self._lanes[: self._ring]:
            if lane.producer is None or lane.calls is None:
                continue
            pending.append((lane, lane.calls.submit(self._abort_if_open, lane)))
        for lane, future in pending:
            try:
                future.result(max(0.0, until - time.monotonic()))
            except concurrent.futures.TimeoutError:
                self._abandon_lane(lane)
        self._commit = None

    def _abort_if_open(self, lane: _Lane) -> None:
        if lane.open:
            lane.open, lane.records = False, 0
            self._abort_blocking(lane)

    def _abort_blocking(self, lane: _Lane) -> None:
        producer = lane.producer
        assert producer is not None
        try:
            producer.abort_transaction(_ABORT_S)
        except KafkaException as exc:
            event(log, "abort failed", logging.WARNING, error=str(exc))

    def _abandon_lane(self, lane: _Lane) -> None:
        """Never touch a wedged producer again (destroying it would block too)."""
        if lane.producer is None:
            return
        event(log, "transactional producer wedged: abandoned", logging.ERROR, id=lane.txn_id)
        abandon(lane.producer)
        lane.producer = None
        lane.open = False
        if lane.calls is not None:
            lane.calls.shutdown(wait=False)
            lane.calls = None

    def _abandon_all(self) -> None:
        """A call did not return: the whole outbox is done for (the process makes a new one)."""
        for lane in self._lanes:
            self._abandon_lane(lane)

    def close(self, *, abort: bool = True) -> None:
        if abort:
            self.abort()
        for lane in self._lanes:
            self._close_lane(lane, abort=abort)

    def _close_lane(self, lane: _Lane, *, abort: bool) -> None:
        lane.spares.clear()
        producer, lane.producer = lane.producer, None
        if producer is not None:
            try:
                served(producer.flush, 1.0 if abort else 10.0)
            except (KafkaException, SystemError) as exc:
                # A fenced producer raises: closing goes on. Its error callback raises
                # once per fatal error, and a second one inside the same flush reaches
                # Python as a SystemError (an exception already set).
                event(log, "producer close failed", logging.WARNING, error=str(exc))
        calls, lane.calls = lane.calls, None
        if calls is not None:
            calls.shutdown(wait=False)


# With this many producers or more, a producer's turn comes a whole commit after
# its own commit, when its markers are written: no need to open ahead (which
# costs the broker a few requests per transaction, asking until the markers are
# written).
_NO_OPEN_AHEAD_FROM = 3

_FENCE_SPARES = 2  # producers made ahead per id written with; later attempts make theirs


def _serve(producer: Producer, timeout_s: float) -> None:
    """``producer.poll``: a fatal error raises there too (fenced by a newer emitter
    after this one was stopped, a sequence out of order after a leader change), as
    :class:`FencedError` like every other call's (the session ends, not the process)."""
    try:
        served(producer.poll, timeout_s)
    except KafkaException as exc:
        raise wrap_txn_error("poll", exc) from exc
