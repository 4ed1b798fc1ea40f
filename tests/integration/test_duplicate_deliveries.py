"""Every exec record written two and three times, as an emitter firing without
transactions does after a takeover: each job still runs once.

Worker processes (the CLI) run the jobs while one is killed (kill -9) and
replaced, one joins and one leaves (SIGTERM): rebalances with copies of a job
in flight in the same partition at the same time (written back to back), copies
that arrive after the job's end was committed, and copies that arrive at the
partition's next owner. Some jobs are due a few seconds later, with copies
written before and after their due time. Proven on the outcomes Kafka
committed and the handlers' ledger:

- none lost: every job has a committed ``succeeded`` outcome, exactly one, and
  one ``done`` idempotency record;
- every other copy is skipped: a committed ``duplicate`` outcome for each;
- no unexcused run: a job runs again only after the process that ran it was
  killed before committing it (the one legitimate re-run, as without copies);
- none early: no run starts before its due time.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.worker_codec import decode_key_state
from dueflow.wall_clock import wall_ms
from tests.conftest import KafkaCluster
from tests.integration.test_worker_processes import Processes, wait_members
from tests.integration.worker_support import outcomes_of, read_topic, wait_for

QUEUE = "jobs"


@pytest.fixture
def procs(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(kafka, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


class Copies:
    """Writes copies of jobs' exec records, each as the emitter fires one: the same
    key, value and partition, its own ``df-fired`` and ``df-src``."""

    def __init__(self, writer: ExecWriter) -> None:
        self.writer = writer
        self.written: Counter[str] = Counter()

    def write(self, jobs: list[Job]) -> None:
        for job in jobs:
            copy = self.written[job.idempotency_key]
            headers = exec_headers(job)
            headers = [h for h in headers if h[0] != hdr.SOURCE]
            headers.append((hdr.SOURCE, hdr.source_of("timers", 0, copy)))
            self.writer.write_raw(
                QUEUE, job.idempotency_key.encode(), codec.encode("job", job.to_record()), headers
            )
            self.written[job.idempotency_key] += 1
        self.writer.flush()


def _committed(settings: Any) -> list[dict[str, Any]]:
    return outcomes_of(read_topic(settings, names(settings).outcomes, timeout=30))


@pytest.mark.timeout(420)
def test_each_job_runs_once_when_its_record_is_written_two_and_three_times(
    procs: Processes,
) -> None:
    s = procs.configure(partitions=6, concurrency=8)
    first = [procs.start(), procs.start()]
    wait_members(s, 2)
    copies = Copies(ExecWriter(s))
    now = wall_ms()
    # Every 8th job is slow: copies then wait behind a running attempt of their key.
    jobs = [
        make_job(
            "ledger-effect",
            {"sleep_s": 0.6 if i % 8 == 0 else 0.01},
            queue=QUEUE,
            key=f"k{i:04d}",
        )
        for i in range(480)
    ]
    later = [
        make_job("ledger-effect", {}, queue=QUEUE, key=f"later{i:03d}", due_ms=now + 6_000)
        for i in range(60)
    ]
    thirds = jobs[::3]  # written three times

    # Two copies back to back: in flight in one partition at the same time.
    copies.write([c for job in jobs[:240] for c in (job, job)])
    copies.write(jobs[240:])
    copies.write(later)
    wait_for(
        "the first jobs to run",
        lambda: len(procs.ledger.runs()) >= 100,
        90,
    )
    # kill -9 the busier worker while it runs jobs, and replace it.
    pids = Counter(pid for _, _, _, pid in procs.ledger.runs())
    victim = max(first, key=lambda p: pids[p.pid])
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    killed_at = time.time()
    replacement = procs.start()
    copies.write(jobs[240:])  # the second copy of the rest, across the rebalance
    copies.write(later)
    # One more joins: partitions move while copies arrive.
    joiner = procs.start()
    wait_members(s, 3)
    copies.write(thirds)  # third copies: most of these jobs ended long ago
    # One leaves cleanly (SIGTERM: it finishes and commits what it runs).
    leaver = next(p for p in first if p is not victim)
    leaver.send_signal(signal.SIGTERM)
    assert leaver.wait(90) == 0
    wait_members(s, 2)
    copies.write([job for job in later if job not in thirds][:30])  # after their due time
    every = jobs + later
    want = sum(copies.written.values())

    def all_committed() -> bool:
        outs = _committed(s)
        won = {o["idempotency_key"] for o in outs if o["state"] == "succeeded"}
        skipped = sum(1 for o in outs if o["state"] == "duplicate")
        return len(won) == len(every) and len(won) + skipped >= want

    wait_for("every job and every copy accounted for", all_committed, 240)
    for p in (replacement, joiner):
        p.send_signal(signal.SIGTERM)
        assert p.wait(90) == 0

    outs = _committed(s)
    keys = {j.idempotency_key for j in every}
    won = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert set(won) == keys, f"lost: {sorted(keys - set(won))[:10]}"
    assert set(won.values()) == {1}, "a job succeeded twice"
    # Every copy skipped (a copy read again after the kill is skipped again: its
    # partition's committed offset can lag behind a slow job, as without copies).
    skipped = Counter(o["idempotency_key"] for o in outs if o["state"] == "duplicate")
    for key in keys:
        assert skipped[key] >= copies.written[key] - 1, (key, skipped[key], copies.written[key])
    idem = read_topic(s, names(s).idempotency(QUEUE))
    done = Counter(
        r.key.decode()
        for r in idem
        if r.key and r.value and decode_key_state(r.value, r.headers.get(hdr.SCHEMA))[0] == "done"
    )
    assert done == Counter(dict.fromkeys(keys, 1))

    # Runs: again only after a kill -9 of the process that ran it first.
    runs: dict[str, list[tuple[float, int]]] = {}
    for key, _attempt, at, pid in procs.ledger.runs():
        runs.setdefault(key, []).append((at, pid))
    unexcused = [
        (key, r)
        for key, r in runs.items()
        if len(r) > 1 and any(pid != victim.pid or at > killed_at for at, pid in r[:-1])
    ]
    assert not unexcused, unexcused[:10]
    assert set(runs) == keys
    due = {j.idempotency_key: j.due_ms for j in every}
    early = [(k, at) for k, r in runs.items() for at, _ in r if at * 1000 < due[k]]
    assert not early, early[:10]
    reruns = sum(len(r) - 1 for r in runs.values())
    print(
        f"{len(keys)} jobs, {want} records, {sum(skipped.values())} skipped, "
        f"{reruns} excused re-runs after the kill"
    )
