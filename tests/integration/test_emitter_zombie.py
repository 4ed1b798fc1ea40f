"""An active emitter stopped (SIGSTOP) while jobs fire, replaced, then resumed (SIGCONT).

The stopped emitter fires in transactions (``emitter.transactional``, as the
0.1.0 release does) or without them; its successor fires without them (the
default). Worker processes run the jobs (``ledger-effect``: each run is a row
in the test's ledger). What must hold, from the ledger, the committed outcomes
and the exec topic:

- the successor takes over while the old one is still stopped, and jobs due
  after that run meanwhile: a transactional zombie's open transaction (its
  timeout is 60 s here) was aborted by the successor's fence, so neither the
  committed offsets nor the exec partitions wait for it;
- the zombie commits nothing after the takeover: the timer offsets committed
  in the lease group (and, in transactions, in the offsets group) never move
  back. Without transactions the offsets group holds a copy of the lease
  group's accepted commits for a rollback, written by a plain commit no group
  fences: a copy the zombie's client had queued when it was stopped reaches
  the broker after it resumes. Such a copy may move a partition back (a
  rollback would fire some jobs again, never skip one); the successor's next
  copy moves it forward again, which the verdict checks;
- every job ran exactly once, none before its due time, none lost;
- every copy that reached the exec topic was skipped by a worker (a
  ``duplicate`` outcome each); in transactions the copies are only those the
  successor counts as re-fires (nothing of the zombie's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.topics import names
from tests.chaos.evidence import read_drops
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import log_ms
from tests.integration.test_worker_processes import wait_members
from tests.integration.worker_support import (
    Ledger,
    forgotten_reruns,
    outcomes_of,
    read_topic,
)
from tests.support.emitters import (
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    ensure_topics,
    wait_until,
)
from tests.support.timers import ExecLog, TimerLoad, now_ms
from tests.support.worker_process import WorkerProcess

QUEUE = "jobs"
TASK = "ledger-effect"
RATE = 100  # jobs a second, each due 0.2-2.2 s after it is written


class CommittedOffsets:
    """Samples the timer offsets committed in the emitter's two groups every 50 ms
    (as materialized: read uncommitted) and notes every one that moved back."""

    def __init__(self, settings: Settings) -> None:
        n = names(settings)
        self._tps = [TopicPartition(n.timers, p) for p in range(settings.wheel.total_partitions)]
        groups = {"lease": n.emitter_group, "offsets": n.emitter_offsets_group}
        self._consumers = {
            name: Consumer(
                settings.client_config(**{"group.id": group, "isolation.level": "read_uncommitted"})
            )
            for name, group in groups.items()
        }
        self.last: dict[tuple[str, int], int] = {}
        self.back: list[tuple[str, int, int, int]] = []  # group, partition, from, to
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for name, consumer in self._consumers.items():
                with contextlib.suppress(Exception):  # a sample missed is no evidence
                    for tp in consumer.committed(self._tps, timeout=5):
                        if tp.offset < 0:
                            continue
                        was = self.last.get((name, tp.partition), -1)
                        if tp.offset < was:
                            self.back.append((name, tp.partition, was, tp.offset))
                        self.last[(name, tp.partition)] = tp.offset
            self.samples += 1

    def __enter__(self) -> CommittedOffsets:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for consumer in self._consumers.values():
            consumer.close()


@contextlib.contextmanager
def deployment(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, *, stopped_transactional: bool
) -> Iterator[tuple[Settings, Ledger, EmitterSubprocess, EmitterSubprocess, list[WorkerProcess]]]:
    """Two workers (one process each), the emitter to stop (active) and its successor
    (a standby)."""
    emitter = {**FAST_EMITTER, "transaction_timeout_ms": 60_000}
    s = kafka.settings(prefix, queues=f"{QUEUE}:4", wheel=SMALL_WHEEL, emitter=emitter)
    ensure_topics(s)
    ledger = Ledger(tmp_path / "ledger.db")
    workers: list[WorkerProcess] = []
    zombie = EmitterSubprocess(
        s,
        tmp_path / "emitter-stopped.log",
        {"DUEFLOW_EMITTER_TRANSACTIONAL": str(stopped_transactional).lower()},
    )
    successor = EmitterSubprocess(
        s, tmp_path / "emitter-successor.log", {"DUEFLOW_EMITTER_TRANSACTIONAL": "false"}
    )
    try:
        for i in range(2):
            workers.append(
                WorkerProcess(
                    s,
                    tmp_path / f"worker-{i}.log",
                    app="tests.integration.worker_app",
                    queues=QUEUE,
                    env={"DUEFLOW_TEST_LEDGER": str(ledger.path)},
                )
            )
        zombie.start()
        wait_until(lambda: zombie.active_count() > 0, 60, "the first emitter active")
        successor.start()
        wait_until(lambda: successor.metric("dueflow_ready") == 1, 60, "the standby ready")
        wait_members(s, 2)
        yield s, ledger, zombie, successor, workers
    finally:
        if zombie.alive():
            os.kill(zombie.pid, signal.SIGCONT)  # a stopped process cannot stop
        for p in (zombie, successor):
            p.stop()
        for w in workers:
            w.stop()


def _said_since(proc: EmitterSubprocess, what: str, since_ms: int) -> bool:
    return any(e.get("event") == what and log_ms(e) >= since_ms for e in proc.events())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stopped", ["transactional", "acked"])
def test_an_emitter_stopped_and_resumed_after_a_takeover_commits_nothing_and_nothing_runs_twice(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, stopped: str
) -> None:
    transactional = stopped == "transactional"
    with deployment(kafka, prefix, tmp_path, stopped_transactional=transactional) as (
        s,
        ledger,
        zombie,
        successor,
        workers,
    ):
        exec_log = ExecLog(s, queues=(QUEUE,)).start()
        load = TimerLoad(s, RATE, 120, min_ahead_ms=200, spread_ms=2_000, queue=QUEUE, task=TASK)
        try:
            with CommittedOffsets(s) as offsets:
                load.__enter__()
                wait_until(lambda: len(ledger.runs()) >= 200, 60, "jobs running")
                os.kill(zombie.pid, signal.SIGSTOP)
                stopped_ms = now_ms()
                wait_until(lambda: successor.active_count() > 0, 30, "the successor active")
                took_over_ms = now_ms()

                def ran_since_takeover() -> int:
                    dues = dict(load.dues)
                    return sum(1 for r in ledger.runs() if dues.get(r[0], 0) > took_over_ms)

                # While the zombie is still stopped, jobs due after the takeover run.
                wait_until(
                    lambda: ran_since_takeover() >= 30,
                    30,
                    "jobs due after the takeover to run while the first emitter is stopped",
                )
                before_resume = len(ledger.runs())
                os.kill(zombie.pid, signal.SIGCONT)
                resumed_ms = now_ms()
                wait_until(
                    lambda: _said_since(zombie, "emitter is standby", stopped_ms),
                    30,
                    "the resumed emitter to stand by",
                )
                wait_until(lambda: len(ledger.runs()) >= before_resume + 200, 60, "jobs running on")
                load.stop()
                dues = dict(load.dues)
                wait_until(lambda: set(ledger.effects()) >= set(dues), 90, "every job run")
                exec_log.settle(quiet_s=2.0, timeout_s=60)

            # ------------------------------------------------------------ verdict
            assert offsets.samples >= 10, offsets.samples
            back = offsets.back
            if not transactional:  # the copies in the offsets group: restored since
                back = [b for b in back if b[0] == "lease"] + [
                    b for b in back if b[0] == "offsets" and offsets.last[b[:2]] < b[2]
                ]
            assert not back, f"committed offsets moved back: {offsets.back[:5]}"
            effects = ledger.effects()
            assert set(effects) == set(dues), f"lost {len(set(dues) - set(effects))}"
            # A run its worker forgot (a queue restart or lost partitions before its
            # commit: a stalled machine) runs again; the committed outcomes below
            # must still hold exactly one success per job.
            all_runs = ledger.runs()
            drops = [d for w in workers for d in read_drops(w.proc.pid, w.log)]
            forgotten = forgotten_reruns(all_runs, drops)
            runs = Counter(r[0] for r in all_runs)
            twice = {k: n for k, n in runs.items() if n != 1 and k not in forgotten}
            assert not twice, f"run twice: {list(twice.items())[:5]}"
            assert all(n == runs[k] for k, n in effects.items()), "an effect without its run"
            early = [(k, at) for k, _, at, _ in ledger.runs() if at * 1000 < dues[k]]
            assert not early, f"started before due: {early[:5]}"
            outs = outcomes_of(read_topic(s, names(s).outcomes, timeout=30))
            won = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
            assert set(won) == set(dues), "a job without its outcome"
            assert set(won.values()) == {1}, "a job with two outcomes"
            skipped = sum(1 for o in outs if o["state"] == "duplicate")
            fired = Counter(r.job_id for r in exec_log.records)
            assert set(fired) == set(dues)
            copies = sum(n - 1 for n in fired.values())
            # Every copy is skipped, and counted. A partition its owner lost is read
            # again by the next owner from the committed offset, which stops at the
            # first unfinished job: the jobs that finished past it were committed
            # with their outcomes and are skipped as duplicates too.
            if drops:
                assert skipped >= copies, (skipped, copies)
            else:
                assert skipped == copies, (skipped, copies)
            refires = successor.metric("dueflow_emitter_refires_total")
            assert refires is not None
            said = [e for e in zombie.events() if log_ms(e) >= stopped_ms]
            if transactional:
                assert copies <= refires, (copies, refires)  # nothing of the zombie's
                # What it tried after the SIGCONT was refused: its producers were fenced.
                fenced = [e for e in said if "fenced" in str(e.get("error", "")).lower()]
                assert fenced, said
            print(
                f"\n{stopped}: {len(dues)} jobs; takeover {took_over_ms - stopped_ms} ms after "
                f"the SIGSTOP, SIGCONT {resumed_ms - stopped_ms} ms after it; {copies} copies "
                f"on the exec topic, {skipped} skipped by the workers, {len(forgotten)} run "
                f"again after their worker forgot them, successor refires "
                f"{refires:.0f}; the stopped emitter after SIGCONT: "
                f"{[(e.get('event'), e.get('error')) for e in said]}"
            )
        finally:
            load.stop()
            exec_log.close()
