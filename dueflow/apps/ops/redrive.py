"""Redrive dead jobs: send DLQ records back to their exec topic with a fresh attempt budget.

A worker skips a key whose idempotency state is final, so a redrive must
clear the ``dead`` state. For every DLQ record chosen, one transaction
(``transactional.id`` ``<prefix>.redrive``, fixed, so two redrive runs fence
each other) writes, on the record's partition p (explicit: a job keeps its
partition):

1. a tombstone for the key in ``<prefix>.idempotency.<queue>`` (forgets
   ``dead``),
2. the job again in ``<prefix>.exec.<queue>``: the DLQ record's
   ``job_value`` bytes and job headers, attempt 1, ``df-due`` now, and
   ``df-redriven-by`` / ``df-redriven-at`` / ``df-redriven-from``,
3. an outcome ``fired`` for the status view.

A dead letter that keeps the job's value by reference (``df-value-ref``: it
did not fit the DLQ topic) is redriven with the value read from the record
it names; one whose record is gone, or whose redriven record would exceed the
exec topic's ``max.message.bytes``, is reported with the reason and the run
goes on (:mod:`dueflow.apps.ops.redrive_input`).

It is idempotent. Before writing, and after ``init_transactions`` (so any
other redrive run is fenced or finished), the key's state is read from
partition p of the idempotency topic: a record is redriven only while the
key is ``dead`` with the very death this DLQ record reports (same time), so
redriving the same record twice, one after the other or from two processes
at once, runs the job once. Otherwise it is reported: already redriven
(pending or done), died again later (redrive the newer record), cancelled.
Writes are bounded to ``rate_per_s`` records per second.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from dueflow import headers as hdr
from dueflow.apps.ops.dlq import DeadLetterEntry, DlqFilter, latest_per_key, read_dead_letters
from dueflow.apps.ops.redrive_input import JobBytes, resolve, size_verdict
from dueflow.config import Settings
from dueflow.errors import (
    DueflowError,
    FencedError,
    InvalidInput,
    KafkaOperationError,
    UndecodableRecord,
)
from dueflow.kafka.clients import kafka_error, make_transactional_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.reading import Span, offsets_for_time, ops_consumer, read_spans, watermarks
from dueflow.kafka.topic_limits import TopicLimits, producer_max_bytes
from dueflow.kafka.topics import names
from dueflow.records.size_budget import BY_MAX_CHARS, DEFAULT_MAX_MESSAGE_BYTES
from dueflow.records.worker_codec import decode_key_state, encode_outcome, outcome_header
from dueflow.wall_clock import wall_ms

# Headers of a job's failed attempts: a redriven job starts over.
_FAILURE_HEADERS = (hdr.FIRST_FAILURE, hdr.LAST_FAILURE, hdr.ERROR, hdr.ORIGIN)
# The idempotency record of a death is written at commit time, after dead_ms;
# its state is read from this long before the oldest death (clock skew margin).
STATE_SLACK_MS = 10 * 60_000

KeyState = tuple[str, int] | None  # (state, at_ms); None: no state (never, or cleared)


def redrive_headers(
    job_headers: Mapping[str, bytes], *, by: str, at_ms: int, source: str
) -> list[tuple[str, bytes]]:
    """Headers of the redriven exec record (pure): the job's own, attempt 1, due now,
    who/when/from; the failure headers of earlier attempts dropped."""
    kept = [(k, v) for k, v in job_headers.items() if k not in _FAILURE_HEADERS]
    return hdr.replace(
        kept,
        [
            (hdr.ATTEMPT, 1),
            (hdr.DUE, at_ms),
            (hdr.REDRIVEN_BY, by),
            (hdr.REDRIVEN_AT, at_ms),
            (hdr.REDRIVEN_FROM, source),
        ],
    )


def redrive_verdict(entry: DeadLetterEntry, state: KeyState, *, latest: bool) -> str | None:
    """Why ``entry`` must not be redriven now (pure); None when it may."""
    if entry.record is None:
        return f"the DLQ record does not decode ({entry.problem})"
    if not entry.idempotency_key or entry.key is None:
        return "the job has no idempotency key"
    if not latest:
        return "a newer DLQ record of the same key exists: redrive that one"
    if state is None:
        return "already redriven (its key has no state: pending, or the state expired)"
    name, at_ms = state
    if name == "done":
        return "already redriven and done"
    if name == "cancelled":
        return "the job was cancelled"
    if name == "retrying":
        return "already redriven: it is being retried"
    if at_ms != entry.dead_ms:
        return "the job was redriven and died again: redrive its newer DLQ record"
    return None


def dead_letter_state(entry: DeadLetterEntry, state: KeyState, *, latest: bool) -> str:
    """What became of a dead letter since it was written (pure), for ``dlq list``:
    ``dead`` while its key still has this death (it may be redriven), else
    ``redriven`` (pending again), ``redriven, running`` (retrying), ``redriven,
    done``, ``redriven, dead again`` (see its newer dead letter), ``cancelled``;
    ``-`` when it cannot be told (no key, or a record that does not decode)."""
    if entry.record is None or not entry.idempotency_key or entry.key is None:
        return "-"
    if not latest:
        return "redriven, dead again"
    if state is None:
        return "redriven"
    name, at_ms = state
    if name == "done":
        return "redriven, done"
    if name == "cancelled":
        return "cancelled"
    if name == "retrying":
        return "redriven, running"
    return "dead" if at_ms == entry.dead_ms else "redriven, dead again"


WOULD_REDRIVE = "dry run: would redrive"


@dataclass(frozen=True, slots=True)
class RedriveItem:
    entry: DeadLetterEntry
    redriven: bool
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        out = self.entry.summary()
        out["redriven"] = self.redriven
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class RedriveReport:
    queue: str
    dry_run: bool
    by: str
    items: list[RedriveItem] = field(default_factory=list)
    error: str | None = None  # the run stopped early: what was not redriven says so

    @property
    def redriven(self) -> int:
        return sum(1 for i in self.items if i.redriven)

    @property
    def skipped(self) -> int:
        return sum(1 for i in self.items if not i.redriven)

    @property
    def would_redrive(self) -> int:
        """A dry run: how many it would redrive (the others are skipped, with why)."""
        return sum(1 for i in self.items if i.why == WOULD_REDRIVE)

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "dry_run": self.dry_run,
            "by": self.by,
            "redriven": self.redriven,
            "skipped": self.skipped,
            "would_redrive": self.would_redrive,
            "error": self.error,
            "items": [i.to_json() for i in self.items],
        }


class Redriver:
    """Redrives the DLQ records of one queue that a filter selects."""

    def __init__(
        self,
        settings: Settings,
        *,
        by: str,
        rate_per_s: float = 100.0,
        batch: int = 100,
        clock: Callable[[], int] = wall_ms,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_per_s <= 0:
            raise InvalidInput("rate", rate_per_s, "records per second > 0")
        if batch < 1:
            raise InvalidInput("batch", batch, "an integer >= 1")
        if not isinstance(by, str) or len(by) > BY_MAX_CHARS:
            raise InvalidInput("by", by, f"who redrives: at most {BY_MAX_CHARS} characters")
        self._settings = settings
        self._names = names(settings)
        self._by = by
        self._rate = rate_per_s
        self._batch = batch
        self._clock = clock
        self._sleep = sleep

    def run(
        self,
        queue: str,
        where: DlqFilter | None = None,
        *,
        dry_run: bool = False,
        limit: int | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> RedriveReport:
        """Redrive (or with ``dry_run`` only check) what ``where`` selects: at most
        ``limit`` records that may be redriven, oldest first."""
        self._settings.queue(queue)
        report = RedriveReport(queue, dry_run, self._by)
        consumer = ops_consumer(self._settings)
        producer: Producer | None = None
        try:
            entries = read_dead_letters(self._settings, consumer, queue, where=where)
            entries.sort(key=lambda e: (e.dead_ms, e.partition, e.offset))
            if not entries:
                return report
            if not dry_run:
                # Fence every other redrive run before reading states.
                producer = make_transactional_producer(
                    self._settings,
                    f"{self._names.prefix}.redrive",
                    **{"transaction.timeout.ms": 60_000},
                )
                _call("init_transactions", producer.init_transactions, 60)
            states = self._states(consumer, queue, entries)
            latest = latest_per_key(entries)
            todo: list[DeadLetterEntry] = []
            for e in entries:
                key = e.idempotency_key or ""
                newest = latest.get((e.partition, key))
                why = redrive_verdict(
                    e, states.get((e.partition, key)), latest=newest is None or newest is e
                )
                if why is None:
                    todo.append(e)
                else:
                    report.items.append(RedriveItem(e, False, why))
            jobs = self._jobs(consumer, queue, todo, report)
            todo = [e for e in todo if (e.partition, e.offset) in jobs]
            if limit is not None:
                todo = todo[:limit]  # the oldest redrivable ones
            if dry_run or producer is None:
                report.items.extend(RedriveItem(e, False, WOULD_REDRIVE) for e in todo)
                return report
            try:
                self._write(producer, queue, todo, jobs, report, on_progress)
            except DueflowError as exc:
                report.error = str(exc)
                finished = {(i.entry.partition, i.entry.offset) for i in report.items}
                report.items.extend(
                    RedriveItem(e, False, f"not written: {exc}")
                    for e in todo
                    if (e.partition, e.offset) not in finished
                )
            return report
        finally:
            consumer.close()
            if producer is not None:
                # A fenced producer raises its fatal error here again: what the
                # run raised (or its report) is the answer, not this.
                with contextlib.suppress(KafkaException):
                    served(producer.flush, 5)

    # ------------------------------------------------------------------ states
    def key_states(
        self, consumer: Any, queue: str, entries: Sequence[DeadLetterEntry]
    ) -> dict[tuple[int, str], KeyState]:
        """The current state of each entry's key (``dlq list`` shows what became of it)."""
        return self._states(consumer, queue, entries)

    def _states(
        self, consumer: Any, queue: str, entries: Sequence[DeadLetterEntry]
    ) -> dict[tuple[int, str], KeyState]:
        """The current state of each entry's key, from its idempotency partition."""
        topic = self._names.idempotency(queue)
        wanted: dict[int, set[bytes]] = {}
        oldest: dict[int, int] = {}
        for e in entries:
            if e.key is None:
                continue
            wanted.setdefault(e.partition, set()).add(e.key)
            oldest[e.partition] = min(oldest.get(e.partition, e.dead_ms), e.dead_ms)
        marks = watermarks(consumer, topic, wanted)
        spans = []
        for p, (low, high) in marks.items():
            start = offsets_for_time(consumer, topic, [p], oldest[p] - STATE_SLACK_MS)[p]
            spans.append(Span(topic, p, high if start is None else max(low, start), high))
        states: dict[tuple[int, str], KeyState] = {}

        def take(msg: Any) -> None:
            key = msg.key()
            p = msg.partition()
            if key not in wanted.get(p, ()):
                return
            text = key.decode("utf-8", "replace")
            value = msg.value()
            if value is None:
                states[(p, text)] = None
                return
            try:
                name, at_ms, _attempts = decode_key_state(
                    value, hdr.header(msg.headers(), hdr.SCHEMA)
                )
                states[(p, text)] = (name, at_ms)
            except UndecodableRecord:
                return  # not a state: the worker quarantines it; it changes nothing

        read_spans(consumer, spans, take)
        return states

    def _jobs(
        self,
        consumer: Any,
        queue: str,
        todo: Sequence[DeadLetterEntry],
        report: RedriveReport,
    ) -> dict[tuple[int, int], JobBytes]:
        """The value and headers to redrive of each of ``todo`` (read where a dead
        letter keeps them by reference); those that cannot be had, or would not fit
        the exec topic, go to ``report`` as not redriven."""
        found = resolve(consumer, todo)
        topic = self._names.exec(queue)
        got = TopicLimits(self._settings).describe([topic]) if todo else {}
        max_bytes = got.get(topic, DEFAULT_MAX_MESSAGE_BYTES)
        producer = producer_max_bytes(self._settings)
        now = self._clock()
        out: dict[tuple[int, int], JobBytes] = {}
        for e in todo:
            job = found.get((e.partition, e.offset), "the DLQ record does not decode")
            if isinstance(job, str):
                report.items.append(RedriveItem(e, False, job))
                continue
            headers = redrive_headers(
                job.headers, by=self._by, at_ms=now, source=f"{e.topic}:{e.partition}:{e.offset}"
            )
            why = size_verdict(topic, max_bytes, producer, e.key, job.value, headers)
            if why is not None:
                report.items.append(RedriveItem(e, False, why))
                continue
            out[(e.partition, e.offset)] = job
        return out

    # ------------------------------------------------------------------ writes
    def _write(
        self,
        producer: Producer,
        queue: str,
        todo: Sequence[DeadLetterEntry],
        jobs: Mapping[tuple[int, int], JobBytes],
        report: RedriveReport,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        exec_topic = self._names.exec(queue)
        idem_topic = self._names.idempotency(queue)
        began = time.monotonic()
        done = 0
        for chunk in _chunks(todo, self._batch):
            _call("begin_transaction", producer.begin_transaction)
            try:
                self._write_chunk(producer, queue, chunk, jobs, exec_topic, idem_topic)
                _call("commit_transaction", producer.commit_transaction, 60)
            except DueflowError:
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(30)
                raise
            report.items.extend(RedriveItem(e, True) for e in chunk)
            done += len(chunk)
            if on_progress is not None:
                on_progress(done, len(todo))
            # Bounded rate: never ahead of rate_per_s since the start.
            ahead = done / self._rate - (time.monotonic() - began)
            if ahead > 0:
                self._sleep(ahead)

    def _write_chunk(
        self,
        producer: Producer,
        queue: str,
        chunk: Sequence[DeadLetterEntry],
        jobs: Mapping[tuple[int, int], JobBytes],
        exec_topic: str,
        idem_topic: str,
    ) -> None:
        now = self._clock()
        for e in chunk:
            job = jobs[(e.partition, e.offset)]
            assert e.key is not None
            source = f"{e.topic}:{e.partition}:{e.offset}"
            _produce(producer, idem_topic, None, e.key, e.partition, [])
            _produce(
                producer,
                exec_topic,
                job.value,
                e.key,
                e.partition,
                redrive_headers(job.headers, by=self._by, at_ms=now, source=source),
            )
            _produce(
                producer,
                self._names.outcomes,
                encode_outcome(
                    job_id=e.job_id,
                    queue=queue,
                    task=e.task,
                    idempotency_key=e.idempotency_key or "",
                    state="fired",
                    attempt=1,
                    at_ms=now,
                    worker=f"redrive:{self._by}",
                ),
                e.job_id.encode(),
                None,
                [(hdr.SCHEMA, outcome_header("fired"))],
            )


def _chunks(items: Sequence[DeadLetterEntry], size: int) -> Iterable[Sequence[DeadLetterEntry]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes,
    partition: int | None,
    headers: list[tuple[str, bytes]],
) -> None:
    produce: Callable[..., None] = producer.produce  # headers: list[tuple[str, bytes]]
    while True:
        try:
            if partition is None:
                produce(topic, value, key, headers=headers)
            else:
                produce(topic, value, key, partition, headers=headers)
            return
        except BufferError:
            served(producer.poll, 0.05)


def _call(what: str, fn: Callable[..., Any], *args: Any) -> None:
    """A transactional call; fencing (another redrive took over) is a FencedError."""
    try:
        fn(*args)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        fenced = err is not None and (
            getattr(err, "fatal", lambda: False)() or "fenced" in str(err).lower()
        )
        if fenced:
            raise FencedError(
                f"redrive {what}: another redrive run took over ({err}); nothing of this "
                "batch was written, run again to finish"
            ) from exc
        wrapped: KafkaOperationError = kafka_error(f"redrive {what}", exc)
        raise wrapped from exc
