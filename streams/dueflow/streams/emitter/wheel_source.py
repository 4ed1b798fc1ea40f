"""The active emitter's consumer of the timer topic.

It is assigned the partitions of every shard the process drives (no group
subscription: the lease decides who reads) at the committed offsets, reads
with ``read_committed`` and reports partition ends. The timer offsets are
committed into one of two groups (one each for all shards: each shard commits
only its own partitions): the lease group, when the emitter fires without
transactions (through its lease membership, which fences a zombie), and the
emitter's offsets group, when it fires in transactions (see
docs/emitter.md). Both are read, and each partition goes on from the newer
commit (:func:`~dueflow.rules.drain.newer_commit`), so a deployment can move
from one way to the other, and back, with emitters of both running.

Firing without transactions, the commits the lease group accepted are also
written into the offsets group (:meth:`WheelSource.mirror`: a plain commit,
as the group has no members; at most once a second, see
:mod:`~dueflow.streams.emitter.acked_session`), where an earlier release,
which reads only that group, finds them after a rollback. A copy carries only
offsets the lease group accepted, each true of what was fired and
acknowledged, so a late one (from an emitter stopped and resumed) moves that
group back at most to what was handled then: a rollback fires some again,
never skips. Partitions
are paused and resumed by the drainer; pausing always seeks to the offset to
read next, so messages fetched past it are dropped and fetched again on
resume.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.rules.drain import Checkpoint, Committed, newer_commit

log = logging.getLogger("dueflow.emitter")


class WheelSource:
    """Reads the timer topic; one per process, shared by the shards it drives."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._topic = names(settings).timers
        self._group = names(settings).emitter_offsets_group
        self._consumer: Consumer | None = None
        # Reads the lease group's committed offsets (never joins it).
        self._lease_reader: Consumer | None = None
        self._mirror_failing = False  # the last mirror commit was refused (logged once)

    @property
    def topic(self) -> str:
        return self._topic

    def start(self) -> None:
        """Create the consumer and learn the timer topic's metadata (a standby does
        this ahead, so taking over does not wait for it)."""
        self._consumer = make_consumer(
            self._settings,
            self._group,
            **{
                "enable.partition.eof": True,
                # A bounded prefetch queue: the emitter's memory must not follow the
                # backlog, and a resumed partition's records must not wait behind
                # seconds of other partitions' records. Both limits count the whole
                # consumer queue (every partition's queue forwards to it), and the
                # next fetch is sent only while the queue is below both: with 1000
                # messages (10 ms of a 100k/s drain) the loop waited for almost
                # every fetch; 10k messages / 8 MiB (about 0.1 s of a drain) halved
                # the time a backlog drain spends waiting in consume (measured:
                # 0.5 s instead of 0.8-1.2 s for 300k timers).
                "queued.min.messages": 10_000,
                "queued.max.messages.kbytes": 8192,
                # Fetches of a few hundred kilobytes per partition, a few megabytes
                # in all: a partition resumed (or assigned) gets its records in the
                # next one, not after tens of megabytes of other partitions' records.
                "fetch.max.bytes": 8_388_608,
                "max.partition.fetch.bytes": 262_144,
                # ... and a full queue postpones fetching by this much, not the
                # default second, which would stall a partition just resumed.
                "fetch.queue.backoff.ms": 5,
                # A fetch with records returns at once; an idle one waits this long,
                # and a partition resumed meanwhile joins the next fetch. Slots are
                # resumed wheel.lookahead_ms (500) ahead, so 50 ms costs no
                # lateness, while 5 ms cost the broker a fifth of a core idle
                # (measured: same drain rate either way).
                "fetch.wait.max.ms": 50,
                # The answers to mirror() (served by consume()).
                "on_commit": self._mirrored,
            },
        )
        # The metadata is cached: an assignment at takeover need not ask for it
        # (if this fails, it is asked for then).
        with contextlib.suppress(KafkaException):
            self._consumer.list_topics(self._topic, timeout=10.0)
        self._lease_reader = make_consumer(self._settings, names(self._settings).emitter_group)

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None, "start() first"
        return self._consumer

    def committed(
        self, partitions: range, timeout_s: float = 30.0
    ) -> dict[int, tuple[int, Checkpoint | None]]:
        """Committed offset and checkpoint of ``partitions`` (a shard's: stable
        offsets only).

        ``read_committed`` makes the fetch wait for offsets of open transactions,
        so the fenced emitter's last transaction is settled first. Offset -1:
        nothing committed yet.
        """
        tps = [TopicPartition(self._topic, p) for p in partitions]
        out: dict[int, Committed] = {p: (-1, None) for p in partitions}
        for got in self._both_groups(tps, "timer offsets", timeout_s):
            for tp in got:
                offset = tp.offset if tp.offset >= 0 else -1
                ck = Checkpoint.decode(tp.metadata) if offset >= 0 else None
                out[tp.partition] = newer_commit(out[tp.partition], (offset, ck))
        return out

    def committed_elsewhere(
        self, topic: str, partitions: int, timeout_s: float = 30.0
    ) -> dict[int, int]:
        """Committed offsets of another topic in the emitter's groups (the higher of
        the two; 0: none)."""
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        out = {p: 0 for p in range(partitions)}
        for got in self._both_groups(tps, f"offsets of {topic}", timeout_s):
            for tp in got:
                out[tp.partition] = max(out[tp.partition], tp.offset)
        return out

    def _both_groups(
        self, tps: list[TopicPartition], what: str, timeout_s: float
    ) -> list[list[TopicPartition]]:
        """``tps`` as committed in the offsets group and in the lease group.

        A retriable error (the group's coordinator moved: ``NOT_COORDINATOR``
        after a broker restart) is asked again within ``timeout_s``, not
        handed up: a takeover that fails waits a second before it tries again."""
        out = []
        deadline = time.monotonic() + timeout_s
        for consumer in (self.consumer, self._lease_reader):
            if consumer is None:
                continue
            while True:
                try:
                    left = max(0.1, deadline - time.monotonic())
                    out.append(consumer.committed(tps, timeout=left))
                    break
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    retriable = isinstance(err, KafkaError) and (
                        err.retriable() or err.code() in _COORDINATOR_MOVED
                    )
                    if not retriable or time.monotonic() >= deadline:
                        raise kafka_error(f"fetch committed {what}", exc) from exc
                    time.sleep(_RETRY_S)
        return out

    def mirror(self, offsets: list[TopicPartition], *, wait: bool = False) -> bool:
        """Commit ``offsets`` (accepted by the lease group) into the offsets group too.

        Asynchronously (the answer is served by :meth:`consume`; a refusal is
        logged), or with ``wait`` (a stopping emitter's last commit): True when
        accepted."""
        consumer = self._consumer
        if consumer is None or not offsets:
            return consumer is not None
        try:
            if not wait:
                consumer.commit(offsets=offsets, asynchronous=True)
                return True
            got = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._mirrored(exc.args[0] if exc.args else KafkaError(KafkaError._FAIL), [])
            return False
        err = next((tp.error for tp in got or [] if tp.error is not None), None)
        self._mirrored(err, [])
        return err is None

    def _mirrored(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is None:
            err = next((tp.error for tp in partitions or [] if tp.error is not None), None)
        failing = err is not None
        if failing != self._mirror_failing:
            self._mirror_failing = failing
            if failing:
                event(log, "offsets mirror refused", logging.WARNING, error=str(err))
            else:
                event(log, "offsets mirror accepted again")

    def assign(self, offsets: dict[int, int]) -> None:
        """Read the partitions of ``offsets`` (a shard's) from them (-1: from the
        beginning), besides those read already (other shards this process drives).

        Never committed means never deleted by the emitter either, so "the
        beginning" is offset 0 (if someone else deleted records, the offset reset
        policy, earliest, takes over). An explicit offset spares librdkafka an
        offset query, which for a partition new to the client waits half a second.
        """
        tps = [
            TopicPartition(self._topic, p, off if off >= 0 else 0)
            for p, off in sorted(offsets.items())
        ]
        self.consumer.incremental_assign(tps)
        # librdkafka keeps a partition's pause across unassign()/assign(): a slot
        # paused by the previous active period of this (warm) consumer would never
        # be read again, and the new drainer, which believes it runs, would wait
        # for it forever. Every partition starts resumed; the drainer pauses.
        self.consumer.resume(tps)

    def consume(self, max_messages: int, timeout_s: float) -> list[Message]:
        """What is there, waiting at most ``timeout_s`` for the first record.

        (``Consumer.consume`` alone waits for ``max_messages`` or the whole
        timeout, so a record due soon would wait behind it.)
        """
        consumer = self.consumer
        first = consumer.poll(timeout_s)
        if first is None:
            return []
        rest = consumer.consume(max_messages - 1, 0) if max_messages > 1 else []
        rest.insert(0, first)
        return rest

    def pause(self, partition: int, next_offset: int) -> None:
        """Stop reading ``partition``; it continues at ``next_offset`` on resume.

        Paused first, then sought: the other way round, a fetch sent between the
        two requests (the fetcher serves them one by one) could bring records from
        ``next_offset`` on, which the drainer drops for a paused partition, and
        leave the position past them, where the resume would go on: they were
        never read (the likely way a record of a parked slot went unread once, in
        the wire fuzz test on a loaded machine).
        Sought while paused, the fetcher sends nothing until the resume, and the
        seek drops what older fetches brought.
        """
        consumer = self.consumer
        tp = TopicPartition(self._topic, partition, next_offset)
        consumer.pause([tp])
        consumer.seek(tp)

    def hold(self, partition: int) -> None:
        """Stop reading ``partition``; it continues after the last record delivered."""
        self.consumer.pause([TopicPartition(self._topic, partition)])

    def resume(self, partition: int) -> None:
        self.consumer.resume([TopicPartition(self._topic, partition)])

    def end_offset(self, partition: int) -> int:
        """The high watermark the last fetch reported (no request); -1: unknown."""
        _, high = self.consumer.get_watermark_offsets(
            TopicPartition(self._topic, partition), cached=True
        )
        return int(high)

    def unassign(self, partitions: range) -> None:
        """Stop reading ``partitions`` (a shard's lease is gone); the consumer stays,
        warm, for the next time."""
        if self._consumer is None:
            return
        mine = {tp.partition for tp in self._consumer.assignment()}
        tps = [TopicPartition(self._topic, p) for p in partitions if p in mine]
        if tps:
            self._consumer.incremental_unassign(tps)

    def group_metadata(self) -> Any:
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        reader, self._lease_reader = self._lease_reader, None
        for c in (consumer, reader):
            if c is not None:
                c.close()

    def renew(self) -> None:
        """A new consumer in place of this one (after a failed takeover).

        A long-lived consumer can keep asking a group coordinator it cached before
        a broker restart and never learn the new one (seen in the chaos suite:
        fetching the committed timer offsets timed out every 30 s for minutes
        while a fresh client answered at once; librdkafka #5511 is the same
        shape). The old one is closed on a daemon thread: closing a client in that
        state may block.
        """
        old, self._consumer = self._consumer, None
        reader, self._lease_reader = self._lease_reader, None
        for c in (old, reader):
            if c is not None:
                threading.Thread(target=_close_quietly, args=(c,), daemon=True).start()
        self.start()


def _close_quietly(consumer: Consumer) -> None:
    with contextlib.suppress(Exception):
        consumer.close()


_RETRY_S = 0.02  # between two asks for committed offsets after a retriable error
_COORDINATOR_MOVED = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._TRANSPORT,
)
