"""Unique and debounced jobs on the real broker, with worker and emitter processes.

- 50 threads schedule under one unique key at once: one job is admitted, every call
  returns its id, it runs once;
- a window (``unique_for``): a request inside it is a duplicate, one after it (on
  the owner's clock) is admitted;
- ``debounce``: 20 writes give one run, with the last payload, not before the
  debounce after the last write;
- kill -9 of the worker that owns the keys while admissions flow, and of an emitter
  (the active one or its standby) while the admitted jobs come due: still one job
  per key, each run once, and every caller of a key got that job's id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dueflow.errors import InvalidInput
from dueflow.kafka.topics import names
from dueflow.producers import AsyncScheduler, Scheduler
from dueflow.producers.results import Scheduled
from dueflow.rules.partitioning import partition_for_key
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, Proc
from tests.integration.steering_support import RunLedger, finalize_when_workers_joined
from tests.integration.worker_support import outcomes_of, read_topic, wait_for

APP = "tests.integration.steering_app"


def _worker(pipe: Pipeline, ledger: RunLedger, name: str) -> Proc:
    return pipe.start(
        name, "worker", "--app", APP, "--queues", QUEUE, env={"STEER_LEDGER": str(ledger.path)}
    )


def _outcomes(pipe: Pipeline) -> list[dict[str, Any]]:
    return outcomes_of(read_topic(pipe.settings, names(pipe.settings).outcomes))


def _succeeded(pipe: Pipeline) -> Counter[str]:
    return Counter(str(o["job_id"]) for o in _outcomes(pipe) if o["state"] == "succeeded")


@contextlib.contextmanager
def _pipeline(kafka: KafkaCluster, prefix: str, tmp: Path) -> Any:
    pipe = Pipeline(kafka.bootstrap, prefix, tmp)
    try:
        yield pipe
    except BaseException:
        print(pipe.logs())
        raise
    finally:
        pipe.stop_all()


@pytest.mark.timeout(300)
def test_one_admitted_under_contention_window_expiry_and_debounce(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    with _pipeline(kafka, prefix, tmp_path) as pipe:
        ledger = RunLedger(tmp_path / "runs.db")
        pipe.start("emitter", "emitter")
        with Scheduler(pipe.settings) as s, pytest.raises(InvalidInput) as refused:
            s.schedule("steered", 1, queue=QUEUE, unique_key="k")
        assert refused.value.field == "unique_key"
        assert "finalize" in str(refused.value)
        _worker(pipe, ledger, "worker")
        finalize_when_workers_joined(pipe.settings, QUEUE)
        with Scheduler(pipe.settings) as s:
            # 50 threads at once, one key
            barrier = threading.Barrier(50)
            results: list[Scheduled] = []
            errors: list[BaseException] = []

            def contend(i: int) -> None:
                try:
                    barrier.wait(30)
                    got = s.schedule("steered", {"i": i}, queue=QUEUE, delay="2s", unique_key="k")
                    results.append(got)
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(50)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors
            assert len(results) == 50
            assert not any(r.pending_admission for r in results)
            ids = {r.job_id for r in results}
            assert len(ids) == 1, ids
            (held,) = ids
            assert sum(not r.duplicate for r in results) == 1

            # a window: a duplicate inside it, admitted after it (the owner's clock)
            first = s.schedule("steered", {"w": 1}, queue=QUEUE, unique_key="w", unique_for="3s")
            inside = s.schedule("steered", {"w": 2}, queue=QUEUE, unique_key="w", unique_for="3s")
            assert (inside.job_id, inside.duplicate) == (first.job_id, True)
            admitted_at = next(
                o["at_ms"]
                for o in _outcomes(pipe)
                if o["job_id"] == first.job_id and o["state"] == "scheduled"
            )
            wait_for("the window to pass", lambda: time.time() * 1000 > admitted_at + 3_500, 30)
            after = s.schedule("steered", {"w": 3}, queue=QUEUE, unique_key="w", unique_for="3s")
            assert not after.duplicate
            assert after.job_id != first.job_id

            # debounce: 20 writes, one run with the last payload
            writes = [
                s.schedule("steered", {"d": n}, queue=QUEUE, unique_key="deb", debounce="3s")
                for n in range(20)
            ]
            assert len({w.job_id for w in writes}) == 1
            debounced = writes[0].job_id

            # cancel by id reaches a job admitted under a key (delivered on the key's
            # partition, not its own key's), and so releases the key
            partitions = pipe.settings.queue(QUEUE).partitions
            key_partition = partition_for_key(b"c", partitions)
            own = next(  # an idempotency key of another partition than the unique key's
                f"far-{n}"
                for n in range(100)
                if partition_for_key(f"far-{n}".encode(), partitions) != key_partition
            )
            far = s.schedule(
                "steered", {"c": 1}, queue=QUEUE, delay="30d", unique_key="c", idempotency_key=own
            )
            cancelled = s.cancel(far.job_id, wait=30)
            assert (cancelled.verdict, cancelled.partition) == ("cancelled", key_partition)
            again = s.schedule("steered", {"c": 2}, queue=QUEUE, delay="30d", unique_key="c")
            assert not again.duplicate

        # the command line: the holder's id (exit 0), or refused (exit 1)
        cli = [sys.executable, "-m", "dueflow", "schedule", "steered", "--queue", QUEUE]
        out = subprocess.run(
            [*cli, "--unique-key", "c", "--delay", "1h", "--json"],
            env=pipe.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        assert (shown["job_id"], shown["duplicate"]) == (again.job_id, True)
        out = subprocess.run(
            [*cli, "--unique-key", "c", "--on-duplicate", "refuse"],
            env=pipe.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 1, out
        assert again.job_id in out.stdout

        async def from_asyncio() -> Scheduled:
            async with AsyncScheduler(pipe.settings) as a:
                return await a.schedule("steered", 3, queue=QUEUE, unique_key="c")

        got = asyncio.run(from_asyncio())
        assert (got.job_id, got.duplicate) == (again.job_id, True)

        wanted = {held, first.job_id, after.job_id, debounced}
        wait_for("every admitted job to succeed", lambda: wanted <= set(_succeeded(pipe)), 90)
        runs = ledger.runs()
        assert len([r for r in runs if r[0] == held]) == 1
        ran = [r for r in runs if r[0] == debounced]
        assert [r[2] for r in ran] == [{"d": 19}]
        # due 3 s after the last write (its request's due time), not before
        assert ran[0][4] * 1000 >= writes[-1].due_ms - 2
        succeeded = _succeeded(pipe)
        assert all(succeeded[j] == 1 for j in wanted)
        outcomes = _outcomes(pipe)
        dedup = [o for o in outcomes if o["state"] == "deduplicated"]
        assert sum(1 for o in dedup if o["first_job_id"] == held) == 49
        # every job run (and no other) is one of the admitted ones
        assert {r[0] for r in runs} == wanted
        # the keys released at their jobs' ends: the steering topic holds the entry of
        # the one key still held (by a job due in 30 days)
        wait_for(
            "every released key's entry removed",
            lambda: set(_unique_entries(pipe)) == {b"u\x00c"},
            90,  # a window's entry: by the worker's sweep, once a minute
        )


def _unique_entries(pipe: Pipeline) -> dict[bytes, bytes]:
    """The last record of every unique key in the steering topic (tombstones dropped)."""
    last: dict[bytes, bytes | None] = {}
    for r in read_topic(pipe.settings, names(pipe.settings).steering(QUEUE)):
        if r.key is not None and r.key.startswith(b"u\x00"):
            last[r.key] = r.value
    return {k: v for k, v in last.items() if v is not None}


@pytest.mark.timeout(420)
def test_kill_9_of_the_owner_during_admissions(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    keys = [f"key-{i}" for i in range(12)]
    contenders = 6
    rng = random.Random(7)
    with _pipeline(kafka, prefix, tmp_path) as pipe:
        ledger = RunLedger(tmp_path / "runs.db")
        emitters = [pipe.start("emitter-a", "emitter"), pipe.start("emitter-b", "emitter")]
        workers = [_worker(pipe, ledger, "worker-a"), _worker(pipe, ledger, "worker-b")]
        finalize_when_workers_joined(pipe.settings, QUEUE, workers=2)
        partitions = pipe.settings.queue(QUEUE).partitions
        assert len({partition_for_key(k.encode(), partitions) for k in keys}) > 1
        stop = threading.Event()
        kills = [0]
        emitter_kills = [0]

        def fault() -> None:
            n = 0
            while not stop.is_set():
                # the fault schedule, not a synchronization: the first kill (a worker's)
                # soon after the admissions begin (on a fast machine they take a few
                # seconds in all), then two workers' to one emitter's, until every job ran
                stop.wait(rng.uniform(0.3, 1.0) if n == 0 else rng.uniform(1.0, 2.5))
                if stop.is_set():
                    return
                n += 1
                emitter = n % 3 == 2
                procs = emitters if emitter else workers
                victim = rng.randrange(len(procs))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(procs[victim].pid, signal.SIGKILL)
                procs[victim].popen.wait(10)
                if emitter:
                    emitter_kills[0] += 1
                    emitters[victim] = pipe.start(f"emitter-{victim}-{n}", "emitter")
                else:
                    kills[0] += 1
                    workers[victim] = _worker(pipe, ledger, f"worker-{victim}-{n}")

        got: dict[str, list[Scheduled]] = {k: [] for k in keys}
        errors: list[BaseException] = []
        clients = [Scheduler(pipe.settings).start() for _ in range(contenders)]

        def contend(key: str, i: int) -> None:
            try:
                for _round in range(3):
                    r = clients[i].schedule(
                        "steered",
                        {"key": key, "i": i},
                        queue=QUEUE,
                        delay="10s",
                        unique_key=key,
                        admission_wait=120,
                    )
                    got[key].append(r)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        faults = threading.Thread(target=fault, daemon=True)
        faults.start()
        threads = [
            threading.Thread(target=contend, args=(k, i)) for k in keys for i in range(contenders)
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(200)
            assert not errors, errors
            by_key: dict[str, set[str]] = {}
            for key, results in got.items():
                assert len(results) == 3 * contenders
                assert not any(r.pending_admission for r in results), key
                by_key[key] = {r.job_id for r in results}
            every = set().union(*by_key.values())
            # the faults go on while the admitted jobs come due and run
            wait_for("every key's job to succeed", lambda: every <= set(_succeeded(pipe)), 180)
        finally:
            stop.set()
            faults.join(30)
            for c in clients:
                c.close()
        assert kills[0] >= 1  # an owner was killed while admissions went on
        assert emitter_kills[0] >= 1, kills  # and an emitter while the jobs came due
        outcomes = _outcomes(pipe)
        admitted: dict[str, list[int]] = {}
        ended: dict[str, list[int]] = {}
        for o in outcomes:
            if o["state"] == "scheduled" and o.get("command_id") is not None:
                admitted.setdefault(str(o["job_id"]), []).append(int(o["at_ms"]))
            elif o["state"] == "succeeded":
                ended.setdefault(str(o["job_id"]), []).append(int(o["at_ms"]))
        # every id a caller got was admitted once (one committed admission) and
        # succeeded once; nothing else was admitted or ran
        assert set(admitted) == every, set(admitted) ^ every
        assert all(len(v) == 1 for v in admitted.values()), admitted
        assert all(len(ended[j]) == 1 for j in every), ended
        assert {r[0] for r in ledger.runs()} == every
        # one job per key at a time: a key's next job was admitted after the last ended
        for key, ids in by_key.items():
            spans = sorted((admitted[j][0], ended[j][0]) for j in ids)
            for (_a0, end0), (start1, _e1) in itertools.pairwise(spans):
                assert start1 >= end0, (key, spans)
        jobs_per_key = Counter(len(ids) for ids in by_key.values())
        print(
            f"worker kills: {kills[0]}; emitter kills: {emitter_kills[0]}; keys: {len(keys)}; "
            f"calls: {len(keys) * contenders * 3}; "
            f"keys by number of jobs admitted in turn: {dict(jobs_per_key)}"
        )
