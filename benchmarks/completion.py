"""When every job of a run is done as far as Kafka can see, for ``benchmarks.e2e``.

A worker commits a job's outcomes and its exec offset in one transaction, so
"done" has two equal readings, and each is a watcher process here:

- :class:`OffsetWatcher` (the emitter without transactions, the default): the
  workers' group has committed offsets at the end of every exec partition,
  with at least as many records below them as jobs. It asks the group
  coordinator every :data:`POLL_S` (an OffsetFetch, then ListOffsets once the
  count is reached), so measuring costs the machine next to nothing while the
  pipeline runs; the outcomes are read once afterwards (:func:`count_outcomes`:
  every job's own, and the ``duplicate`` ones of copies the emitter fired again).
- :class:`OutcomeWatcher` (``emitter.transactional``: the emitter's commit
  markers take exec offsets past the last job, which a worker's offsets never
  cover): reads every committed outcome as it arrives and counts them per job.
  It reads two records per job while the pipeline runs (about 5 us of CPU per
  job on two cores, outside the pipeline's figures).
"""

from __future__ import annotations

import multiprocessing
import resource
import time
import uuid
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from benchmarks.arrivals import take_arrived
from dueflow.config import Settings
from dueflow.kafka.topics import names
from tests.support.emitters import wait_until

# Committed outcomes per job: the client's `scheduled` (on by default) and the
# worker's `succeeded` (every job succeeds at its first attempt here). A copy of
# a job the emitter fired again adds a `duplicate` one.
OUTCOMES_PER_JOB = 2
# How often the offset watcher asks for the group's committed offsets.
POLL_S = 0.005


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    return [TopicPartition(topic, p) for p in sorted(parts)]


def _outcome_reader(
    settings: Settings, role: str, **config: Any
) -> tuple[Consumer, list[TopicPartition]]:
    """A read_committed consumer assigned every outcomes partition from the start."""
    topic = names(settings).outcomes
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"{role}-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                **config,
            }
        )
    )
    tps = _partitions(consumer, topic)
    consumer.assign([TopicPartition(topic, tp.partition, 0) for tp in tps])
    return consumer, tps


def offsets_watch_main(
    settings: Settings,
    queue: str,
    target: Any,
    done_at: Any,
    cpu_s: Any,
    ready: Any,
    asked: Any,
) -> None:
    """Ask for the workers' committed offsets of ``queue``'s exec topic until they
    are at every partition's end with ``target`` (set later by the parent) records
    below them; then note the wall time of that answer in ``done_at`` and this
    process's CPU seconds in ``cpu_s``. ``asked`` counts the answers read."""
    n = names(settings)
    topic = n.exec(queue)
    # Never subscribes: asks the coordinator for the group's offsets, joins nothing.
    # read_uncommitted: no waiting for offsets of open transactions (KIP-447); the
    # answer holds only committed ones either way.
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": n.worker_group(queue),
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
            }
        )
    )
    tps = _partitions(consumer, topic)
    ready.set()
    while True:
        time.sleep(POLL_S)
        if not target.value:
            continue
        committed = consumer.committed(tps, timeout=10)
        answered = time.time()
        asked.value += 1
        offsets = [max(tp.offset, 0) for tp in committed]
        if sum(offsets) < target.value:
            continue
        ends = [consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps]
        if all(o >= end for o, end in zip(offsets, ends, strict=True)):
            cpu_s.value = _own_cpu_s()
            done_at.value = answered
            break
    consumer.close()


def outcomes_watch_main(
    settings: Settings, target: Any, done_at: Any, cpu_s: Any, extra: Any, ready: Any
) -> None:
    """Count committed outcome records per job (their key) until ``target`` jobs
    (set later by the parent) have :data:`OUTCOMES_PER_JOB` each; then note this
    process's CPU seconds in ``cpu_s``, the wall time the last of them arrived in
    ``done_at`` and the records beyond those (``duplicate`` outcomes) in ``extra``."""
    consumer, _tps = _outcome_reader(settings, "watch")
    consumer.poll(0.5)  # connected and fetching before the jobs start
    ready.set()
    per_job: dict[bytes | None, int] = {}
    done = 0  # jobs with every outcome
    records = 0
    while True:
        arrival = take_arrived(consumer, timeout_s=0.05)
        for m in arrival.messages:
            if m.error() is None:
                records += 1
                key = m.key()
                count = per_job[key] = per_job.get(key, 0) + 1
                done += count == OUTCOMES_PER_JOB
        if target.value and done >= target.value:
            cpu_s.value = _own_cpu_s()
            extra.value = records - OUTCOMES_PER_JOB * done
            done_at.value = arrival.received_ms / 1000
            break
    consumer.close()


