"""CPU per fire of the emitter's read-and-fire path, without the broker's noise.

    python -m benchmarks.drain_cpu [--timers 100000] [--rounds 3] [--produce] --json PATH

Writes a backlog of overdue timers like ``benchmarks.emitter --scenario
drain`` (near and level-0 partitions, as many due per millisecond), reads
every record into memory with the emitter's own consumer (``WheelSource``:
real ``Message`` objects), then feeds them to a :class:`WheelDrainer`
through an in-memory source that behaves like the consumer (batches of at
most 1000, fetches that take a few hundred records of every partition that
is not paused, pause/hold/resume, partition ends) and a sender that drops
what it is given (``--produce``: a real non-transactional producer with the
outbox's settings, so the cost of ``produce()`` with its headers counts
too). ``drainer_us_per_fire`` is the thread CPU time spent in
``on_messages`` + ``advance`` + ``fire_due`` (+ the commit bookkeeping every
``batch_max_records`` fires) per fired timer, the best of ``--rounds``
rounds (each with freshly read records: firing appends headers to a
record's header list). The cyclic GC is set up as the emitter program sets
it (``--gc``), with the records read ahead frozen out of its way.

Baseline in the same run, over the same records: the least any emitter does
per record, ``m.headers()``, two headers appended, one send:
``floor_us_per_fire``; ``ratio`` = drainer / floor. ``consume_us_per_record``
is what reading the records cost the consumer call (``Consumer.consume``,
batches of 1000), for scale; ``fired_as_read``: timers fired as they were
read (not through the heap).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from benchmarks.emitter import bench_settings, cluster, produce_timers
from benchmarks.output import show
from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.streams.emitter.drainer import WheelDrainer
from dueflow.streams.emitter.wheel_source import WheelSource
from tests.support.timers import now_ms

CONSUME_MAX = 1_000
FETCH_RECORDS = 300  # about max.partition.fetch.bytes (64 KiB) of these records


def backlog(count: int, base: int) -> Iterator[tuple[str, int, int]]:
    """The drain scenario's backlog (300k timers due over a minute, placed 0.2 to 50 s
    ahead), as dense: ``count`` timers due over ``count / 5`` milliseconds."""
    delays = (200, 1_000, 1_800, 5_000, 20_000, 50_000)
    span = max(1_000, count // 5)
    for i in range(count):
        due = base + (i * span) // count
        yield f"d{i}", due, due - delays[i % len(delays)]


def read_all(settings: Settings) -> tuple[dict[int, list[Message]], int, float]:
    """Every record of the timer topic by partition, the count, and the seconds the
    consume calls took (thread CPU time)."""
    source = WheelSource(settings)
    source.start()
    n = settings.wheel.total_partitions
    try:
        source.assign(dict.fromkeys(range(n), 0))
        out: dict[int, list[Message]] = {p: [] for p in range(n)}
        ended: set[int] = set()
        spent = 0.0
        count = 0
        while len(ended) < n:
            t0 = time.thread_time()
            got = source.consume(CONSUME_MAX, 1.0)
            spent += time.thread_time() - t0
            for m in got:
                p: int = m.partition()  # type: ignore[assignment]
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        ended.add(p)
                    continue
                out[p].append(m)
                count += 1
        return out, count, spent
    finally:
        source.close()


class ReplaySource:
    """Records read ahead, delivered like the consumer delivers them."""

    def __init__(self, topic: str, records: dict[int, list[Message]]) -> None:
        self._topic = topic
        self._records = records
        self._offsets = {p: [m.offset() or 0 for m in recs] for p, recs in records.items()}
        self._pos = dict.fromkeys(records, 0)  # index of the next record to fetch
        self._paused: set[int] = set()
        self._ended: set[int] = set()  # end reported since the last record
        self._queue: deque[Message] = deque()

    def _index(self, p: int, offset: int) -> int:
        return bisect.bisect_left(self._offsets[p], offset)

    def _fetch(self) -> None:
        for p, recs in self._records.items():
            if p in self._paused:
                continue
            i = self._pos[p]
            if i < len(recs):
                j = min(len(recs), i + FETCH_RECORDS)
                self._queue.extend(recs[i:j])
                self._pos[p] = j
                self._ended.discard(p)
            elif p not in self._ended:
                self._ended.add(p)
                end = recs[-1].offset() + 1 if recs else 0  # type: ignore[operator]
                self._queue.append(
                    Message(
                        topic=self._topic,
                        partition=p,
                        offset=end,
                        error=KafkaError(KafkaError._PARTITION_EOF),
                    )
                )

    def consume(self, max_messages: int) -> list[Message]:
        if not self._queue:
            self._fetch()
        q = self._queue
        return [q.popleft() for _ in range(min(max_messages, len(q)))]

    def pause(self, partition: int, next_offset: int) -> None:
        self._paused.add(partition)
        self._pos[partition] = self._index(partition, next_offset)
        self._ended.discard(partition)
        self._queue = deque(m for m in self._queue if m.partition() != partition)

    def hold(self, partition: int) -> None:
        self._paused.add(partition)

    def resume(self, partition: int) -> None:
        self._paused.discard(partition)

    def end_offset(self, partition: int) -> int:
        recs = self._records[partition]
        return recs[-1].offset() + 1 if recs else 0  # type: ignore[operator]


class DropSender:
    def __init__(self) -> None:
        self.sent = 0

    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None:
        self.sent += 1


class ProduceSender:
    """A plain producer with the outbox's settings (no transaction)."""

    def __init__(self, settings: Settings) -> None:
        self.sent = 0
        self._producer = Producer(
            settings.client_config(
                **{
                    "linger.ms": 2,
                    "batch.num.messages": 10_000,
                    "compression.type": "lz4",
                    "partitioner": "murmur2_random",
                    "queue.buffering.max.messages": 1_000_000,
                    "enable.idempotence": True,
                    "delivery.report.only.error": True,
                }
            )
        )

    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:
                self._producer.poll(0.05)
        self.sent += 1

    def flush(self) -> None:
        self._producer.flush(60)


