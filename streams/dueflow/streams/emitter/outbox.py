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
transactional producer must. Each producer, its thread and the calls made on
it are a :class:`~dueflow.streams.emitter.txn_lane.Lane`.

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
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor
from dueflow.kafka.clients import make_transactional_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.topic_limits import TOO_LARGE_CODES
from dueflow.kafka.topics import names
from dueflow.streams.emitter.fence import MAX_PRODUCERS, fence_id, wrap_txn_error
from dueflow.streams.emitter.txn_lane import ABORT_S, Lane, PartitionKey, serve
from dueflow.streams.emitter.txn_lane import TransactionAborted as TransactionAborted
from dueflow.wall_clock import wall_ms

POLL_EVERY_NS = 10_000_000


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
            Lane(txn_id, _FENCE_SPARES if i < self._ring else 1) for i, txn_id in enumerate(ids)
        ]
        self._cur = 0
        self._polled_ns = 0
        self._latest: dict[PartitionKey, TopicPartition] = {}  # newest offset sent per partition
        # The commit in flight: its future and when it was asked.
        self._commit: concurrent.futures.Future[int] | None = None
        self._commit_at = 0.0
        self.submitted_ms = 0  # wall clock when the commit in flight was handed over
        # A commit's calls share the transaction timeout, an abort after it takes at
        # most ABORT_S: a commit running longer than this is wedged (librdkafka
        # #5456/#5511 after broker restarts), and its producers are abandoned.
        self._deadline_s = em.transaction_timeout_ms / 1000.0 + ABORT_S + 5.0
        self._too_large = False  # the broker refused a record of this outbox as too large

    # ------------------------------------------------------------------ state
    @property
    def _lane(self) -> Lane:
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
            lane.close(abort=False)

    def _fence_lane(self, lane: Lane, deadline: float) -> None:
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
            lane.begin(self._clock)
        producer = lane.producer
        assert producer is not None
        while True:
            try:
                producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:  # local queue full: let deliveries drain
                serve(producer, 0.05)
            except KafkaException as exc:
                raise wrap_txn_error(f"produce to {topic}", exc) from exc
        if not lane.records:
            lane.first_ms = self._clock()
        lane.records += 1

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
                serve(lane.producer, 0)

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
            lane.commit_then_open,
            commit,
            offsets,
            group_metadata,
            ahead if reopen and self._ring < _NO_OPEN_AHEAD_FROM else None,
            timeout_s=self._settings.emitter.transaction_timeout_ms / 1000.0,
            clock_ms=self._clock,
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

    def _task_done(self, lane: Lane) -> bool:
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

    def _wait_task(self, lane: Lane, *, block: bool) -> None:
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
    def abort(self, wait_s: float = ABORT_S) -> None:
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
            pending.append((lane, lane.calls.submit(lane.abort_if_open)))
        for lane, future in pending:
            try:
                future.result(max(0.0, until - time.monotonic()))
            except concurrent.futures.TimeoutError:
                lane.abandon()
        self._commit = None

    def _abandon_all(self) -> None:
        """A call did not return: the whole outbox is done for (the process makes a new one)."""
        for lane in self._lanes:
            lane.abandon()

    def close(self, *, abort: bool = True) -> None:
        if abort:
            self.abort()
        for lane in self._lanes:
            lane.close(abort=abort)


# With this many producers or more, a producer's turn comes a whole commit after
# its own commit, when its markers are written: no need to open ahead (which
# costs the broker a few requests per transaction, asking until the markers are
# written).
_NO_OPEN_AHEAD_FROM = 3

_FENCE_SPARES = 2  # producers made ahead per id written with; later attempts make theirs
