"""Processes with skewed clocks never start a job early nor shorten a retry's backoff.

The emitter and two workers run under Debian's libfaketime: the emitter and
one worker 2 s ahead of the machine's clock, the other worker 2 s behind.
The broker and this test keep the true clock. Every run is recorded by the
handler with its own (skewed) clock and its pid; the test knows each pid's
skew, so it judges on the true clock: no job starts before the due time the
client asked for, and no retry starts before its backoff has passed since
the failed attempt. Without the clock probe (``dueflow.rules.clock_offset``) the fast
processes start jobs up to 2 s early and the slow worker's retries run
almost 2 s before their backoff ends.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dueflow.producers import Scheduler
from tests.chaos.skew import ClockSkewer, SkewUnavailable, skewed_env
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, wait_for
from tests.integration.worker_support import Ledger

SKEW_S = 2.0
RETRY_MS = 200  # the queue's first retry tier (pipeline_support.CONFIG)
JOBS = 24
APP = "tests.integration.worker_app"


def skewed(env: dict[str, str], skew_s: float, work: Path) -> dict[str, str]:
    """``env`` for a process whose clock runs ``skew_s`` ahead (libfaketime and the
    chaos suite's wait shim: tests/chaos/skew.py says why both)."""
    try:
        libfaketime, shim = ClockSkewer(work).prepare()
    except SkewUnavailable as exc:
        pytest.fail(f"{exc} (`make test` installs Debian's faketime package)")
    return skewed_env(env, skew_ms=round(skew_s * 1000), libfaketime=libfaketime, shim=shim)


@pytest.mark.timeout(240)
def test_skewed_processes_never_start_a_job_early(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    pipeline = Pipeline(kafka.bootstrap, prefix, tmp_path)
    ledger = Ledger(tmp_path / "ledger.db")
    env = {"DUEFLOW_TEST_LEDGER": str(ledger.path)}
    try:
        pipeline.start("emitter", "emitter", env=skewed(env, SKEW_S, tmp_path))
        skew_of: dict[int, float] = {}
        for name, skew in (("worker-fast", SKEW_S), ("worker-slow", -SKEW_S)):
            proc = pipeline.start(
                name, "worker", "--app", APP, "--queues", QUEUE, env=skewed(env, skew, tmp_path)
            )
            skew_of[proc.pid] = skew
        wait_for(
            "both workers and the emitter started",
            lambda: all("started" in p.log() for p in pipeline.procs),
            90,
        )
        due_ms: dict[str, int] = {}
        with Scheduler(pipeline.settings) as s:
            now = time.time()
            for i in range(JOBS):
                task = "ledger-effect" if i % 2 else "fails-once"
                run_at = datetime.fromtimestamp(now + 1.0 + 3.0 * i / JOBS, tz=UTC)
                job = s.schedule(task, {"ledger": str(ledger.path)}, run_at=run_at, queue=QUEUE)
                due_ms[job.job_id] = job.due_ms
        wait_for("every job's effect", lambda: len(ledger.effects()) == JOBS, 90)
    finally:
        pipeline.stop_all()

    runs: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for key, attempt, at, pid in ledger.runs():
        # The handler's clock was skewed by its process's offset: back to the true clock.
        runs[key].append((attempt, at - skew_of.get(pid, 0.0)))
    assert set(runs) == set(due_ms)
    early = {k: (r[0][1] * 1000 - due_ms[k]) for k, r in runs.items() if r[0][1] * 1000 < due_ms[k]}
    assert not early, f"started before their due time (ms early): {early}"
    retried = [k for k, r in runs.items() if len(r) > 1]
    assert len(retried) == JOBS // 2
    short = {}
    for key in retried:
        (a1, first), (a2, second) = sorted(runs[key])[:2]
        assert (a1, a2) == (1, 2)
        if (second - first) * 1000 < RETRY_MS:
            short[key] = round((second - first) * 1000)
    assert not short, f"retries that ran before their backoff (ms after the failure): {short}"
    # Both skews were exercised: each worker ran jobs.
    assert {pid for *_, pid in ledger.runs()} == set(skew_of)
