"""Chains of jobs (``ctx.schedule``) and worker hooks, with real processes.

``dueflow emitter`` and ``dueflow worker --app tests.integration.chain_app``
processes share one settings file (a wheel that turns in seconds, commits
every 50 ms); the test schedules with the SDK and reads the topics
read_committed. A follow-up's timer is written in the transaction that
completes its parent, so:

- a chain of three steps runs each step once, each one at or after its due
  time, in one trace;
- a worker killed -9 after a step's handler returned and before its commit
  leaves no follow-up; the step runs again on the other worker, whose commit
  writes the follow-up: one exec record per follow-up key;
- an attempt that fails writes no follow-up;
- a follow-up without a queue is routed by its task to a queue registered
  while the worker runs; one for a queue that exists nowhere fails its
  attempt with the SDK's error.

Hooks: startup before the first job, failure after each failed attempt (with
``will_retry``), shutdown after the last commit; a startup hook that raises
stops the worker with exit code 5 and one line, before it joins its group.
Every process is stopped by pid at the end.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.consumers import TaskRegistry, task
from dueflow.kafka.topics import names
from dueflow.producers import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import Pipeline, Proc, wait_for
from tests.integration.worker_support import (
    FAST_WORKER,
    Ledger,
    Record,
    WorkerThread,
    outcomes_of,
    read_topic,
)
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    ensure_topics,
    threaded_emitter,
)

APP = "tests.integration.chain_app"
QUEUE = "jobs"


class Chain(Pipeline):
    """The processes of one test, and its ledger."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ledger = Ledger(self.tmp / "ledger.db")

    def chain_worker(self, name: str, env: dict[str, str] | None = None) -> Proc:
        return self.start(
            name,
            "worker",
            "--app",
            APP,
            "--queues",
            QUEUE,
            env={"DUEFLOW_TEST_LEDGER": str(self.ledger.path), **(env or {})},
        )

    def runs(self, key: str) -> list[tuple[int, int]]:
        """(attempt, pid) of each run of ``key``, in order."""
        return [(attempt, pid) for _k, attempt, _at, pid in self.ledger.runs(key)]

    def hook_calls(self, prefix: str) -> list[tuple[str, int, int]]:
        return [
            (key, attempt, pid)
            for key, attempt, _at, pid in self.ledger.runs()
            if key.startswith(prefix)
        ]

    def exec_records(self, until: Any = None, timeout: float = 30.0) -> list[Record]:
        return read_topic(
            self.settings, names(self.settings).exec(QUEUE), until=until, timeout=timeout
        )

    def outcomes(self) -> list[dict[str, Any]]:
        return outcomes_of(read_topic(self.settings, names(self.settings).outcomes))


