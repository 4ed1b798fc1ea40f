"""Results and progress with real processes against the broker.

``dueflow emitter`` and ``dueflow worker --app tests.integration.results_app``
processes share one settings file (a wheel that turns in seconds, commits every
50 ms); the test schedules with the SDK, reads the outcomes topic
read_committed and asks ``Scheduler.result`` and ``dueflow job``:

- a worker killed -9 after a handler returned and before its commit leaves no
  result; the job runs again on another worker, whose commit writes the one
  ``succeeded`` outcome, with that run's result;
- a result over the cap (the worker's 64 KiB or the task's own) and a value that
  is not JSON give ``result_error``: the job succeeded and ran once;
  ``Scheduler.result`` raises ``ResultNotKept``, ``dueflow job --result`` exits 4;
- a chain with ``pass_result``: the child receives its parent's result;
- ``Scheduler.result`` with a timeout on a job that does not finish raises
  ``ResultTimeout`` on time;
- a handler that reports progress 10,000 times a second gets at most one progress
  outcome a second, and ``dueflow job`` shows its progress while it runs; many such
  handlers together stay under the process's ``worker.progress_max_per_s``; a long
  job without progress gets one ``started`` outcome.

Every process is stopped by pid at the end.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.errors import JobFailed, ResultNotKept, ResultTimeout
from dueflow.kafka.topics import names
from dueflow.producers import AsyncScheduler, Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import Pipeline, Proc, wait_for
from tests.integration.worker_support import Ledger, outcomes_of, read_topic

APP = "tests.integration.results_app"
QUEUE = "jobs"


class Results(Pipeline):
    """The processes of one test, and its ledger."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ledger = Ledger(self.tmp / "ledger.db")

    def results_worker(self, name: str, env: dict[str, str] | None = None) -> Proc:
        return self.start(
            name,
            "worker",
            "--app",
            APP,
            "--queues",
            QUEUE,
            env={"DUEFLOW_TEST_LEDGER": str(self.ledger.path), **(env or {})},
        )

    def outcomes(self, job_id: str | None = None) -> list[dict[str, Any]]:
        found = outcomes_of(read_topic(self.settings, names(self.settings).outcomes))
        return [o for o in found if job_id is None or o["job_id"] == job_id]

    def measured(self, key: str, what: str) -> int:
        ((_key, number, _at, _pid),) = self.ledger.runs(f"{key}:{what}")
        return number


@pytest.fixture
def results(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Results]:
    r = Results(kafka.bootstrap, prefix, tmp_path)
    try:
        yield r
    finally:
        r.stop_all()


def cli(capsys: pytest.CaptureFixture[str], results: Results, *argv: str) -> tuple[int, str, str]:
    """``dueflow <argv>`` in this process with the test's settings: (exit, out, err)."""
    capsys.readouterr()
    env = {"DUEFLOW_BOOTSTRAP": results.bootstrap, "DUEFLOW_TOPIC_PREFIX": results.prefix}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code = main([*argv, "--config", str(results.config)])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.timeout(240)
