"""The queues the emitter fires into: static and registered, current with the registry.

Active and standby emitters read the queue registry at start and tail it in
their loop (:meth:`EmitterQueues.poll`), so a queue created while they run
gets its jobs without a restart. :class:`QueueTopics` maps a timer's
``df-queue`` header to its exec topic; its dicts are updated in place, so the
drainer's references stay current.

A timer that names a queue not known yet is not quarantined at once: the
emitter first reads the registry to its end (:meth:`EmitterQueues.learn`),
because its tail may simply be behind the producer that saw the queue. The
SDK only writes timers for queues it saw registered, so a read that started
after the timer was appended (broker time, with a margin) finds the queue if
it exists; timers appended before the last such read are judged by it
without asking again, which bounds the reads a flood of bad timers costs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Message, TopicPartition

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import QueueSpec, Settings
from dueflow.kafka.queue_reader import BadQueueRecord, QueueRegistryReader
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records.queue_registry import QueueView
from dueflow.records.set_aside import RecordLimit
from dueflow.rules.drain import classify_timer
from dueflow.streams.emitter.quarantine_records import count_cut, quarantine_record

log = logging.getLogger("dueflow.emitter.queues")

# How far a timer's append time (one broker's clock) and the emitter's estimate
# of broker time (another broker's) may disagree.
CLOCK_MARGIN_MS = 1_000
CATCH_UP_S = 2.0


class QueueTopics:
    """``df-queue`` value -> exec topic and its partition count, and exec topic ->
    queue (updated in place)."""

    def __init__(self, settings: Settings) -> None:
        self._names = names(settings)
        self.exec_topics: dict[bytes, str] = {}
        self.exec_partitions: dict[bytes, int] = {}
        self.queue_of_topic: dict[str, str] = {}
        self.update(settings.queues)

    def update(self, queues: Iterable[QueueSpec]) -> None:
        """Make the maps those of ``queues``."""
        specs = {q.name.encode(): q for q in queues}
        for raw in [r for r in self.exec_topics if r not in specs]:
            del self.exec_topics[raw]
            self.exec_partitions.pop(raw, None)
        self.exec_topics.update({raw: self._names.exec(q.name) for raw, q in specs.items()})
        self.exec_partitions.update({raw: q.partitions for raw, q in specs.items()})
        self.queue_of_topic.clear()
        self.queue_of_topic.update({t: q.decode() for q, t in self.exec_topics.items()})

    def learn(self, queue: bytes, appended_ms: int) -> bool:
        """Static queues only: a queue not known is not known."""
        return False

    def classify_again(
        self, m: Message, headers: Any, reason: str
    ) -> tuple[int, str, bool, int] | str:
        """A timer classified bad (``reason``): when for a queue not known, ask the
        registry first (it may have been created a moment ago); classify it again
        if it exists."""
        if reasons.reason_label(reason) != reasons.UNKNOWN_QUEUE:
            return reason
        queue = hdr.header(headers, hdr.QUEUE)
        if queue is None or not self.learn(queue, m.timestamp()[1]):
            return reason
        return classify_timer(headers, m.key(), self.exec_topics, self.exec_partitions)


class RegistryQuarantine:
    """The active emitter quarantines each bad registry record once: the offset it
    quarantined up to commits with the quarantine records, in the emitter's
    offsets group (as for bad schedule records, see cron_keeper)."""

    def __init__(
        self,
        *,
        topic: str,
        quarantine_topic: str,
        send: Callable[[str, bytes | None, bytes | None, list[Any]], None],
        metrics: Metrics,
        limit: Callable[[], RecordLimit] | None = None,
    ) -> None:
        self._limit = limit
        self._topic = topic
        self._quarantine_topic = quarantine_topic
        self._send = send
        self._metrics = metrics
        self._to = 0
        self._dirty = False

    def start(self, quarantined_to: int) -> None:
        self._to = quarantined_to

    def put(self, bad: Iterable[BadQueueRecord], now_ms: int) -> None:
        for b in bad:
            if b.offset < self._to:
                continue  # an earlier emitter quarantined it
            record = quarantine_record(
                reason=reasons.with_detail(reasons.BAD_QUEUE_RECORD, b.reason),
                topic=self._topic,
                partition=b.partition,
                offset=b.offset,
                key=b.key,
                value=b.value,
                headers=b.headers,
                at_ms=now_ms,
                limit=None if self._limit is None else self._limit(),
            )
            self._send(self._quarantine_topic, record.value, record.key, record.headers)
            count_cut(self._metrics, record)
            self._metrics.quarantined.labels("emitter", reasons.BAD_QUEUE_RECORD).inc()
            event(log, "queue registry record quarantined", logging.WARNING, offset=b.offset)
            self._to = b.offset + 1
            self._dirty = True

    def commit_offsets(self) -> list[TopicPartition]:
        if not self._dirty:
            return []
        self._dirty = False
        return [TopicPartition(self._topic, 0, self._to)]


class EmitterQueues(QueueTopics):
    """:class:`QueueTopics` kept current with the queue registry."""

    def __init__(self, settings: Settings, *, clock_ms: Callable[[], int]) -> None:
        super().__init__(settings)
        self._clock = clock_ms
        self.reader = QueueRegistryReader(
            settings,
            group=names(settings).emitter_offsets_group,  # assign-only, never commits
            component="emitter",
        )
        self._read_from_ms = -1  # broker time (estimate) the last full read started
        self.checks = 0  # reads to the end asked for by unknown queues (for tests)

    @property
    def topic(self) -> str:
        return self.reader.topic

    @property
    def view(self) -> QueueView:
        return self.reader.view

    def start(self, timeout_s: float = 30.0) -> None:
        self.reader.start()
        self._read_from_ms = self._clock()
        self.reader.catch_up(timeout_s)
        self.reader.log_conflicts()
        self._sync()

    def poll(self) -> bool:
        """Read what arrived; True when the queues changed."""
        if not self.reader.poll(0.0):
            return False
        self._sync()
        return True

    def knows(self, queue: str) -> bool:
        """Whether ``queue`` exists, reading the registry to its end first if it is
        not known (a schedule naming it may have been read before the registry)."""
        if queue in self.view:
            return True
        self._read_to_end()
        return queue in self.view

    def learn(self, queue: bytes, appended_ms: int) -> bool:
        """A timer appended at ``appended_ms`` (broker time) names ``queue``, not
        known: True when reading the registry to its end finds it (see the module doc)."""
        if queue in self.exec_topics:
            return True
        if appended_ms < self._read_from_ms - CLOCK_MARGIN_MS:
            return False  # the last read started after this timer was written
        self._read_to_end()
        return queue in self.exec_topics

    def take_bad(self) -> list[BadQueueRecord]:
        """The bad registry records read since the last call."""
        bad, self.reader.bad = self.reader.bad, []
        return bad

    def _read_to_end(self) -> None:
        self.checks += 1
        self._read_from_ms = self._clock()
        self.reader.catch_up(CATCH_UP_S)
        self._sync()

    def _sync(self) -> None:
        before = set(self.exec_topics)
        self.update(self.view.specs.values())
        self.reader.take_changes()
        added = sorted(r.decode() for r in set(self.exec_topics) - before)
        if added:
            event(log, "emitter fires into new queues", queues=added)

    def close(self) -> None:
        self.reader.close()
