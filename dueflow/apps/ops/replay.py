"""Replay: produce the records of an exec or retry topic range again, so that workers
run what is not done yet.

Each committed record of ``[from, to)`` is written again to the same topic
and the **same partition** (explicit: a job keeps its partition, where its
idempotency state lives), key, value and headers unchanged, plus
``df-replayed-from`` (``topic:partition:offset``), ``df-replayed-by`` and
``df-replayed-at``. A record that would then exceed the topic's
``max.message.bytes`` (or the producer's ``message.max.bytes``) is not
written: the report lists it with the reason, and the run goes on. A retry
record keeps its ``df-due``: a replay never runs
a job early. Replaying is safe because workers skip a key whose state is
final (done, dead, cancelled): only jobs that never finished run. Writes are
bounded to ``rate_per_s`` records per second. Bounds are offsets or times
(``offsets_for_times``); ``to`` defaults to the end of each partition as of
the start of the replay, so the replayed records themselves are never read.
Commands in the range (``df-kind`` steer, ...: :mod:`dueflow.records.command`)
are not written again: they were applied when they were first read (a worker
ignores a replayed one anyway); the report counts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer

from dueflow import headers as hdr
from dueflow.apps.ops.bounds import Bound
from dueflow.config import Settings
from dueflow.errors import InvalidInput, KafkaOperationError
from dueflow.kafka.clients import make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.reading import Span, offsets_for_time, partitions_of, read_spans, watermarks
from dueflow.kafka.topic_limits import TopicLimits, producer_max_bytes
from dueflow.kafka.topics import names
from dueflow.records.record_size import producer_size, record_size
from dueflow.records.size_budget import BY_MAX_CHARS, DEFAULT_MAX_MESSAGE_BYTES
from dueflow.wall_clock import wall_ms


def replayable_topics(settings: Settings) -> dict[str, str]:
    """Topic name -> queue, for every exec and retry-tier topic of the configured queues."""
    n = names(settings)
    out = {}
    for q in settings.queues:
        out[n.exec(q.name)] = q.name
        for tier in q.retry_tiers_ms:
            out[n.retry(q.name, tier)] = q.name
    return out


def replay_headers(
    headers: Sequence[tuple[str, bytes | None]] | None, *, source: str, by: str, at_ms: int
) -> list[tuple[str, bytes]]:
    """The record's headers unchanged, plus where it was replayed from, by whom, when
    (pure)."""
    return hdr.replace(
        headers,
        [(hdr.REPLAYED_FROM, source), (hdr.REPLAYED_BY, by), (hdr.REPLAYED_AT, at_ms)],
    )


def plan_spans(
    settings: Settings,
    consumer: Consumer,
    topic: str,
    *,
    start: Bound,
    end: Bound | None = None,
    partitions: Sequence[int] = (),
) -> list[Span]:
    """The offsets ``[start, end)`` of each chosen partition of ``topic``."""
    if topic not in replayable_topics(settings):
        raise InvalidInput(
            "topic", topic, f"an exec or retry topic: {sorted(replayable_topics(settings))}"
        )
    parts = partitions_of(consumer, topic)
    for p in partitions:
        if p not in parts:
            raise InvalidInput("partition", p, f"a partition of {topic} ({parts})")
    chosen = list(partitions) or parts
    marks = watermarks(consumer, topic, chosen)

    def resolve(bound: Bound, p: int, found: dict[int, int | None] | None) -> int:
        low, high = marks[p]
        if bound.offset is not None:
            return min(max(bound.offset, low), high)
        assert found is not None
        at = found[p]
        return high if at is None else max(at, low)

    found_start = (
        offsets_for_time(consumer, topic, chosen, start.time_ms)
        if start.time_ms is not None
        else None
    )
    found_end = (
        offsets_for_time(consumer, topic, chosen, end.time_ms)
        if end is not None and end.time_ms is not None
        else None
    )
    spans = []
    for p in chosen:
        first = resolve(start, p, found_start)
        last = resolve(end, p, found_end) if end is not None else marks[p][1]
        spans.append(Span(topic, p, first, max(first, last)))
    return spans


@dataclass(frozen=True, slots=True)
class ReplayedRecord:
    partition: int
    offset: int
    key: str | None
    job_id: str | None
    attempt: int
    due_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "due_ms": self.due_ms,
        }


@dataclass
class ReplayReport:
    topic: str
    dry_run: bool
    by: str
    spans: list[Span]
    records: list[ReplayedRecord] = field(default_factory=list)
    # records not written again, and why (too large for the topic now)
    refused: list[tuple[ReplayedRecord, str]] = field(default_factory=list)
    commands_skipped: int = 0

    @property
    def replayed(self) -> int:
        return 0 if self.dry_run else len(self.records) - len(self.refused)

    def to_json(self, *, limit: int = 1000) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "dry_run": self.dry_run,
            "by": self.by,
            "replayed": self.replayed,
            "records": len(self.records),
            "not_replayed": [{**r.to_json(), "why": why} for r, why in self.refused[:limit]],
            "commands_skipped": self.commands_skipped,
            "ranges": [
                {"partition": s.partition, "from": s.start, "to": s.end} for s in self.spans
            ],
            "listed": [r.to_json() for r in self.records[:limit]],
        }


def _describe(msg: Any) -> ReplayedRecord:
    headers = msg.headers()
    key = msg.key()
    try:
        due = hdr.header_int(headers, hdr.DUE)
        attempt = hdr.header_int(headers, hdr.ATTEMPT) or 1
    except ValueError:
        due, attempt = None, 1
    return ReplayedRecord(
        partition=int(msg.partition()),
        offset=int(msg.offset()),
        key=None if key is None else key.decode("utf-8", "replace"),
        job_id=hdr.header_text(headers, hdr.JOB_ID),
        attempt=attempt,
        due_ms=due,
    )


def _too_large(
    topic: str,
    max_bytes: int,
    producer_max: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
) -> str | None:
    """Why a record replayed with ``headers`` would not be written (pure)."""
    size = record_size(key, value, headers)
    if size > max_bytes:
        return (
            f"the replayed record would be {size} bytes, over max.message.bytes "
            f"{max_bytes} of {topic}"
        )
    psize = producer_size(key, value, headers)
    if psize > producer_max:
        return (
            f"the replayed record would be {psize} bytes, over the producer's "
            f"message.max.bytes {producer_max}"
        )
    return None


class Replayer:
    """Reads spans and produces their records again (idempotent producer, acks=all)."""

    def __init__(
        self,
        settings: Settings,
        *,
        by: str,
        rate_per_s: float = 1000.0,
        clock: Callable[[], int] = wall_ms,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_per_s <= 0:
            raise InvalidInput("rate", rate_per_s, "records per second > 0")
        if not isinstance(by, str) or len(by) > BY_MAX_CHARS:
            raise InvalidInput("by", by, f"who replays: at most {BY_MAX_CHARS} characters")
        self._settings = settings
        self._by = by
        self._rate = rate_per_s
        self._clock = clock
        self._sleep = sleep

    def run(
        self,
        consumer: Consumer,
        topic: str,
        spans: list[Span],
        *,
        dry_run: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ReplayReport:
        report = ReplayReport(topic, dry_run, self._by, spans)
        total = sum(s.size for s in spans)
        producer: Producer | None = None if dry_run else make_producer(self._settings)
        began = time.monotonic()
        failed: list[Any] = []
        max_bytes = DEFAULT_MAX_MESSAGE_BYTES
        if producer is not None:
            max_bytes = TopicLimits(self._settings).describe([topic]).get(topic, max_bytes)
        producer_max = producer_max_bytes(self._settings)

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        def take(msg: Any) -> None:
            if hdr.is_command(msg.headers()):
                report.commands_skipped += 1
                return
            described = _describe(msg)
            report.records.append(described)
            if producer is not None:
                source = f"{msg.topic()}:{msg.partition()}:{msg.offset()}"
                headers = replay_headers(
                    msg.headers(), source=source, by=self._by, at_ms=self._clock()
                )
                why = _too_large(topic, max_bytes, producer_max, msg.key(), msg.value(), headers)
                if why is not None:
                    report.refused.append((described, why))
                    return
                produce: Callable[..., None] = producer.produce
                while True:
                    try:
                        produce(
                            topic,
                            msg.value(),
                            msg.key(),
                            msg.partition(),
                            headers=headers,
                            on_delivery=on_delivery,
                        )
                        break
                    except BufferError:
                        served(producer.poll, 0.05)
                served(producer.poll, 0)
                ahead = len(report.records) / self._rate - (time.monotonic() - began)
                if ahead > 0:
                    self._sleep(ahead)
            if on_progress is not None and len(report.records) % 100 == 0:
                on_progress(len(report.records), total)

        try:
            read_spans(consumer, spans, take, timeout_s=max(120.0, 2 * total / self._rate))
        finally:
            if producer is not None:
                left = served(producer.flush, 60)
                if left or failed:
                    raise KafkaOperationError(
                        f"replay of {topic}: {left} records not delivered, "
                        f"{len(failed)} failed ({failed[:3]}); replaying again is safe"
                    )
        if on_progress is not None:
            on_progress(len(report.records), len(report.records))
        return report
