"""Write timer records the way any Kafka client may, and read what the emitter fired.

``timer_record`` is the "any Kafka client" path: ``place_timer`` for the
partition, the Avro ``Job`` codec for the value and the header contract of
``dueflow.headers``. ``ExecLog`` is a ``read_committed`` consumer of exec
topics, as a worker sees them.
"""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.model import Job
from dueflow.records import codec
from dueflow.rules.wheel import place_timer, shard_for


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def job_value(job_id: str, *, queue: str, due_ms: int, task: str = "t") -> bytes:
    job = Job(
        job_id=job_id,
        queue=queue,
        task=task,
        payload=b"{}",
        due_ms=due_ms,
        idempotency_key=job_id,
        created_ms=now_ms(),
    )
    return codec.encode("job", job.to_record())


def timer_record(
    settings: Settings,
    job_id: str,
    *,
    due_ms: int,
    at_ms: int,
    queue: str = "default",
    task: str = "t",
) -> tuple[int, bytes, bytes, list[tuple[str, bytes]]]:
    """``(partition, key, value, headers)`` of a timer placed at ``at_ms``."""
    key = job_id.encode()
    spread = zlib.crc32(key)
    geometry = settings.wheel.of_shard(shard_for(spread, settings.wheel.shards))
    placement = place_timer(due_ms=due_ms, now_ms=at_ms, geometry=geometry, spread=spread)
    headers = hdr.encode(
        [
            (hdr.DUE, due_ms),
            (hdr.QUEUE, queue),
            (hdr.KIND, hdr.KIND_JOB),
            (hdr.JOB_ID, job_id),
            (hdr.SCHEMA, codec.schema_header("job")),
        ]
    )
    value = job_value(job_id, queue=queue, due_ms=due_ms, task=task)
    return placement.partition, key, value, headers


def timer_producer(settings: Settings) -> Producer:
    return Producer(
        settings.client_config(**{"linger.ms": 5, "enable.idempotence": True, "acks": "all"})
    )


def write_timers(
    producer: Producer,
    settings: Settings,
    timers: Iterable[tuple[str, int]],
    *,
    queue: str = "default",
    at_ms: int | None = None,
    task: str = "t",
) -> int:
    """Write ``(job_id, due_ms)`` timers of ``task``, placed as of ``at_ms`` (default: now)."""
    topic = names(settings).timers
    count = 0
    for job_id, due in timers:
        at = now_ms() if at_ms is None else at_ms
        part, key, value, headers = timer_record(
            settings, job_id, due_ms=due, at_ms=at, queue=queue, task=task
        )
        while True:
            try:
                producer.produce(topic, value, key, part, headers=list(headers))
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return count


@dataclass
class Fired:
    job_id: str
    due_ms: int
    fired_ms: int
    seen_ms: int
    partition: int
    source: str
    value: bytes = b""
    timestamp_ms: int = -1  # the record's timestamp (exec topics: CreateTime, the emit time)

    @property
    def timer_partition(self) -> int:
        """The timer-topic partition it was fired from (df-src), -1: none."""
        parts = self.source.rsplit(":", 2)
        return int(parts[1]) if len(parts) == 3 else -1


@dataclass
class ExecLog:
    """Everything a read_committed consumer sees on exec topics."""

    settings: Settings
    queues: tuple[str, ...] = ("default",)
    records: list[Fired] = field(default_factory=list)
    _consumer: Consumer | None = None

    def start(self) -> ExecLog:
        n = names(self.settings)
        self._consumer = Consumer(
            self.settings.client_config(
                **{
                    "group.id": f"check-{uuid.uuid4().hex}",
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
        )
        tps: list[TopicPartition] = []
        for q in self.queues:
            spec = self.settings.queue(q)
            tps.extend(TopicPartition(n.exec(q), p, 0) for p in range(spec.partitions))
        self._consumer.assign(tps)
        return self

    @property
    def consumer(self) -> Consumer:
        """The consumer, for a caller with its own read loop (then :meth:`record`)."""
        assert self._consumer is not None
        return self._consumer

    def poll(self, timeout_s: float = 0.02) -> int:
        assert self._consumer is not None
        return self.record(self._consumer.consume(10_000, timeout_s), now_ms())

    def record(self, messages: Iterable[Message], seen_ms: int) -> int:
        """Note ``messages`` (error events skipped), read at ``seen_ms``; how many."""
        got = 0
        for m in messages:
            if m.error() is not None:
                continue
            h = m.headers() or []
            if hdr.is_command(h):
                continue  # a command to the partition's owner: nothing the wheel fired
            due = hdr.header_int(h, hdr.DUE)  # type: ignore[arg-type]
            fired = hdr.header_int(h, hdr.FIRED)  # type: ignore[arg-type]
            src = hdr.header_text(h, hdr.SOURCE) or ""  # type: ignore[arg-type]
            self.records.append(
                Fired(
                    (m.key() or b"").decode(),
                    due if due is not None else -1,
                    fired if fired is not None else -1,
                    seen_ms,
                    m.partition() or 0,
                    src,
                    m.value() or b"",
                    m.timestamp()[1],
                )
            )
            got += 1
        return got

    def wait_for(self, count: int, timeout_s: float) -> list[Fired]:
        """Poll until ``count`` records were seen or the time is up; return them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.records) < count and time.monotonic() < deadline:
            self.poll()
        return self.records

    def wait_for_jobs(self, job_ids: Iterable[str], timeout_s: float) -> list[Fired]:
        """Poll until a record of each of ``job_ids`` was seen (copies fired again count
        once) or the time is up; return them all."""
        wanted = set(job_ids)
        deadline = time.monotonic() + timeout_s
        while not wanted <= {r.job_id for r in self.records} and time.monotonic() < deadline:
            self.poll()
        return self.records

    def settle(self, quiet_s: float = 1.0, timeout_s: float = 30.0) -> list[Fired]:
        """Poll until nothing new arrived for ``quiet_s`` (catches duplicates)."""
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
            if self.poll():
                last = time.monotonic()
        return self.records

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class TimerLoad:
    """Writes timers due ``min_ahead_ms`` to ``min_ahead_ms + spread_ms`` ahead at about
    ``rate`` a second for ``seconds`` (or until :meth:`stop`), on a thread; ``dues`` is
    every one written."""

    def __init__(
        self,
        settings: Settings,
        rate: int,
        seconds: float,
        *,
        min_ahead_ms: int = 0,
        spread_ms: int = 3_000,
        queue: str = "default",
        task: str = "t",
    ) -> None:
        self.settings, self.rate, self.seconds = settings, rate, seconds
        self.min_ahead_ms, self.spread_ms = min_ahead_ms, spread_ms
        self.queue, self.task = queue, task
        self.dues: dict[str, int] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = timer_producer(self.settings)
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < self.seconds and not self._stop.is_set():
            batch = {}
            for _ in range(self.rate // 20):
                batch[f"j{i}"] = now_ms() + self.min_ahead_ms + (i * 37) % self.spread_ms
                i += 1
            write_timers(producer, self.settings, batch.items(), queue=self.queue, task=self.task)
            self.dues.update(batch)
            time.sleep(0.05)  # pacing of the load generator, not synchronization

    def stop(self) -> None:
        """Write no more (the batch being written is finished)."""
        self._stop.set()
        self.thread.join(60)

    def __enter__(self) -> TimerLoad:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.thread.join(60)
