"""How fast can a job be found by its id, and what does the index cost in memory?

    python -m benchmarks.job_lookup --pending 1000000 --finished 1000000 --json lookup.json
    python -m benchmarks.job_lookup --view ...   # the real status view: benchmarks.job_lookup_view

A prototype of the job-state index of the lifecycle design: every job's
current state is one record of a compacted topic keyed by job id (the
status view's changelog has that shape), and a lookup reads one record by
its offset. In the same run, against the same topic:

- ``dict``: job id (16 raw bytes) -> ``offset << 4 | partition`` in a Python
  dict;
- ``sorted``: per partition, two sorted ``array('q')`` of a 64-bit digest of
  the job id and the packed offset (16 bytes a job), searched with bisect;
- ``sqlite``: the state records themselves in a local SQLite file (what a
  status view with a disk store would keep), looked up by primary key;
- ``scan``: today's way (``producers/lookup.py``): the newest 200,000 records
  of the job's partition read until the id is found (a few lookups only).

Kafka reads (``dict``/``sorted``) assign a consumer to ``(partition,
offset)`` and take one message; ``--threads`` lookups run at once, each
thread with its own consumer. Memory of an index is counted object by object
(``sys.getsizeof``) and as the process RSS it added. The machine is shared:
compare within a run. Uses ``DUEFLOW_BOOTSTRAP`` (or ``--bootstrap``), else
starts a local broker; the topic is deleted at the end.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.output import show
from benchmarks.produce import broker

PARTITIONS = 6  # the default outcomes_partitions
SCAN_LIMIT = 200_000  # producers/lookup.py DEFAULT_SCAN_LIMIT
RESULT = {"invoice": "INV-0000000", "amount_cents": 129900, "sent": True, "provider_id": "x" * 40}


def job_id(rng: random.Random, now_ms: int) -> str:
    """A UUIDv7-shaped id (32 hex digits), as the SDK makes them."""
    tail = rng.getrandbits(72)
    return f"{now_ms & ((1 << 48) - 1):012x}7{tail >> 60:03x}8{tail & ((1 << 60) - 1):015x}"


def state_record(jid: str, *, finished: bool, now_ms: int, i: int) -> bytes:
    """A job's state as the index would store it (JSON, about 300/450 bytes)."""
    view: dict[str, Any] = {
        "job_id": jid,
        "queue": "billing",
        "task": "send_invoice",
        "idempotency_key": jid,
        "state": "succeeded" if finished else "scheduled",
        "attempts": 1 if finished else 0,
        "first_seen_ms": now_ms,
        "updated_ms": now_ms + (1000 if finished else 0),
        "due_ms": now_ms + (0 if finished else 86_400_000 * (1 + i % 3650)),
        "finished_ms": now_ms + 1000 if finished else None,
        "duration_ms": 12.5 if finished else None,
        "worker": "w-host-1234" if finished else None,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "schedule_id": None,
        "timeline": [["scheduled", 0, now_ms]]
        + ([["succeeded", 1, now_ms + 1000]] if finished else []),
    }
    if finished:
        view["result"] = {**RESULT, "invoice": f"INV-{i:07d}"}
    return orjson.dumps(view)


def digest64(jid: str) -> int:
    """A signed 64-bit digest of a job id (the sorted index's key)."""
    return int.from_bytes(hashlib.blake2b(jid.encode(), digest_size=8).digest(), "big", signed=True)


# ------------------------------------------------------------------ loading


def create_topic(admin: AdminClient, topic: str) -> None:
    spec = NewTopic(
        topic,
        num_partitions=PARTITIONS,
        replication_factor=1,
        config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.5"},
    )
    admin.create_topics([spec])[topic].result(30)


