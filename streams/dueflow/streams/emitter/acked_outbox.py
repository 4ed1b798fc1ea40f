"""Everything the active emitter writes, without transactions, and what of it is acknowledged.

One idempotent producer (``acks=all``): fired jobs, timers placed again, cron
placements and state, quarantine records. A record is visible to consumers
(``read_committed`` too: it is in no transaction) as soon as the broker has
appended it; nothing waits for a commit. The timer offsets are committed
elsewhere (through the lease group, see :mod:`~dueflow.streams.emitter.acked_session`),
and only once every record written before them is acknowledged, so a committed
offset never covers a fire that could still be lost: after a failover the new
emitter fires again what the old one fired after its last commit, and the
workers skip the copies (their idempotency keys are final by then).

Records are counted in *turns*: what the loop wrote in one turn (the session
calls :meth:`AckedOutbox.cut` after each). A turn is acknowledged when every
delivery report of it arrived without error; its fired due times are then
handed to ``on_acked`` with the time, which is when those jobs became visible.
:meth:`AckedOutbox.seal` marks the turns a commit covers; :meth:`acked` says
when all of them are acknowledged. A failed delivery (retries exhausted, a
fatal producer error) raises :class:`DeliveryFailed` from :meth:`poll`: the
active period starts again from the committed offsets, which cover nothing
after the failed record.

Taking over. :meth:`AckedOutbox.start` first fences the shard's transactional
ids (:class:`~dueflow.streams.emitter.fence.TransactionalFence`): an emitter
that fires in transactions (``emitter.transactional``, or an earlier release)
and was stopped with a transaction open can then commit nothing more (its open
transaction is aborted), and the committed offsets read next are settled (a
``read_committed`` fetch of the offsets waits for an open transaction's
offsets).

Per partition the idempotent producer keeps the order records were written in,
also across retries, so a job fired after a command record reached its
partition is after it in the log (commands are ordered before fired jobs by
the broker's append order).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dueflow.config import Settings
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.kafka.clients import make_producer
from dueflow.kafka.fatal import served
from dueflow.observability.logs import event
from dueflow.rules.lead_batching import fire_linger_ms
from dueflow.streams.emitter.fence import TransactionalFence
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.emitter.outbox")

# Fired due times per exec topic (what a turn fired), and when it was acknowledged.
Fired = dict[str, list[int]]
OnAcked = Callable[[Fired, int], None]
POLL_EVERY_NS = 5_000_000


class DeliveryFailed(KafkaOperationError):
    """A record the emitter wrote was not delivered: re-read from the committed offsets."""


class _Turn:
    """The records of one turn of the loop: how many are not acknowledged yet."""

    __slots__ = ("error", "fired", "left", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.left = 0
        self.error: KafkaError | None = None
        self.fired: Fired | None = None

    def ack(self, err: KafkaError | None, _msg: Message) -> None:
        """The producer's delivery report of one record (served by ``poll``)."""
        self.left -= 1
        if err is not None and self.error is None:
            self.error = err


