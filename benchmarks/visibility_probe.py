"""When a fired job becomes readable: appended to its exec partition, then committed.

The e2e benchmark's ``fired_to_start_ms`` runs from the emitter's ``df-fired``
stamp to the handler's start. Two more readers of the exec topics split it
(``--visibility``): one ``read_uncommitted`` (a record is there as soon as it
is appended, inside its open transaction) and one ``read_committed`` (only once
the transaction's commit marker is written), each in a process of its own, so
the GIL of one never delays the other. For every exec record:

- ``fired_to_appended_ms``: stamp -> appended: the producer's linger, the
  transaction's ``AddPartitionsToTxn`` and the broker's verification before
  the first record of a partition may go, the produce request;
- ``appended_to_committed_ms``: appended -> committed: the rest of the
  transaction, its commit and the markers;
- ``fired_to_committed_ms``: both, what any ``read_committed`` consumer sees.

The readers cost CPU on the same two cores (two consumers at the run's rate),
so a run with ``--visibility`` is a little slower: use it for the split, and
the runs without it for the headline. The pure part, :func:`split`, is
unit-tested; the readers are run against a real broker in the tests.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.arrivals import take_arrived
from benchmarks.spread import percentiles
from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.kafka.reading import partitions_of

ISOLATIONS = ("read_uncommitted", "read_committed")
SPANS = ("fired_to_appended_ms", "appended_to_committed_ms", "fired_to_committed_ms")
READY = "ready"

# (topic, partition, offset) -> (arrival ms, df-fired ms or None)
Arrivals = dict[tuple[str, int, int], tuple[int, int | None]]


def split(
    uncommitted: Mapping[Any, tuple[int, int | None]],
    committed: Mapping[Any, tuple[int, int | None]],
) -> dict[str, Any]:
    """The three spans of every record both readers saw and the emitter stamped
    (percentiles, ms), and how many records that was (pure)."""
    appended: list[float] = []
    to_commit: list[float] = []
    total: list[float] = []
    for key, (seen_committed, fired) in committed.items():
        first = uncommitted.get(key)
        if fired is None or first is None:
            continue
        seen_appended = first[0]
        appended.append(seen_appended - fired)
        to_commit.append(seen_committed - seen_appended)
        total.append(seen_committed - fired)
    return {
        "records": len(total),
        **{
            span: percentiles(v)
            for span, v in zip(SPANS, (appended, to_commit, total), strict=True)
        },
    }


def fired_ms(headers: Any) -> int | None:
    """The ``df-fired`` stamp of a record (headers as confluent-kafka gives them),
    or None (not fired by the emitter)."""
    raw = hdr.header(list(headers or ()), hdr.FIRED)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class VisibilityProbe:
    """The two readers of ``topics`` as child processes, from the start of every
    partition. ``with VisibilityProbe(config, topics) as probe: ...; probe.result()``
    after the ``with``: :func:`split` of what they read."""

    def __init__(
        self, consumer_config: Mapping[str, Any], topics: Iterable[str], workdir: Path
    ) -> None:
        self._config = dict(consumer_config)
        self._topics = sorted(topics)
        self._workdir = workdir
        self._procs: list[tuple[subprocess.Popen[str], Path]] = []
        self._arrivals: dict[str, Arrivals] = {}

    def __enter__(self) -> VisibilityProbe:
        self._workdir.mkdir(parents=True, exist_ok=True)
        try:
            for isolation in ISOLATIONS:
                out = self._workdir / f"visibility-{isolation}.json"
                config = {**self._config, "isolation.level": isolation}
                proc = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.visibility_probe", "--out", str(out)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                self._procs.append((proc, out))
                assert proc.stdin is not None
                assert proc.stdout is not None
                proc.stdin.write(json.dumps({"config": config, "topics": self._topics}) + "\n")
                proc.stdin.flush()
                if proc.stdout.readline().strip() != READY:
                    raise RuntimeError(f"visibility probe ({isolation}) did not start")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def counts(self) -> dict[str, int]:
        """Records each reader has read so far (inside the ``with``)."""
        out = {}
        for (proc, _), isolation in zip(self._procs, ISOLATIONS, strict=True):
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
            out[isolation] = int(proc.stdout.readline())
        return out

    def _stop(self) -> None:
        procs, self._procs = self._procs, []
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for (proc, out), isolation in zip(procs, ISOLATIONS, strict=False):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            if proc.returncode == 0 and out.exists():
                self._arrivals[isolation] = load(out)

    def result(self) -> dict[str, Any]:
        """:func:`split` of the two readers' arrivals (after the ``with``)."""
        missing = [i for i in ISOLATIONS if i not in self._arrivals]
        if missing:
            raise RuntimeError(f"visibility probe: no result from the {', '.join(missing)} reader")
        return split(self._arrivals["read_uncommitted"], self._arrivals["read_committed"])


def load(path: Path) -> Arrivals:
    rows = json.loads(path.read_text())
    return {(t, int(p), int(o)): (int(at), fired) for t, p, o, at, fired in rows}


Row = tuple[str, int, int, int, int | None]  # topic, partition, offset, arrival, fired


def read_until_stopped(consumer: Consumer, rows: list[Row]) -> None:
    """Append every record to ``rows`` as it arrives, until SIGTERM."""
    stopping = False

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    while not stopping:
        got = take_arrived(consumer, timeout_s=0.1)
        for m in got.messages:
            if m.error() is None:
                rows.append(
                    (
                        m.topic() or "",
                        m.partition() or 0,
                        m.offset() or 0,
                        got.received_ms,
                        fired_ms(m.headers()),
                    )
                )


def answer_counts(rows: list[Row]) -> None:
    """For every line on stdin, the number of records read so far on stdout."""
    for _ in sys.stdin:
        print(len(rows), flush=True)


def partitions_when_known(consumer: Consumer, topic: str, timeout_s: float = 30.0) -> list[int]:
    """The partitions of ``topic``, asked again until the metadata names them: a topic
    created a moment before can be missing from a new client's first answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return partitions_of(consumer, topic)
        except InvalidInput:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    """The child: its settings as one JSON line on stdin, ``ready`` on stdout once
    assigned, then read until SIGTERM (each further stdin line is answered with
    the count read so far) and write the arrivals to ``--out``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    spec = json.loads(sys.stdin.readline())
    consumer = Consumer(
        {**spec["config"], "enable.auto.commit": False, "enable.partition.eof": False}
    )
    rows: list[Row] = []
    try:
        assignment = [
            TopicPartition(t, p, OFFSET_BEGINNING)
            for t in spec["topics"]
            for p in partitions_when_known(consumer, t)
        ]
        consumer.assign(assignment)
        # The e2e benchmark's first job comes due a second after its load begins:
        # time enough for the first fetch.
        print(READY, flush=True)
        threading.Thread(target=answer_counts, args=(rows,), daemon=True).start()
        read_until_stopped(consumer, rows)
    finally:
        consumer.close()
    args.out.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