def count_outcomes(settings: Settings, jobs: int, timeout_s: float = 120.0) -> int:
    """Read every committed outcome once (after a run): the records beyond
    :data:`OUTCOMES_PER_JOB` per job (``duplicate`` outcomes). Raises when fewer
    than ``jobs`` jobs have all of theirs."""
    consumer, tps = _outcome_reader(settings, "count", **{"enable.partition.eof": True})
    try:
        per_job: Counter[bytes | None] = Counter()
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tps[0].topic} not read within {timeout_s:.0f} s")
            for m in consumer.consume(10_000, 0.5):
                err = m.error()
                partition = m.partition() or 0
                if err is None:
                    per_job[m.key()] += 1
                    at_end.discard(partition)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
    finally:
        consumer.close()
    complete = sum(1 for n in per_job.values() if n >= OUTCOMES_PER_JOB)
    if complete < jobs:
        raise RuntimeError(f"{complete} of {jobs} jobs have their {OUTCOMES_PER_JOB} outcomes")
    return sum(per_job.values()) - OUTCOMES_PER_JOB * complete


class _Process:
    """A watcher function in its own (spawned) process, with its shared values."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self.target = self._ctx.Value("q", 0)
        self.done_at = self._ctx.Value("d", 0.0)
        self.cpu = self._ctx.Value("d", 0.0)
        self.ready = self._ctx.Event()
        self.asked = self._ctx.Value("q", 0)
        self.proc: Any = None

    def launch(self, target: Any, *args: Any) -> None:
        self.proc = self._ctx.Process(target=target, args=args)
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("the completion watcher did not start within 60 s")

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)

    def wait(self, jobs: int, timeout_s: float) -> float:
        """Wall time at which every job of ``jobs`` was committed."""
        self.target.value = jobs
        wait_until(lambda: self.done_at.value > 0, timeout_s, "every job committed", 0.05)
        return float(self.done_at.value)

    def cpu_s(self) -> float:
        """CPU seconds of the watcher process, its whole life (after :meth:`wait`)."""
        return float(self.cpu.value)


class OffsetWatcher(_Process):
    """:func:`offsets_watch_main` in its own process; :func:`count_outcomes` after."""

    def __init__(self, settings: Settings, queue: str) -> None:
        super().__init__()
        self._settings = settings
        self._queue = queue
        self._jobs = 0

    def __enter__(self) -> OffsetWatcher:
        args = (self._settings, self._queue, self.target, self.done_at, self.cpu, self.ready)
        self.launch(offsets_watch_main, *args, self.asked)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait(self, jobs: int, timeout_s: float) -> float:
        self._jobs = jobs
        return super().wait(jobs, timeout_s)

    def duplicates(self) -> int:
        """Outcome records beyond every job's own, read once (after :meth:`wait`)."""
        return count_outcomes(self._settings, self._jobs)


class OutcomeWatcher(_Process):
    """:func:`outcomes_watch_main` in its own process."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._settings = settings
        self.extra = self._ctx.Value("q", 0)

    def __enter__(self) -> OutcomeWatcher:
        args = (self._settings, self.target, self.done_at, self.cpu, self.extra, self.ready)
        self.launch(outcomes_watch_main, *args)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def duplicates(self) -> int:
        """Outcome records beyond every job's own (after :meth:`wait`)."""
        return int(self.extra.value)


def completion_watcher(settings: Settings, queue: str) -> OffsetWatcher | OutcomeWatcher:
    """The watcher for ``settings``' emitter (see the module's docstring)."""
    if settings.emitter.transactional:
        return OutcomeWatcher(settings)
    return OffsetWatcher(settings, queue)
