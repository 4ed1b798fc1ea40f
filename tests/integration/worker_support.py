"""Helpers for worker tests: topics, a worker on a thread, a ledger, topic readers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.consumers import TaskContext, task
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.worker_process import Worker
from dueflow.kafka.clients import make_admin, make_transactional_producer
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from tests.chaos.facts import Dropped
from tests.conftest import KafkaCluster

# What a worker reads and writes. Not the timer topic: its hundreds of wheel
# partitions cost the test broker file handles that no worker test uses.
WORKER_ROLES = (
    "exec",
    "retry",
    "dlq",
    "idempotency",
    "steering",
    "outcomes",
    "quarantine",
    "control",
    "clock",
    "queues",
)


def ensure_topics(settings: Settings) -> None:
    specs = [t for t in topic_layout(settings) if t.role in WORKER_ROLES]
    report = TopicAdmin(make_admin(settings), replication_factor=1).ensure(specs)
    assert report.ok, report.differences


# A worker that notices a group change within seconds and commits every 50 ms,
# so tests that wait on it wait little.
FAST_WORKER = {"session_timeout_ms": 3000, "commit_interval_ms": 50}


def worker_settings(kafka: KafkaCluster, prefix: str, **overrides: object) -> Settings:
    """Settings of this test's topics with a :data:`FAST_WORKER` (``overrides`` on
    top, ``queues=`` among them), and the worker's topics created."""
    settings = kafka.settings(prefix, worker=FAST_WORKER, **overrides)
    ensure_topics(settings)
    return settings


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def logged(logger: str) -> Iterator[list[logging.LogRecord]]:
    """The records ``logger`` and its children log meanwhile, at INFO and above (a
    handler of its own: whatever another test did to dueflow's root logger)."""
    got: list[logging.LogRecord] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    handler = Kept(logging.INFO)
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield got
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def waits_for_transaction(events: list[logging.LogRecord], store: str) -> bool:
    """Whether a worker said its ``store`` (keys, steering) load waits for a transaction
    (dueflow.consumers.stable_end)."""
    return any(
        r.getMessage() == "store load waits for a transaction" and getattr(r, "store", "") == store
        for r in events
    )


# (topic, partition, key, value, headers) of a record a test writes
RawRecord = tuple[str, int, bytes, bytes | None, list[tuple[str, bytes]]]


class OpenTransaction:
    """``records`` written in a transaction left open until :meth:`commit` (aborted on
    exit otherwise): a previous owner's last transaction whose commit markers have not
    reached these partitions yet, so their last stable offset is still before them."""

    def __init__(self, settings: Settings, transactional_id: str, records: list[RawRecord]):
        self._producer = make_transactional_producer(
            settings, transactional_id, **{"transaction.timeout.ms": 120_000}
        )
        self._producer.init_transactions(30)
        self._producer.begin_transaction()
        self.committed = False
        produce: Any = self._producer.produce  # headers: bytes values
        for topic, partition, key, value, headers in records:
            produce(topic, value, key, partition, headers=headers)
        assert self._producer.flush(30) == 0

    def commit(self) -> None:
        self._producer.commit_transaction(30)
        self.committed = True

    def __enter__(self) -> OpenTransaction:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.committed:
            self._producer.abort_transaction(30)


def commit_offset(settings: Settings, group: str, tp: TopicPartition) -> None:
    """Commit ``tp``'s offset for ``group`` (no member in it now), as the partition's
    previous owner left it."""
    admin = make_admin(settings)  # kept until its futures are done
    done = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [tp])])
    for fut in done.values():
        fut.result(30)