def test_a_worker_killed_before_its_commit_leaves_exactly_one_result(results: Results) -> None:
    """The victim commits every 60 s: the handler returns (its effect is in the ledger)
    and the kill -9 comes long before the commit. No result was written; the survivor
    runs the job again and its commit writes the one result, its own."""
    results.start("emitter", "emitter")
    victim = results.results_worker("victim", env={"DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "60000"})
    with Scheduler(results.settings) as s:
        job = s.schedule("sum-rows", {"rows": [1, 2, 3]}, queue=QUEUE)
        key = job.idempotency_key
        wait_for("the victim's handler to return", lambda: results.ledger.effects().get(key), 90)
        os.kill(victim.pid, signal.SIGKILL)
        victim.popen.wait(10)
        assert [o["state"] for o in results.outcomes(job.job_id)] == ["scheduled"]

        survivor = results.results_worker("survivor")
        got = s.result(job.job_id, timeout=120)
    assert got == {"sum": 6, "pid": survivor.pid}  # the committed run's result
    assert survivor.stop() == 0, results.logs()
    runs = results.ledger.runs(key)
    assert [(attempt, pid) for _k, attempt, _at, pid in runs] == [
        (1, victim.pid),
        (1, survivor.pid),
    ]
    succeeded = [o for o in results.outcomes(job.job_id) if o["state"] == "succeeded"]
    assert len(succeeded) == 1
    assert orjson.loads(succeeded[0]["result"]) == {"sum": 6, "pid": survivor.pid}


@pytest.mark.timeout(240)
def test_results_over_the_cap_or_not_json_are_errors_of_a_succeeded_job(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    results.start("emitter", "emitter")
    worker = results.results_worker("worker")
    with Scheduler(results.settings) as s:
        kept = s.schedule("echo", {"return": {"ok": [1, 2]}}, queue=QUEUE)
        at_cap = s.schedule("echo", {"return": "z", "times": 65_534}, queue=QUEUE)  # 65,536 B
        over_cap = s.schedule("echo", {"return": "z", "times": 65_535}, queue=QUEUE)
        task_cap = s.schedule("small-result", None, queue=QUEUE)
        not_json = s.schedule("returns-a-set", None, queue=QUEUE)
        isolated = s.schedule("isolated-sum", {"rows": [4, 5]}, queue=QUEUE)
        assert s.result(kept.job_id, timeout=90) == {"ok": [1, 2]}
        assert s.result(at_cap.job_id, timeout=60) == "z" * 65_534
        assert s.result(isolated.job_id, timeout=60) == {"sum": 9}
        errors = {}
        for job in (over_cap, task_cap, not_json):
            with pytest.raises(ResultNotKept) as err:
                s.result(job.job_id, timeout=60)
            errors[job.job_id] = err.value.error
    assert (
        "result of 65,537 bytes exceeds worker.result_max_bytes = 65,536" in errors[over_cap.job_id]
    )
    assert (
        "result of 2,002 bytes exceeds worker.result_max_bytes = 1,000" in errors[task_cap.job_id]
    )
    assert "result is not JSON: set value" in errors[not_json.job_id]
    for job in (over_cap, task_cap, not_json):
        # ran once, succeeded once (done: never retried), with the error in the outcome
        assert len(results.ledger.runs(job.idempotency_key)) == 1
        states = [o["state"] for o in results.outcomes(job.job_id)]
        assert states == ["scheduled", "succeeded"]
        (done,) = [o for o in results.outcomes(job.job_id) if o["state"] == "succeeded"]
        assert (done["result"], done["result_error"]) == (None, errors[job.job_id])
    isolated_done = results.outcomes(isolated.job_id)[-1]
    assert (isolated_done["progress"], orjson.loads(isolated_done["progress_detail"])) == (
        0.5,
        {"half": True},
    )
    logged = [e for e in worker.json_lines() if e.get("event") == "job.result_not_kept"]
    assert sorted(e["job_id"] for e in logged) == sorted(errors)

    code, out, stderr = cli(
        capsys, results, "job", kept.job_id, "--result", "--kafka", "--wait", "30"
    )
    assert (code, json.loads(out), stderr) == (0, {"ok": [1, 2]}, "")
    code, out, stderr = cli(capsys, results, "job", not_json.job_id, "--result", "--kafka")
    assert (code, out) == (4, "")
    assert "result is not JSON" in stderr
    assert worker.stop() == 0, results.logs()


@pytest.mark.timeout(240)
def test_a_chained_job_receives_its_parents_result_and_a_dead_job_raises(
    results: Results,
) -> None:
    results.start("emitter", "emitter")
    results.results_worker("worker")

    async def ask() -> tuple[Any, Any]:
        async with AsyncScheduler(results.settings) as s:
            first = await s.schedule("parent", {"rows": [10, 20, 12], "label": "q3"}, queue=QUEUE)
            dead = await s.schedule("fails", None, queue=QUEUE)
            child = await s.result(f"{first.idempotency_key}/0", timeout=120)
            with pytest.raises(JobFailed) as err:
                await s.result(dead.job_id, timeout=60)
            return (first, child), err.value

    (first, child), failed = asyncio.run(ask())
    assert child == {"label": "q3", "parent": {"total": 42}, "from": first.job_id}
    assert failed.error_type == "dueflow.errors.PermanentJobError"
    assert failed.error == "the account is closed"
    (record,) = [
        r
        for r in read_topic(results.settings, names(results.settings).exec(QUEUE))
        if r.key == f"{first.idempotency_key}/0".encode()
    ]
    assert orjson.loads(record.headers[hdr.PARENT_RESULT]) == {"total": 42}


@pytest.mark.timeout(240)
def test_progress_is_rate_limited_visible_while_running_and_result_times_out_on_time(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handler reports progress 10,000 times a second until the test lets it end:
    ``dueflow job`` shows its progress while it runs, ``Scheduler.result(timeout=2)``
    raises ResultTimeout after 2 s (not much later), and the job got at most one
    progress outcome per second. A quiet job that runs 2.5 s gets one ``started``."""
    stop = results.tmp / "stop"
    results.start("emitter", "emitter")
    worker = results.results_worker("worker")
    with Scheduler(results.settings) as s:
        chatty = s.schedule("chatty", {"stop": str(stop), "rate": 10_000}, queue=QUEUE)
        quiet = s.schedule("quiet-slow", {"seconds": 2.5}, queue=QUEUE)
        key = chatty.idempotency_key

        def shown_running() -> dict[str, Any] | None:
            code, out, _err = cli(capsys, results, "job", chatty.job_id, "--kafka", "--json")
            job = json.loads(out).get("job") if code == 0 else None
            return job if job and job["state"] == "started" and job.get("progress") else None

        view = wait_for("dueflow job to show the chatty job's progress", shown_running, 90)
        assert 0 <= view["progress"] <= 1
        assert set(view["progress_detail"]) == {"reports"}
        code, text, _err = cli(capsys, results, "job", chatty.job_id, "--kafka")
        assert code == 0
        assert "state         started" in text
        assert "progress      " in text
        assert results.ledger.effects().get(key) is None  # still running

        began = time.monotonic()
        with pytest.raises(ResultTimeout) as err:
            s.result(chatty.job_id, timeout=2)
        waited = time.monotonic() - began
        assert err.value.state == "started"
        assert 2.0 <= waited < 4.0, waited  # on time: the last lookup gets the time left
        assert results.ledger.effects().get(key) is None

        wait_for("the chatty job to have run 5 s", lambda: _ran_for(results, key) >= 5.0, 60)
        stop.touch()
        chatty_result = s.result(chatty.job_id, timeout=60)
        assert isinstance(chatty_result, dict), chatty_result
        assert isinstance(chatty_result["reports"], int)
        assert chatty_result["reports"] > 0
        s.result(quiet.job_id, timeout=60)
    assert worker.stop() == 0, results.logs()

    reports = results.measured(key, "reports")
    elapsed_s = results.measured(key, "elapsed_ms") / 1000
    progress = [
        o
        for o in results.outcomes(chatty.job_id)
        if o["state"] == "started" and o["progress"] is not None
    ]
    # one a second at most (the interval), counted over the handler's own run
    assert 1 <= len(progress) <= math.ceil(elapsed_s) + 1, (len(progress), elapsed_s)
    assert reports >= 100 * len(progress)  # what was reported and not written: coalesced
    states = [o["state"] for o in results.outcomes(quiet.job_id)]
    assert states == ["scheduled", "started", "succeeded"]
    (started,) = [o for o in results.outcomes(quiet.job_id) if o["state"] == "started"]
    assert started["progress"] is None


@pytest.mark.timeout(240)
def test_many_chatty_handlers_stay_under_the_process_cap(results: Results) -> None:
    """Ten handlers report for 4 s each with a 100 ms interval (100 outcomes a second
    without the cap); the process writes at most worker.progress_max_per_s = 5 a second
    (plus one second of burst)."""
    results.start("emitter", "emitter")
    worker = results.results_worker(
        "worker",
        env={
            "DUEFLOW_WORKER_PROGRESS_MAX_PER_S": "5",
            "DUEFLOW_WORKER_PROGRESS_INTERVAL_MS": "100",
        },
    )
    with Scheduler(results.settings) as s:
        jobs = [
            s.schedule("chatty", {"seconds": 4, "rate": 10_000}, queue=QUEUE) for _ in range(10)
        ]
        for job in jobs:
            s.result(job.job_id, timeout=120)
    assert worker.stop() == 0, results.logs()
    runs = {j.idempotency_key: results.ledger.runs(j.idempotency_key)[0][2] for j in jobs}
    first = min(runs.values())
    last = max(at + results.measured(k, "elapsed_ms") / 1000 for k, at in runs.items())
    progress = [
        o
        for j in jobs
        for o in results.outcomes(j.job_id)
        if o["state"] == "started" and o["progress"] is not None
    ]
    window = last - first
    assert 1 <= len(progress) <= 5 * math.ceil(window) + 5 + 1, (len(progress), window)


def _ran_for(results: Results, key: str) -> float:
    runs = results.ledger.runs(key)
    return time.time() - runs[0][2] if runs else 0.0
