"""The active emitter's consumer of the timer topic.

It is assigned the partitions of every shard the process drives (no group
subscription: the lease decides who reads) at the committed offsets of the
emitter's offsets group (one group for all shards: each shard's transactions
commit only its own partitions), reads with ``read_committed`` and reports
partition ends. Partitions
are paused and resumed by the drainer; pausing always seeks to the offset to
read next, so messages fetched past it are dropped and fetched again on
resume.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names
from dueflow.rules.drain import Checkpoint


class WheelSource:
    """Reads the timer topic; one per process, shared by the shards it drives."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._topic = names(settings).timers
        self._group = names(settings).emitter_offsets_group
        self._consumer: Consumer | None = None

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
            },
        )
        # The metadata is cached: an assignment at takeover need not ask for it
        # (if this fails, it is asked for then).
        with contextlib.suppress(KafkaException):
            self._consumer.list_topics(self._topic, timeout=10.0)

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
        try:
            got = self.consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error("fetch committed timer offsets", exc) from exc
        out: dict[int, tuple[int, Checkpoint | None]] = {}
        for tp in got:
            offset = tp.offset if tp.offset >= 0 else -1
            out[tp.partition] = (offset, Checkpoint.decode(tp.metadata) if offset >= 0 else None)
        return out

    def committed_elsewhere(
        self, topic: str, partitions: int, timeout_s: float = 30.0
    ) -> dict[int, int]:
        """Committed offsets of another topic in the emitter's offsets group (0: none)."""
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        try:
            got = self.consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(f"fetch committed offsets of {topic}", exc) from exc
        return {tp.partition: max(tp.offset, 0) for tp in got}

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
        if consumer is not None:
            consumer.close()

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
        if old is not None:
            threading.Thread(target=_close_quietly, args=(old,), daemon=True).start()
        self.start()


def _close_quietly(consumer: Consumer) -> None:
    with contextlib.suppress(Exception):
        consumer.close()
