"""Wait for the owner's verdict on a command: the outcome carrying its id (I/O edge).

The worker that owns a job's exec partition answers every command with an
outcome in ``<prefix>.outcomes``, keyed by job id, with ``command_id`` set,
in the transaction that applies it. :class:`VerdictWatch` notes the end of
the job id's outcomes partition *before* the command is written
(:meth:`VerdictWatch.mark`), then reads from there until that outcome
(:meth:`VerdictWatch.wait`): only what was appended meanwhile is read, and no
status view is needed. A read_committed consumer, so a verdict is seen only
once its transaction committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import UndecodableRecord
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names
from dueflow.producers.steering_commands import Verdict, verdict_of
from dueflow.records import codec
from dueflow.rules.partitioning import partition_for_key


class Mark(NamedTuple):
    """Where a job's outcomes partition ended before a command was written."""

    job_id: str
    partition: int
    offset: int


class Verdicts(Protocol):
    """How a client waits for verdicts (Kafka, or the in-memory log)."""

    def mark(self, job_id: str) -> Mark: ...

    def wait(self, mark: Mark, command_id: str, timeout_s: float) -> Verdict | None: ...

    def close(self) -> None: ...


def outcome_verdict(
    key: bytes | None, value: bytes | None, headers: Any, job_id: str, command_id: str
) -> Verdict | None:
    """The verdict in one outcome record when it answers ``command_id``, else None."""
    if key != job_id.encode() or value is None:
        return None
    schema = hdr.header(headers, hdr.SCHEMA)
    if schema is None or not schema.endswith(b"/3"):
        return None  # only version 3 outcomes carry a command id
    try:
        outcome = codec.decode("outcome", value, writer_version=3)
    except UndecodableRecord:
        return None
    if outcome.get("command_id") != command_id:
        return None
    return verdict_of(outcome)


class VerdictWatch:
    """:class:`Verdicts` over the outcomes topic: assign-only consumers, made when
    needed and kept for the next call. Calls from several threads wait at once, each
    with a consumer of its own (threads sharing one client do not queue behind each
    other's waits)."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._topic = names(settings).outcomes
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: list[Consumer] = []
        self._closed = False
        self._partitions: int | None = None

    def _take(self) -> Consumer:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        consumer = make_consumer(
            self._settings,
            f"{names(self._settings).prefix}.verdicts",  # assign-only, never joined
            **{"enable.partition.eof": False, "fetch.wait.max.ms": 50},
        )
        # A new client knows no partition until it has read the topic's metadata
        # (asking for watermarks first fails with "unknown partition").
        try:
            md = consumer.list_topics(self._topic, timeout=10)
        except KafkaException as exc:
            consumer.close()
            raise kafka_error(f"metadata of {self._topic}", exc) from exc
        if self._partitions is None:
            found = md.topics.get(self._topic)
            count = len(found.partitions) if found is not None and found.partitions else 0
            self._partitions = count or self._settings.outcomes_partitions
        return consumer

    def _give(self, consumer: Consumer) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(consumer)
                return
        consumer.close()

    def _partition_of(self, job_id: str) -> int:
        assert self._partitions is not None  # read by the first consumer made
        return partition_for_key(job_id.encode(), self._partitions)

    def mark(self, job_id: str) -> Mark:
        """The end of ``job_id``'s outcomes partition now (its last stable offset)."""
        consumer = self._take()
        try:
            partition = self._partition_of(job_id)
            try:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(self._topic, partition), timeout=10, cached=False
                )
            except KafkaException as exc:
                raise kafka_error(f"watermarks of {self._topic}[{partition}]", exc) from exc
            return Mark(job_id, partition, max(0, int(high)))
        finally:
            self._give(consumer)

    def wait(self, mark: Mark, command_id: str, timeout_s: float) -> Verdict | None:
        """The verdict on ``command_id``, read from ``mark`` on; None when none came
        within ``timeout_s``."""
        deadline = self._clock() + timeout_s
        consumer = self._take()
        consumer.assign([TopicPartition(self._topic, mark.partition, mark.offset)])
        try:
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    return None
                for msg in consumer.consume(500, min(0.2, left)):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise kafka_error(f"reading {self._topic}", KafkaException(err))
                        continue
                    found = outcome_verdict(
                        msg.key(), msg.value(), msg.headers(), mark.job_id, command_id
                    )
                    if found is not None:
                        return found
        finally:
            consumer.unassign()
            self._give(consumer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for consumer in idle:
            consumer.close()
