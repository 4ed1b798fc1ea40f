"""A rolling restart of every worker while 15 s jobs run (five session timeouts):
none runs twice.

Worker processes are restarted one after another with SIGTERM (drain,
commit, leave) while long jobs run. With incremental rebalances a member
gives up only the partitions that move, after their jobs ended, and keeps
running the others; so every job runs exactly once: no job that finished
runs again, and no job starts on a new owner while it still runs on the
old one.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.topics import names
from tests.integration.test_worker_processes import (
    QUEUE,
    Processes,
    procs,  # noqa: F401  (the fixture)
    succeeded,
    wait_members,
)
from tests.integration.worker_support import outcomes_of, read_topic, wait_for

JOB_S = 15.0
PARTITIONS = 4


def _write_wave(writer: ExecWriter, wave: int, count: int) -> list[str]:
    keys = [f"k-wave{wave}-{i}" for i in range(count)]
    writer.write(make_job("ledger-effect", {"sleep_s": JOB_S}, queue=QUEUE, key=k) for k in keys)
    writer.flush()
    return keys


def _wait_running(workers: Processes, count: int) -> None:
    wait_for(
        f"{count} jobs running or done",
        lambda: len({k for k, _, _, _ in workers.ledger.runs()}) == count,
        60,
    )


def _wait_draining(workers: Processes, count: int) -> None:
    wait_for("the drain to begin", lambda: workers.logs().count("shutting down") >= count)


@pytest.mark.timeout(600)
def test_a_rolling_restart_with_15s_jobs_runs_every_job_exactly_once(
    procs: Processes,  # noqa: F811
) -> None:
    s = procs.configure(partitions=PARTITIONS, concurrency=8, shutdown_grace_s=JOB_S + 15)
    writer = ExecWriter(s)
    first = [procs.start(), procs.start()]
    wait_members(s, 2)
    keys = _write_wave(writer, 1, 8)
    _wait_running(procs, len(keys))

    replacements = []
    for n, old in enumerate(first):
        old.send_signal(signal.SIGTERM)  # drains its jobs (up to JOB_S), commits, leaves
        _wait_draining(procs, n + 1)
        # A wave in the middle of the drain: the survivor runs its part of it
        # now, and is still running it when the draining member leaves (a
        # rebalance with long jobs in flight on a member that stays).
        keys += _write_wave(writer, n + 2, 8)
        assert old.wait(JOB_S + 45) == 0
        replacements.append(procs.start())
        wait_members(s, 2)  # the replacement took partitions over
        _wait_running(procs, len(keys))

    outs = succeeded(s, len(keys), timeout=JOB_S * 4)
    for proc in replacements:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(JOB_S + 45) == 0

    runs = Counter(key for key, _attempt, _at, _pid in procs.ledger.runs())
    assert runs == Counter(dict.fromkeys(keys, 1)), "a job ran twice (or never)"
    assert procs.ledger.effects() == dict.fromkeys(keys, 1)
    done = Counter(o["idempotency_key"] for o in outs if o["state"] == "succeeded")
    assert done == Counter(dict.fromkeys(keys, 1))
    # Nothing of it was dead-lettered or retried on the way.
    states = Counter(o["state"] for o in outcomes_of(read_topic(s, names(s).outcomes)))
    assert set(states) <= {"succeeded", "duplicate", "started"}, states  # started: runs long
    assert "abandoning" not in procs.logs(), "a job was abandoned"