@pytest.fixture
def chain(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Chain]:
    c = Chain(kafka.bootstrap, prefix, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def schedule(chain: Chain, task: str, payload: dict[str, Any], **kwargs: Any) -> Any:
    with Scheduler(chain.settings) as s:
        return s.schedule(
            task, {**payload, "ledger": str(chain.ledger.path)}, queue=QUEUE, **kwargs
        )


def keys_of(first_key: str, steps: int) -> list[str]:
    """The idempotency keys of a chain's steps: the first job's, then ``<key>/0`` ..."""
    out = [first_key]
    for _ in range(steps - 1):
        out.append(f"{out[-1]}/0")
    return out


def spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(180)
def test_a_chain_of_three_steps_runs_each_step_exactly_once_in_one_trace(chain: Chain) -> None:
    traces = chain.tmp / "spans.jsonl"
    chain.start("emitter", "emitter")
    worker = chain.chain_worker(
        "worker",
        env={"OTEL_TRACES_EXPORTER": "jsonl", "DUEFLOW_TRACES_JSONL": str(traces)},
    )
    first = schedule(chain, "chain-step", {"step": 1, "of": 3, "delay_ms": 1500})
    keys = keys_of(first.idempotency_key, 3)
    wait_for("the third step's effect", lambda: chain.ledger.effects().get(keys[2]) == 1, 90)
    assert worker.stop() == 0, chain.logs()

    assert chain.ledger.effects() == dict.fromkeys(keys, 1)
    assert [len(chain.runs(k)) for k in keys] == [1, 1, 1]
    # Each follow-up is one exec record (read_committed), naming its parent, fired at or
    # after its due time: 1.5 s after the call in its parent's handler.
    records = chain.exec_records()
    by_key = Counter(r.key for r in records)
    assert by_key == Counter({k.encode(): 1 for k in keys})
    started = {k: chain.ledger.runs(k)[0][2] for k in keys}
    for parent, child in itertools.pairwise(keys):
        (record,) = [r for r in records if r.key == child.encode()]
        assert record.headers[hdr.PARENT] == parent.encode()  # job id = key here
        due = int(record.headers[hdr.DUE])
        assert int(record.headers[hdr.FIRED]) >= due - AHEAD_MS  # fired ahead at most
        assert started[child] * 1000 >= due - 50  # (the handler's clock, ms resolution)
        assert started[child] - started[parent] >= 1.4
    outcomes = chain.outcomes()
    done = Counter(o["idempotency_key"] for o in outcomes if o["state"] == "succeeded")
    assert done == Counter(dict.fromkeys(keys, 1))
    scheduled = [o for o in outcomes if o["state"] == "scheduled"]
    # the first by the client (on by default), the follow-ups in their parent's txn
    assert sorted(o["job_id"] for o in scheduled) == sorted(keys)
    # One trace: each step's attempt is a child of the previous step's attempt span.
    executes = {
        s["attributes"]["dueflow.job_id"]: s
        for s in spans(traces)
        if s["name"] == "dueflow.execute"
    }
    assert set(executes) == set(keys)
    assert len({executes[k]["trace_id"] for k in keys}) == 1
    for parent, child in itertools.pairwise(keys):
        assert executes[child]["parent_span_id"] == executes[parent]["span_id"]


@pytest.mark.timeout(240)
def test_a_worker_killed_after_a_step_ran_and_before_its_commit_leaves_one_follow_up(
    chain: Chain,
) -> None:
    """The victim commits every 60 s: the step's handler returns (its effect is in the
    ledger) and the kill -9 comes long before the commit. Nothing of the attempt, its
    follow-up included, was written; the survivor runs the step again and writes it."""
    chain.start("emitter", "emitter")
    victim = chain.chain_worker("victim", env={"DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "60000"})
    wait_for("the victim's startup hook", lambda: chain.hook_calls("hook:startup"), 60)
    first = schedule(chain, "chain-step", {"step": 1, "of": 3})
    keys = keys_of(first.idempotency_key, 3)
    wait_for("the victim's first step to return", lambda: chain.ledger.effects().get(keys[0]), 90)
    os.kill(victim.pid, signal.SIGKILL)
    victim.popen.wait(10)
    # The victim never committed: neither the step's success nor its follow-up exists
    # (the one `scheduled` outcome is the client's, of the first step).
    written = [o for o in chain.outcomes() if o["state"] in ("succeeded", "scheduled")]
    assert [(o["job_id"], o["state"]) for o in written] == [(first.job_id, "scheduled")]
    assert [r.key for r in chain.exec_records()] == [keys[0].encode()]

    survivor = chain.chain_worker("survivor")
    wait_for("the third step's effect", lambda: chain.ledger.effects().get(keys[2]) == 1, 120)
    assert survivor.stop() == 0, chain.logs()

    assert chain.runs(keys[0]) == [(1, victim.pid), (1, survivor.pid)]  # ran again, elsewhere
    assert chain.runs(keys[1]) == [(1, survivor.pid)]
    assert chain.runs(keys[2]) == [(1, survivor.pid)]
    # One exec record per follow-up key: the victim's uncommitted one never existed.
    by_key = Counter(r.key for r in chain.exec_records())
    assert by_key == Counter({k.encode(): 1 for k in keys})
    outcomes = chain.outcomes()
    done = Counter(o["idempotency_key"] for o in outcomes if o["state"] == "succeeded")
    assert done == Counter(dict.fromkeys(keys, 1))
    assert {o["worker"].rsplit(":", 1)[1] for o in outcomes if o["state"] == "succeeded"} == {
        str(survivor.pid)
    }


@pytest.mark.timeout(180)
def test_a_failed_attempt_writes_no_follow_up_and_the_hooks_run_around_the_jobs(
    chain: Chain,
) -> None:
    """One job fails once then succeeds, another fails both its attempts: only the
    successful attempt's follow-up exists. The startup hook ran before the first job,
    a failure hook after each failed attempt, the shutdown hook at the end."""
    chain.start("emitter", "emitter")
    worker = chain.chain_worker("worker")
    wait_for("the startup hook", lambda: chain.hook_calls("hook:startup"), 60)
    once = schedule(chain, "schedules-then-fails", {"succeed_at": 2})
    never = schedule(chain, "schedules-then-fails", {"succeed_at": 9})
    child = f"{once.idempotency_key}/0"
    wait_for("the follow-up's effect", lambda: chain.ledger.effects().get(child) == 1, 90)
    dlq = names(chain.settings).dlq(QUEUE)
    dead = read_topic(chain.settings, dlq, until=lambda records: len(records) >= 1, timeout=60)
    # Were a failed attempt's follow-up written, it would be in the transaction of that
    # attempt's retry or dead letter: in the timer topic now, or (fired) in the exec topic.
    timers = read_topic(chain.settings, names(chain.settings).timers)
    exec_keys = Counter(r.key for r in chain.exec_records())
    wait_for("the third failure hook", lambda: len(chain.hook_calls("hook:failure")) == 3, 60)
    assert worker.stop() == 0, chain.logs()

    assert [r.key for r in dead] == [never.idempotency_key.encode()]
    assert [a for a, _ in chain.runs(once.idempotency_key)] == [1, 2]
    assert [a for a, _ in chain.runs(never.idempotency_key)] == [1, 2]
    assert exec_keys[child.encode()] == 1  # the successful attempt's, once
    never_prefix = f"{never.idempotency_key}/".encode()
    assert [r.key for r in timers if r.key and r.key.startswith(never_prefix)] == []
    assert [k for k in exec_keys if k and k.startswith(never_prefix)] == []
    dropped = [e["follow_ups_dropped"] for e in worker.events("job.failed")]
    assert dropped == [1, 1, 1]  # every failed attempt said it dropped its follow-up

    pid = worker.pid
    (startup,) = chain.hook_calls("hook:startup")
    assert startup == ("hook:startup:chain-step,schedules-then-fails", 0, pid)
    jobs_started = [at for key, _a, at, _p in chain.ledger.runs() if not key.startswith("hook:")]
    assert chain.ledger.runs(startup[0])[0][2] < min(jobs_started)  # before the first job
    assert sorted(chain.hook_calls("hook:failure")) == sorted(
        [
            (f"hook:failure:{once.idempotency_key}:True:RuntimeError: attempt 1 fails", 1, pid),
            (f"hook:failure:{never.idempotency_key}:True:RuntimeError: attempt 1 fails", 1, pid),
            (f"hook:failure:{never.idempotency_key}:False:RuntimeError: attempt 2 fails", 2, pid),
        ]
    )
    assert [(k, p) for k, _n, p in chain.hook_calls("hook:shutdown")] == [("hook:shutdown", pid)]


@pytest.mark.timeout(120)
def test_the_shutdown_hook_runs_after_the_workers_last_commit(chain: Chain) -> None:
    """The worker commits every 60 s, so the job that succeeded commits at shutdown;
    the shutdown hook, which reads the committed outcomes, finds its success."""
    chain.start("emitter", "emitter")
    worker = chain.chain_worker("worker", env={"DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "60000"})
    job = schedule(chain, "chain-step", {"step": 1, "of": 1})
    wait_for("the job's effect", lambda: chain.ledger.effects().get(job.idempotency_key), 90)
    assert [o for o in chain.outcomes() if o["state"] == "succeeded"] == []  # not yet
    assert worker.stop() == 0, chain.logs()
    assert chain.hook_calls("hook:shutdown") == [("hook:shutdown", 1, worker.pid)]


@pytest.mark.timeout(120)
def test_a_failing_startup_hook_stops_the_worker_before_it_joins_its_group(
    chain: Chain,
) -> None:
    worker = chain.chain_worker("worker", env={"DUEFLOW_TEST_STARTUP_FAILS": "1"})
    code = worker.popen.wait(60)
    assert code == 5, worker.log()
    lines = worker.log().splitlines()
    (line,) = [x for x in lines if x.startswith("dueflow: ")]
    assert line == (
        f"dueflow: worker startup hook {APP}:opened failed: "
        "ConnectionError: the test's database refused the connection"
    )
    (failed,) = worker.events("worker startup failed")
    assert failed["hook"] == f"{APP}:opened"
    assert worker.events("worker started") == []
    assert chain.hook_calls("hook:") == []  # neither startup's success nor a shutdown
    assert group_members(chain, names(chain.settings).worker_group(QUEUE)) == []  # never joined


def group_members(chain: Chain, group: str) -> list[Any]:
    admin = AdminClient(chain.settings.client_config())
    try:
        described = admin.describe_consumer_groups([group])[group].result(10)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return []
        raise
    return list(described.members)


@pytest.mark.timeout(180)
def test_a_follow_up_is_routed_by_its_task_to_a_queue_created_while_the_worker_runs(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The follow-up without a queue goes where its ``@task`` says (the SDK's rule), to
    a queue registered after the worker started: the worker follows the registry, so
    the call accepts it. A queue that exists nowhere fails the attempt, saying how to
    create it."""
    settings = kafka.settings(
        prefix,
        queues="default:1",
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(settings)
    ran: list[tuple[str, str, str | None]] = []

    @task("order")
    def order(payload: dict[str, Any], ctx: Any) -> None:
        ctx.schedule("ship", {"order": payload["order"]}, queue=payload.get("queue"))

    @task("ship", queue="shipping")
    def ship(payload: dict[str, Any], ctx: Any) -> None:
        ran.append((ctx.queue, ctx.job_id, ctx.parent_job_id))

    registry = TaskRegistry([order, ship])
    with threaded_emitter(settings) as emitter, WorkerThread(settings, registry) as worker:
        emitter.wait_active()
        assert worker.worker.waiting == ["shipping"]
        capsys.readouterr()
        where = ["--bootstrap", kafka.bootstrap, "--topic-prefix", prefix]
        code = main(["queue", "create", "shipping", "--partitions", "2", *where])
        assert code == 0, capsys.readouterr().err
        wait_for("the worker to serve shipping", lambda: worker.worker.waiting == [], 60)
        with Scheduler(settings) as s:
            routed = s.schedule("order", {"order": 1}, queue="default")
            nowhere = s.schedule("order", {"order": 2, "queue": "nowhere"}, queue="default")
        wait_for("the follow-up on shipping", lambda: len(ran) == 1, 60)
        dlq = names(settings).dlq("default")
        (dead,) = read_topic(settings, dlq, until=lambda records: len(records) == 1, timeout=60)
    assert ran == [("shipping", f"{routed.idempotency_key}/0", routed.job_id)]
    assert dead.key == nowhere.idempotency_key.encode()
    assert b"dueflow queue create nowhere" in (dead.value or b"")  # the SDK's words
