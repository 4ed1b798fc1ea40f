"""What a worker's transaction open on another partition costs that partition's readers.

A queue's exec partition is written without transactions (the emitter fires
that way), so its read_committed readers (the workers) see a record as soon as
it is appended. A transaction of some other process that also writes one
record to that partition holds its last stable offset until it commits: every
record appended meanwhile waits for the commit.

This program measures that wait as the reader sees it. A producer appends a
record every ``--every-ms`` to partition 0 of an "exec" topic, without
transactions (as the emitter); a read_committed consumer measures each
record's delay (receive time less its timestamp, one host clock). Beside them
``--writers`` transactional loops commit a batch every ``--interval-ms`` as a
worker does (records to an "outcomes" topic, the consumer offsets of their
group, commit). The run alternates two phases of ``--seconds`` each (``--rounds`` times): in
one the loops never touch the exec topic, in the other each of their
transactions also writes one record to the exec partition (a group member's
end sent to its group's owner). The difference of the two phases' delays is
the cost.

    python -m benchmarks.lso_hold --bootstrap 127.0.0.1:19092 --json PATH
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.output import provenance, show


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _TxnLoop(threading.Thread):
    """A worker's commit loop: every interval one transaction with a few records,
    the group's offsets, and (while ``touch`` is set) one record to the exec partition."""

    def __init__(self, bootstrap: str, *, exec_topic: str, out_topic: str, interval_s: float):
        super().__init__(daemon=True)
        self.exec_topic = exec_topic
        self.out_topic = out_topic
        self.interval_s = interval_s
        self.touch = threading.Event()
        self.stop = threading.Event()
        self.durations_ms: dict[bool, list[float]] = {False: [], True: []}
        group = f"lso-hold-{uuid.uuid4().hex[:8]}"
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": group,
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
            }
        )
        self.offset = 0

    def run(self) -> None:
        p = self.producer
        p.init_transactions(30)
        while not self.stop.is_set():
            touch = self.touch.is_set()
            t0 = time.monotonic()
            p.begin_transaction()
            for _ in range(5):
                p.produce(self.out_topic, b"x" * 200, b"k")
            if touch:
                p.produce(self.exec_topic, b"member-ended", b"g\x00cmd", partition=0)
            self.offset += 1
            p.send_offsets_to_transaction(
                [TopicPartition(self.out_topic, 0, self.offset)],
                self.consumer.consumer_group_metadata(),
                30,
            )
            p.commit_transaction(30)
            self.durations_ms[touch].append((time.monotonic() - t0) * 1000)
            left = self.interval_s - (time.monotonic() - t0)
            if left > 0:
                self.stop.wait(left)
        self.consumer.close()


def measure(
    bootstrap: str,
    *,
    seconds: float,
    every_ms: float,
    interval_ms: float,
    writers: int,
    rounds: int,
) -> dict[str, Any]:
    prefix = f"lsohold-{uuid.uuid4().hex[:8]}"
    exec_topic, out_topic = f"{prefix}.exec", f"{prefix}.outcomes"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics(
        [NewTopic(exec_topic, 1, 1), NewTopic(out_topic, 1, 1)]
    ).values():
        fut.result(30)
    emitter = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{prefix}-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    reader.assign([TopicPartition(exec_topic, 0, 0)])
    loops = [
        _TxnLoop(
            bootstrap, exec_topic=exec_topic, out_topic=out_topic, interval_s=interval_ms / 1000
        )
        for _ in range(writers)
    ]
    for loop in loops:
        loop.start()
    delays: dict[str, list[float]] = {"without": [], "with": []}
    phase = "without"
    stop = threading.Event()

    def emit() -> None:
        n = 0
        while not stop.is_set():
            emitter.produce(exec_topic, b"job", f"job-{n}".encode(), partition=0)
            emitter.poll(0)
            n += 1
            stop.wait(every_ms / 1000)
        emitter.flush(10)

    # The phases alternate (``rounds`` times each) so that the host's load, which
    # changes over a run, weighs on both alike.
    emitting = threading.Thread(target=emit, daemon=True)
    emitting.start()
    warm_until = time.monotonic() + 3.0
    phase_end = warm_until + seconds
    left = 2 * rounds
    try:
        while True:
            now = time.monotonic()
            if now >= phase_end:
                left -= 1
                if left == 0:
                    break
                phase = "with" if phase == "without" else "without"
                for loop in loops:
                    if phase == "with":
                        loop.touch.set()
                    else:
                        loop.touch.clear()
                warm_until = now + 0.5
                phase_end = warm_until + seconds
            msg = reader.poll(0.05)
            if msg is None or msg.error() or msg.value() != b"job":
                continue
            if time.monotonic() < warm_until:
                continue
            _kind, ts = msg.timestamp()
            delays[phase].append(time.time() * 1000 - ts)
    finally:
        stop.set()
        emitting.join(10)
        for loop in loops:
            loop.stop.set()
        for loop in loops:
            loop.join(30)
        reader.close()
        admin.delete_topics([exec_topic, out_topic])
    result: dict[str, Any] = {
        "writers": writers,
        "interval_ms": interval_ms,
        "every_ms": every_ms,
        "seconds_per_phase": seconds,
        "rounds": rounds,
    }
    for name, values in delays.items():
        result[f"{name}: records"] = len(values)
        result[f"{name}: delay p50 ms"] = round(_pct(values, 0.5), 1)
        result[f"{name}: delay p90 ms"] = round(_pct(values, 0.9), 1)
        result[f"{name}: delay p95 ms"] = round(_pct(values, 0.95), 1)
        result[f"{name}: delay p99 ms"] = round(_pct(values, 0.99), 1)
        late = sum(v > 10 for v in values)
        result[f"{name}: share over 10 ms"] = round(late / len(values), 3) if values else None
        result[f"{name}: delay max ms"] = round(max(values, default=float("nan")), 1)
        result[f"{name}: delay mean ms"] = round(statistics.fmean(values), 1) if values else None
    for touch, name in ((False, "without"), (True, "with")):
        txns = [d for loop in loops for d in loop.durations_ms[touch]]
        result[f"{name}: transaction p50 ms"] = round(_pct(txns, 0.5), 1)
        result[f"{name}: transaction p99 ms"] = round(_pct(txns, 0.99), 1)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--every-ms", type=float, default=5.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = measure(
        args.bootstrap,
        seconds=args.seconds,
        every_ms=args.every_ms,
        interval_ms=args.interval_ms,
        writers=args.writers,
        rounds=args.rounds,
    )
    result["provenance"] = provenance()
    show(result, args.json, hide=("provenance",))


if __name__ == "__main__":
    main()
