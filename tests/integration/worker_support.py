"""Helpers for worker tests: topics, a worker on a thread, a ledger, topic readers."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.consumers import TaskContext, task
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.worker import Worker
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import topic_layout
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from tests.conftest import KafkaCluster

# What a worker reads and writes. Not the timer topic: its hundreds of wheel
# partitions cost the test broker file handles that no worker test uses.
WORKER_ROLES = (
    "exec",
    "retry",
    "dlq",
    "idempotency",
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
                    raw = msg.headers() or []
                    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
                    headers = {k: v for k, v in pairs if isinstance(v, bytes)}
                    out.append(
                        Record(
                            str(msg.topic()),
                            int(msg.partition() or 0),
                            int(msg.offset() or 0),
                            msg.key(),
                            msg.value(),
                            headers,
                            msg.timestamp()[1],
                        )
                    )
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


def outcomes_of(records: list[Record]) -> list[dict[str, Any]]:
    from dueflow.records import codec

    return [codec.decode("outcome", r.value) for r in records if r.value is not None]