class Ledger:
    """The side effects handlers make, in a SQLite file the test owns.

    ``effects``: one row per idempotency key with a count (a count above 1 is
    a double effect). ``runs``: one row per handler invocation, with its time.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, count INTEGER NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs (key TEXT, attempt INTEGER, at REAL, pid INTEGER)"
            )
            db.execute("CREATE TABLE IF NOT EXISTS marks (key TEXT, value INTEGER, at REAL)")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def run(self, key: str, attempt: int) -> None:
        import os

        with self._db() as db:
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?)", (key, attempt, time.time(), os.getpid())
            )

    def effect(self, key: str) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO effects VALUES (?, 1) "
                "ON CONFLICT(key) DO UPDATE SET count = count + 1",
                (key,),
            )

    def mark(self, key: str, value: int) -> None:
        """A number a handler noted about its run (e.g. its process's memory)."""
        with self._db() as db:
            db.execute("INSERT INTO marks VALUES (?, ?, ?)", (key, value, time.time()))

    def marks(self) -> list[tuple[str, int, float]]:
        with self._db() as db:
            rows = db.execute("SELECT key, value, at FROM marks ORDER BY at").fetchall()
        return [(str(k), int(v), float(t)) for k, v, t in rows]

    def effects(self) -> dict[str, int]:
        with self._db() as db:
            return dict(db.execute("SELECT key, count FROM effects").fetchall())

    def runs(self, key: str | None = None) -> list[tuple[str, int, float, int]]:
        with self._db() as db:
            if key is None:
                rows = db.execute("SELECT key, attempt, at, pid FROM runs ORDER BY at").fetchall()
            else:
                rows = db.execute(
                    "SELECT key, attempt, at, pid FROM runs WHERE key = ? ORDER BY at", (key,)
                ).fetchall()
        return [(str(k), int(a), float(t), int(p)) for k, a, t, p in rows]


def ledger_registry(ledger: Ledger, *, name: str, queue: str) -> TaskRegistry:
    """One task, ``name`` on ``queue``, whose every run and effect go to ``ledger``."""

    @task(name, queue=queue)
    def record(_payload: object, ctx: TaskContext) -> None:
        ledger.run(ctx.idempotency_key, ctx.attempt)
        ledger.effect(ctx.idempotency_key)

    return TaskRegistry([record])


class WorkerThread:
    """A :class:`Worker` running on its own thread and event loop."""

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry,
        *,
        queues: Sequence[str] | None = None,
        metrics: Metrics | None = None,
        tracer: JobTracer | None = None,
    ) -> None:
        self.worker = Worker(
            settings, registry, queues=queues, metrics=metrics or Metrics(), tracer=tracer
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="test-worker", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await self.worker.run(on_started=lambda _w: self._started.set())

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc
            self._started.set()

    def start(self, timeout: float = 60.0) -> WorkerThread:
        self._thread.start()
        assert self._started.wait(timeout), "worker did not start"
        if self._error is not None:
            raise self._error
        return self

    def assigned(self) -> int:
        """Partitions of all topics this worker owns now."""
        return sum(len(r.assigned) for r in self.worker.runtimes)

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "worker did not stop"
        if self._error is not None:
            raise self._error

    def __enter__(self) -> WorkerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


def record_of(msg: Any) -> Record:
    """A consumed message as a :class:`Record` (its headers with bytes values)."""
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return Record(
        str(msg.topic()),
        int(msg.partition() or 0),
        int(msg.offset() or 0),
        msg.key(),
        msg.value(),
        {k: v for k, v in pairs if isinstance(v, bytes)},
        msg.timestamp()[1],
    )


def read_topic(
    settings: Settings,
    topic: str,
    *,
    until: Callable[[list[Record]], bool] | None = None,
    timeout: float = 30.0,
) -> list[Record]:
    """Every committed record of ``topic`` (waiting until ``until(records)`` holds)."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"reader-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while True:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None:
                    out.append(record_of(msg))
            caught_up = all(_caught_up(consumer, topic, p) for p in parts)
            if caught_up and (until is None or until(out)):
                return out
            if time.monotonic() > deadline:
                if until is None:
                    return out
                raise AssertionError(f"{topic}: condition not met; {len(out)} records read")
    finally:
        consumer.close()


def _caught_up(consumer: Consumer, topic: str, partition: int) -> bool:
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=5, cached=False
        )
    except KafkaException:  # e.g. leadership settling on a new topic: ask again
        return False
    position = consumer.position([TopicPartition(topic, partition)])[0].offset
    return bool(high <= low or position >= high)


def decode_outcome(value: bytes, schema: bytes | None) -> dict[str, Any]:
    """An outcome record's value, read as the version its ``df-schema`` header names."""
    from dueflow.records import codec

    version = codec.parse_schema_header(schema, expected="outcome")
    return codec.decode("outcome", value, writer_version=version)


def outcomes_of(records: list[Record]) -> list[dict[str, Any]]:
    return [
        decode_outcome(r.value, r.headers.get("df-schema")) for r in records if r.value is not None
    ]


# A worker commits a batch within its commit window (the session timeout less a
# heartbeat) or drops it; a drop later than this after a run is about something else.
COMMIT_WINDOW_MS = 30_000


def forgotten_reruns(
    runs: Sequence[tuple[str, int, float, int]], drops: Sequence[Dropped]
) -> set[str]:
    """The keys run more than once only because a worker forgot what it had not
    committed: each later run of an attempt follows a drop ("worker restarting queue",
    "partitions lost") by the process of the run before it, between that run's start
    and the later one's, within a commit window (``runs``: :meth:`Ledger.runs` rows).
    Such a run was not committed; whether exactly one run of each job was committed
    is for the outcomes topic to say."""
    by_pid: dict[int, list[int]] = {}
    for drop in drops:
        by_pid.setdefault(drop.pid, []).append(drop.at_ms)
    by_attempt: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for key, attempt, at, pid in runs:
        by_attempt.setdefault((key, attempt), []).append((at * 1000, pid))
    doubled: set[str] = set()
    excused: set[str] = set()
    for (key, _attempt), seen in by_attempt.items():
        if len(seen) < 2:
            continue
        seen.sort()
        if all(
            any(start <= t <= min(later, start + COMMIT_WINDOW_MS) for t in by_pid.get(pid, ()))
            for (start, pid), (later, _) in itertools.pairwise(seen)
        ):
            excused.add(key)
        else:
            doubled.add(key)
    return excused - doubled