def drain_round(
    settings: Settings, records: dict[int, list[Message]], count: int, sender: Any, metrics: Metrics
) -> tuple[float, int]:
    """Seconds the drainer spent to fire ``count`` timers, and how many of them fired
    as they were read (not through the heap)."""
    source = ReplaySource(names(settings).timers, records)
    now = now_ms()
    drainer = WheelDrainer(
        settings=settings,
        source=source,
        sender=sender,
        metrics=metrics,
        committed={},
        now_ms=now,
    )
    batch = settings.emitter.batch_max_records
    clock = time.thread_time
    spent = 0.0
    fired = 0
    heap_fired = 0
    at_once = 0
    since_commit = 0
    idle = 0
    while sender.sent < count:
        got = source.consume(CONSUME_MAX)
        t0 = clock()
        if got:
            drainer.on_messages(got, now)
        drainer.advance(now)
        before = sender.sent
        heap_fired += drainer.fire_due(now)
        at_once += before - fired
        n = sender.sent - fired
        since_commit += n
        if since_commit >= batch or (n == 0 and since_commit and not got):
            drainer.on_committed(drainer.seal(), now)
            since_commit = 0
        spent += clock() - t0
        fired = sender.sent
        idle = 0 if (n or got) else idle + 1
        if idle > 1_000:
            raise RuntimeError(f"stuck after {sender.sent} of {count} fires")
    return spent, at_once


def floor_round(records: dict[int, list[Message]], sender: Any) -> float:
    """The least any emitter does per record: headers, two more, one send."""
    topic = "exec"
    fired_at = b"1"
    source = b"timers:0:1"
    send = sender.send
    clock = time.thread_time
    spent = 0.0
    batches = [
        recs[i : i + CONSUME_MAX]
        for recs in records.values()
        for i in range(0, len(recs), CONSUME_MAX)
    ]
    for batch in batches:
        t0 = clock()
        for m in batch:
            h = m.headers()
            h.append((hdr.FIRED, fired_at))  # type: ignore[union-attr]
            h.append((hdr.SOURCE, source))  # type: ignore[union-attr]
            send(topic, m.value(), m.key(), h)
        spent += clock() - t0
    return spent


def settle_gc() -> None:
    """The records read ahead out of the cyclic GC's way: in the emitter only the
    records in flight (the consumer's queue, the heap) are there to scan."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def run(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    s = bench_settings(bootstrap, catchup_max_rate_per_s=1e9)
    count = produce_timers(s, backlog(args.timers, now_ms() - 70_000))
    metrics = Metrics()
    drainer_s: list[float] = []
    floor_s: list[float] = []
    consume_s: list[float] = []
    for _ in range(args.rounds):
        records, got, spent = read_all(s)
        assert got == count, f"read {got} of {count} records"
        consume_s.append(spent)
        sender: Any = ProduceSender(s) if args.produce else DropSender()
        settle_gc()
        spent, at_once = drain_round(s, records, count, sender, metrics)
        drainer_s.append(spent)
        assert sender.sent == count, f"sent {sender.sent} of {count}"
        if args.produce:
            sender.flush()
        records, _, _ = read_all(s)
        sender = ProduceSender(s) if args.produce else DropSender()
        settle_gc()
        floor_s.append(floor_round(records, sender))
        if args.produce:
            sender.flush()
    drainer_us = min(drainer_s) / count * 1e6
    floor_us = min(floor_s) / count * 1e6
    return {
        "timers": count,
        "rounds": args.rounds,
        "sender": "producer" if args.produce else "drop",
        "drainer_us_per_fire": round(drainer_us, 3),
        "floor_us_per_fire": round(floor_us, 3),
        "ratio": round(drainer_us / floor_us, 2),
        "consume_us_per_record": round(min(consume_s) / count * 1e6, 3),
        "fired_as_read": at_once,
        "drainer_rounds_s": [round(x, 3) for x in drainer_s],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    parser.add_argument("--timers", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--produce", action="store_true", help="send with a real producer")
    parser.add_argument(
        "--gc",
        default="50000,50,100",
        help="cyclic GC thresholds (default: the emitter program's, after gc.freeze()) or off",
    )
    args = parser.parse_args(argv)
    gc.freeze()  # as the emitter program does (dueflow/apps/cli/emitter_cmd.py)
    if args.gc == "off":
        gc.disable()
    else:
        gc.set_threshold(*(int(x) for x in args.gc.split(",")))
    with cluster(args.bootstrap) as b:
        result = run(b, args)
    show(result, args.json)


if __name__ == "__main__":
    main()