def load(bootstrap: str, topic: str, pending: int, finished: int, seed: int) -> list[str]:
    """Write the jobs' state records; return their ids (pending first)."""
    rng = random.Random(seed)
    now_ms = time.time_ns() // 1_000_000
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",  # Kafka's default partitioner, as dueflow's
        }
    )
    ids = []
    for i in range(pending + finished):
        jid = job_id(rng, now_ms + i // 1000)
        ids.append(jid)
        value = state_record(jid, finished=i >= pending, now_ms=now_ms, i=i)
        while True:
            try:
                producer.produce(topic, value, jid.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return ids


def read_all(bootstrap: str, topic: str) -> Iterator[tuple[bytes, int, int, bytes]]:
    """Every record of the topic: (key, partition, offset, value), partition by partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"jl-read-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": 50_000_000,
            "max.partition.fetch.bytes": 10_000_000,
        }
    )
    try:
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            done = False
            while not done:
                for msg in consumer.consume(10_000, 0.1):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = True
                        continue
                    off = msg.offset() or 0
                    yield msg.key() or b"", p, off, msg.value() or b""
                    if off >= high - 1:
                        done = True
            consumer.unassign()
    finally:
        consumer.close()


# ------------------------------------------------------------------ indexes


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class DictIndex:
    """job id (16 raw bytes) -> offset << 4 | partition."""

    def __init__(self) -> None:
        self.entries: dict[bytes, int] = {}

    def add(self, key: bytes, partition: int, offset: int) -> None:
        self.entries[bytes.fromhex(key.decode())] = offset << 4 | partition

    def find(self, jid: str) -> tuple[int, int] | None:
        packed = self.entries.get(bytes.fromhex(jid))
        return None if packed is None else (packed & 15, packed >> 4)

    def counted_bytes(self) -> int:
        return sys.getsizeof(self.entries) + sum(
            sys.getsizeof(k) + sys.getsizeof(v) for k, v in self.entries.items()
        )


class SortedIndex:
    """Per partition: sorted 64-bit digests of job ids and their offsets (16 bytes a job).
    New entries would go to a small dict merged in now and then; here it is built once."""

    def __init__(self) -> None:
        self._staged: list[list[tuple[int, int]]] = [[] for _ in range(PARTITIONS)]
        self.digests: list[array[int]] = []
        self.offsets: list[array[int]] = []

    def add(self, key: bytes, partition: int, offset: int) -> None:
        self._staged[partition].append((digest64(key.decode()), offset))

    def seal(self) -> None:
        for staged in self._staged:
            staged.sort()
            self.digests.append(array("q", (d for d, _ in staged)))
            self.offsets.append(array("q", (o for _, o in staged)))
        self._staged = []

    def find(self, jid: str, partition: int) -> int | None:
        d = digest64(jid)
        keys = self.digests[partition]
        i = bisect.bisect_left(keys, d)
        if i < len(keys) and keys[i] == d:
            return self.offsets[partition][i]
        return None

    def counted_bytes(self) -> int:
        return sum(sys.getsizeof(a) for a in (*self.digests, *self.offsets))


def partition_of(jid: str) -> int:
    """murmur2 as Kafka's default partitioner (what the producer used)."""
    from dueflow.rules.partitioning import partition_for_key

    return partition_for_key(jid.encode(), PARTITIONS)


class SqliteStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(
            "CREATE TABLE jobs (id BLOB PRIMARY KEY, state TEXT, updated INTEGER, view BLOB)"
            " WITHOUT ROWID"
        )
        self._rows: list[tuple[bytes, str, int, bytes]] = []

    def add(self, key: bytes, value: bytes) -> None:
        state = "succeeded" if b'"succeeded"' in value[:200] else "scheduled"
        self._rows.append((bytes.fromhex(key.decode()), state, 0, value))
        if len(self._rows) >= 50_000:
            self.flush()

    def flush(self) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?)", self._rows)
        self.db.execute("COMMIT")
        self._rows = []

    def find(self, jid: str) -> bytes | None:
        row = self.db.execute(
            "SELECT view FROM jobs WHERE id = ?", (bytes.fromhex(jid),)
        ).fetchone()
        return None if row is None else bytes(row[0])


# ------------------------------------------------------------------ lookups


class RecordReader:
    """Reads one record by (partition, offset) with a consumer of its own."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"jl-get-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "fetch.min.bytes": 1,
                "max.partition.fetch.bytes": 65_536,
                "queued.max.messages.kbytes": 1024,
                "queued.min.messages": 1,
                "fetch.queue.backoff.ms": 1,
                "fetch.error.backoff.ms": 1,
                "auto.offset.reset": "error",
            }
        )

    def get(self, partition: int, offset: int, key: bytes) -> bytes | None:
        c = self.consumer
        c.assign([TopicPartition(self.topic, partition, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            if (msg.offset() or 0) < offset:
                continue
            return msg.value() if msg.key() == key else None
        raise RuntimeError(f"no record at {partition}:{offset}")

    def close(self) -> None:
        self.consumer.close()


def timed_lookups(
    ids: Sequence[str], threads: int, lookup: Callable[[int, str], bool]
) -> tuple[list[float], int]:
    """Latency (ms) of every lookup, ``threads`` at once; and how many found nothing."""
    lat: list[float] = []
    missed = 0
    lock = threading.Lock()
    chunks = [ids[i::threads] for i in range(threads)]

    def work(slot: int, chunk: Sequence[str]) -> None:
        nonlocal missed
        mine = []
        miss = 0
        for jid in chunk:
            t = time.perf_counter()
            ok = lookup(slot, jid)
            mine.append((time.perf_counter() - t) * 1000)
            miss += not ok
        with lock:
            lat.extend(mine)
            missed += miss

    pool = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(chunks)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return lat, missed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


@dataclass
class Timing:
    p50: float
    p99: float
    max: float
    per_s: float


def summary(lat: list[float], wall_s: float) -> Timing:
    return Timing(pct(lat, 0.5), pct(lat, 0.99), round(max(lat), 3), round(len(lat) / wall_s))


def scan_once(bootstrap: str, topic: str, jid: str) -> float:
    """Today's lookup: the newest SCAN_LIMIT records of the id's partition, in ms."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"jl-scan-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    t = time.perf_counter()
    try:
        p = partition_of(jid)
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        consumer.assign([TopicPartition(topic, p, max(low, high - SCAN_LIMIT))])
        key = jid.encode()
        done = False
        while not done:
            for msg in consumer.consume(5_000, 0.05):
                err = msg.error()
                if err is not None:
                    done = done or err.code() == KafkaError._PARTITION_EOF
                    continue
                if msg.key() == key:
                    orjson.loads(msg.value() or b"{}")
                if (msg.offset() or 0) >= high - 1:
                    done = True
    finally:
        consumer.close()
    return (time.perf_counter() - t) * 1000


# ------------------------------------------------------------------ run


def run(
    bootstrap: str, *, pending: int, finished: int, lookups: int, threads: int, seed: int
) -> dict[str, Any]:
    topic = f"jl{uuid.uuid4().hex[:8]}.jobs"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topic(admin, topic)
    out: dict[str, Any] = {"topic_partitions": PARTITIONS, "pending": pending, "finished": finished}
    tmp = tempfile.TemporaryDirectory(prefix="dueflow-jl-")
    readers: list[RecordReader] = []
    try:
        t = time.perf_counter()
        ids = load(bootstrap, topic, pending, finished, seed)
        out["load_records_per_s"] = round(len(ids) / (time.perf_counter() - t))

        dict_index, sorted_index = DictIndex(), SortedIndex()
        store = SqliteStore(Path(tmp.name) / "jobs.sqlite")
        rss0 = rss_bytes()
        t = time.perf_counter()
        for key, p, off, _value in read_all(bootstrap, topic):
            dict_index.add(key, p, off)
        out["build_dict_s"] = round(time.perf_counter() - t, 1)
        rss1 = rss_bytes()
        t = time.perf_counter()
        for key, p, off, _value in read_all(bootstrap, topic):
            sorted_index.add(key, p, off)
        sorted_index.seal()
        out["build_sorted_s"] = round(time.perf_counter() - t, 1)
        rss2 = rss_bytes()
        t = time.perf_counter()
        for key, _p, _off, value in read_all(bootstrap, topic):
            store.add(key, value)
        store.flush()
        out["build_sqlite_s"] = round(time.perf_counter() - t, 1)
        rss3 = rss_bytes()
        n = len(ids)
        per_million = 1_000_000 / n
        out["dict_bytes_per_job_counted"] = round(dict_index.counted_bytes() / n, 1)
        out["dict_mib_per_million_rss"] = round((rss1 - rss0) * per_million / 2**20, 1)
        out["sorted_bytes_per_job_counted"] = round(sorted_index.counted_bytes() / n, 1)
        out["sorted_mib_per_million_rss"] = round((rss2 - rss1) * per_million / 2**20, 1)
        out["sqlite_file_mib_per_million"] = round(
            store.path.stat().st_size * per_million / 2**20, 1
        )
        out["sqlite_rss_added_mib"] = round((rss3 - rss2) / 2**20, 1)

        rng = random.Random(seed + 1)
        sample = [rng.choice(ids) for _ in range(lookups)]
        sample += [job_id(rng, 0) for _ in range(max(1, lookups // 100))]  # unknown ids
        rng.shuffle(sample)
        readers = [RecordReader(bootstrap, topic) for _ in range(threads)]
        for r in readers:  # connect before timing
            r.get(0, 0, b"")

        def via_dict(slot: int, jid: str) -> bool:
            where = dict_index.find(jid)
            if where is None:
                return False
            value = readers[slot].get(where[0], where[1], jid.encode())
            return value is not None and orjson.loads(value)["job_id"] == jid

        def via_sorted(slot: int, jid: str) -> bool:
            p = partition_of(jid)
            off = sorted_index.find(jid, p)
            if off is None:
                return False
            value = readers[slot].get(p, off, jid.encode())
            return value is not None and orjson.loads(value)["job_id"] == jid

        def via_sqlite(_slot: int, jid: str) -> bool:
            value = store.find(jid)
            return value is not None and orjson.loads(value)["job_id"] == jid

        for name, fn, width in (
            ("dict_1", via_dict, 1),
            (f"dict_{threads}", via_dict, threads),
            ("sorted_1", via_sorted, 1),
            (f"sorted_{threads}", via_sorted, threads),
            ("sqlite_1", via_sqlite, 1),
        ):
            t = time.perf_counter()
            lat, missed = timed_lookups(sample, width, fn)
            s = summary(lat, time.perf_counter() - t)
            out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = s.p50, s.p99
            out[f"{name}_max_ms"], out[f"{name}_lookups_per_s"] = s.max, s.per_s
            out[f"{name}_not_found"] = missed
        scans = [scan_once(bootstrap, topic, rng.choice(ids)) for _ in range(3)]
        out["scan_200k_ms_median"] = round(statistics.median(scans), 1)
        out["scan_over_dict_p50"] = round(out["scan_200k_ms_median"] / out["dict_1_p50_ms"])
        out["host_load"] = os.getloadavg()[0]
    finally:
        for r in readers:
            r.close()
        tmp.cleanup()
        admin.delete_topics([topic])[topic].result(30)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("DUEFLOW_BOOTSTRAP"))
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--lookups", type=int, default=5_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument(
        "--view",
        action="store_true",
        help="measure the real status view through HTTP (benchmarks.job_lookup_view)",
    )
    ap.add_argument(
        "--no-memory-store",
        action="store_true",
        help="with --view: skip the fold with status_store=memory",
    )
    args = ap.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        if args.view:
            from benchmarks.job_lookup_view import run_view

            result = run_view(
                bootstrap,
                pending=args.pending,
                finished=args.finished,
                lookup_count=args.lookups,
                threads=args.threads,
                seed=args.seed,
                memory_store=not args.no_memory_store,
            )
        else:
            result = run(
                bootstrap,
                pending=args.pending,
                finished=args.finished,
                lookups=args.lookups,
                threads=args.threads,
                seed=args.seed,
            )
    show(result, args.json_path)


if __name__ == "__main__":
    main()