class AckedOutbox:
    """The active emitter's idempotent producer, its turns and their acknowledgements."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        on_acked: OnAcked | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock_ms
        self.on_acked = on_acked
        self._producer: Producer | None = None
        self._fence = TransactionalFence(settings)
        self._turn: _Turn | None = None  # the open turn (records written since the last cut)
        self._unacked: deque[_Turn] = deque()  # cut, not acknowledged yet, in order
        self._seq = 0
        self._acked_to = 0  # every turn up to this seq is acknowledged
        self._polled_ns = 0
        self.records = 0  # records written since the last seal
        self.first_ms = 0  # clock when the first of them was written

    # ------------------------------------------------------------------ start
    def _new_producer(self) -> Producer:
        return make_producer(
            self._settings,
            **{
                # A fired job is visible when it is appended; with a lead, a fire
                # waits a little for others to share its request.
                "linger.ms": fire_linger_ms(self._settings.emitter.fire_ahead_ms),
                "delivery.report.only.error": False,
                # A fire that cannot be delivered for this long ends the active period
                # (then it is fired again from the committed offsets).
                "message.timeout.ms": 120_000,
            },
        )

    def prepare(self) -> None:
        """Create the producer (and those that fence the transactional ids) and learn
        the metadata (a standby does this ahead)."""
        if self._producer is None:
            self._producer = self._new_producer()
        try:
            self._producer.list_topics(timeout=10.0)
        except KafkaException as exc:
            raise _wrap("list_topics", exc) from exc
        self._fence.prepare()

    def start(self, timeout_s: float = 60.0) -> None:
        """Fence the shard's transactional ids (an emitter firing in transactions may
        still hold them), then write. (A zombie of this kind is fenced elsewhere: its
        offset commits by the lease group, its fires are copies the workers skip.)"""
        self._fence.fence(timeout_s)
        if self._producer is None:
            self._producer = self._new_producer()

    @property
    def fenced_ms(self) -> int | None:
        """How long fencing the transactional ids took at :meth:`start`."""
        return self._fence.fenced_ms

    # ------------------------------------------------------------------ writing
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Any,
        partition: int = -1,
    ) -> None:
        """Write one record (``partition`` -1: the key's, by murmur2)."""
        turn = self._turn
        if turn is None:
            self._seq += 1
            turn = self._turn = _Turn(self._seq)
        producer = self._producer
        assert producer is not None, "start() first"
        while True:
            try:
                producer.produce(
                    topic, value, key, partition, headers=headers, on_delivery=turn.ack
                )
                break
            except BufferError:  # local queue full: let deliveries drain
                _serve(producer, 0.05)
                self._settle()
            except KafkaException as exc:
                raise _wrap(f"produce to {topic}", exc) from exc
        turn.left += 1
        if not self.records:
            self.first_ms = self._clock()
        self.records += 1

    def cut(self, fired: Fired | None = None) -> None:
        """End the open turn; ``fired``: the due times it fired, per exec topic."""
        turn = self._turn
        if turn is None:
            if fired:  # fires without a record cannot be; never lose a count
                self._seq += 1
                turn = _Turn(self._seq)
            else:
                return
        self._turn = None
        turn.fired = fired or None
        self._unacked.append(turn)

    def seal(self) -> int:
        """End the open turn and start counting records for the next commit; the
        number :meth:`acked` takes to tell when everything written so far is
        acknowledged."""
        self.cut()
        self.records = 0
        return self._seq

    def acked(self, seal: int) -> bool:
        """Every record written before :meth:`seal` returned ``seal`` is acknowledged."""
        return self._acked_to >= seal

    @property
    def pending(self) -> int:
        """Turns cut and not acknowledged yet."""
        return len(self._unacked)

    # ------------------------------------------------------------------ acks
    def poll(self, *, force: bool = False) -> None:
        """Serve the delivery reports (at most every ``POLL_EVERY_NS`` unless
        ``force``) and hand on the turns acknowledged; raises
        :class:`DeliveryFailed` for a record that was not delivered."""
        now = time.monotonic_ns()
        if not force and now - self._polled_ns < POLL_EVERY_NS:
            return
        self._polled_ns = now
        producer = self._producer
        if producer is None:
            return
        _serve(producer, 0)
        self._settle()

    def _settle(self) -> None:
        unacked = self._unacked
        if not unacked or unacked[0].left > 0:
            return
        done_ms = self._clock()
        on_acked = self.on_acked
        while unacked and unacked[0].left <= 0:
            turn = unacked.popleft()
            if turn.error is not None:
                raise DeliveryFailed(
                    f"a record was not delivered: {turn.error}", cause=KafkaException(turn.error)
                )
            self._acked_to = turn.seq
            if turn.fired is not None and on_acked is not None:
                on_acked(turn.fired, done_ms)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything written is acknowledged (at most ``timeout_s``);
        True when it is. Raises :class:`DeliveryFailed` as :meth:`poll` does."""
        self.cut()
        producer = self._producer
        if producer is None:
            return not self._unacked
        deadline = time.monotonic() + timeout_s
        while self._unacked and time.monotonic() < deadline:
            try:
                served(producer.flush, max(0.0, min(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                raise _wrap("flush", exc) from exc
            _serve(producer, 0)
            self._settle()
        return not self._unacked

    def close(self, *, flush_s: float = 0.0) -> None:
        """Close the producer. ``flush_s`` 0: records not sent yet are dropped (a
        period that lost its lease writes nothing more it can avoid)."""
        producer, self._producer = self._producer, None
        self._turn = None
        self._unacked.clear()
        self._fence.close()
        if producer is None:
            return
        try:
            if flush_s <= 0:
                producer.purge(in_queue=True, in_flight=False)
            served(producer.flush, max(0.0, flush_s))
        except KafkaException as exc:
            event(log, "producer close failed", logging.WARNING, error=str(exc))


def _serve(producer: Producer, timeout_s: float) -> None:
    try:
        served(producer.poll, timeout_s)
    except KafkaException as exc:
        raise _wrap("poll", exc) from exc


def _wrap(what: str, exc: KafkaException) -> Exception:
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is not None and err.fatal():
        return DeliveryFailed(f"{what}: the producer failed ({exc})", cause=exc)
    if err is not None and err.code() == KafkaError._FENCED:
        return FencedError(f"{what}: {exc}", cause=exc)
    wrapped = KafkaOperationError(f"{what}: {exc}", cause=exc)
    wrapped.retriable = bool(err is not None and err.retriable())
    return wrapped
