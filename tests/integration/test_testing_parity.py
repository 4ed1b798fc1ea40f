"""dueflow.testing decides as the real pipeline does: one scenario, both ways, same outcomes.

The scenario (a job that succeeds, one that fails twice then succeeds, one
that exhausts its attempts, a permanent error, an unknown task, a second job
with a used idempotency key, a cancelled job) runs once on the broker (the
real emitter and worker on threads) and once in memory. The outcome records
the worker wrote, job by job (state and attempt, in order), and the dead
letters (reason and attempts) must be the same. Only the timing differs: on
the broker it is real, in memory the fake clock runs each step at its due time.
"""

from __future__ import annotations

import time
from typing import Any

from dueflow import PermanentJobError, task
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind
from dueflow.producers import Scheduler
from dueflow.records import codec
from dueflow.testing import InMemoryPipeline
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    FAST_WORKER,
    WorkerThread,
    outcomes_of,
    read_topic,
    wait_for,
)
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics, threaded_emitter

QUEUE = "jobs"
FIXED = Backoff(BackoffKind.FIXED, base_ms=300, jitter=False)


@task("ok", queue=QUEUE)
def ok(payload: Any, ctx: TaskContext) -> None:
    """Succeeds."""


@task("flaky", queue=QUEUE, max_attempts=4, backoff=FIXED)
def flaky(payload: Any, ctx: TaskContext) -> None:
    if ctx.attempt <= 2:
        raise ConnectionError(f"attempt {ctx.attempt}")


@task("broken", queue=QUEUE, max_attempts=2)
def broken(payload: Any, ctx: TaskContext) -> None:
    raise RuntimeError("always")


@task("refuses", queue=QUEUE)
def refuses(payload: Any, ctx: TaskContext) -> None:
    raise PermanentJobError("no such customer")


TASKS = [ok, flaky, broken, refuses]


def schedule_scenario(s: Scheduler) -> set[str]:
    """Schedule the jobs (explicit ids, so both runs name them alike); their ids."""
    s.schedule("ok", {"n": 1}, queue=QUEUE, job_id="ok-1", idempotency_key="key-1")
    s.schedule("ok", {"n": 2}, queue=QUEUE, job_id="ok-2", idempotency_key="key-1", delay=1)
    s.schedule("flaky", queue=QUEUE, job_id="flaky-1")
    s.schedule("broken", queue=QUEUE, job_id="broken-1")
    s.schedule("refuses", queue=QUEUE, job_id="refuses-1")
    s.schedule("ghost", queue=QUEUE, job_id="ghost-1")
    s.schedule("ok", queue=QUEUE, job_id="cancelled-1", delay=2)
    s.cancel("cancelled-1", queue=QUEUE)
    return {"ok-1", "ok-2", "flaky-1", "broken-1", "refuses-1", "ghost-1", "cancelled-1"}


FINAL = {"succeeded", "dead", "duplicate", "cancelled"}


def decisions(outcomes: list[dict[str, Any]]) -> dict[str, list[tuple[str, int]]]:
    """The worker's outcomes (not the client's ``cancelled``; not ``started``, a report
    that an attempt runs long), per job, in order."""
    out: dict[str, list[tuple[str, int]]] = {}
    for o in outcomes:
        if o.get("worker") and o["state"] != "started":
            out.setdefault(o["job_id"], []).append((o["state"], o["attempt"]))
    return out


def test_the_in_memory_pipeline_decides_as_the_broker_does(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings: Settings = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200, 500]}],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(settings)
    n = names(settings)

    # --- on the broker
    started = time.monotonic()
    with threaded_emitter(settings) as em, WorkerThread(settings, TaskRegistry(TASKS)):
        em.wait_active()
        with Scheduler(settings) as s:
            jobs = schedule_scenario(s)

        def finished(records: list[Any]) -> bool:
            got = decisions(outcomes_of(records))
            return all(got.get(j) and got[j][-1][0] in FINAL for j in jobs)

        wait_for(
            "every job's last outcome",
            lambda: bool(read_topic(settings, n.outcomes, until=finished, timeout=60)),
            90,
        )
        records = read_topic(settings, n.outcomes)
    on_broker = decisions(outcomes_of(records))
    dead_letters = [r.value for r in read_topic(settings, n.dlq(QUEUE)) if r.value is not None]
    dead_on_broker = {
        (d["job_id"], d["reason"], d["attempts"])
        for d in (codec.decode("dead_letter", value) for value in dead_letters)
    }
    assert time.monotonic() - started < 120

    # --- in memory
    with InMemoryPipeline(TASKS, settings=settings) as p:
        assert schedule_scenario(p.scheduler) == jobs
        p.run_until_idle()
        in_memory = {j: [(r.outcome, r.attempt) for r in p.history if r.job_id == j] for j in jobs}
        dead_in_memory = {(e.job_id, e.reason, e.attempts) for e in p.dead_letters()}

    assert in_memory == on_broker
    assert dead_in_memory == dead_on_broker
    # and the scenario is what it says
    assert on_broker["flaky-1"] == [("retrying", 1), ("retrying", 2), ("succeeded", 3)]
    assert on_broker["ok-2"] == [("duplicate", 1)]
    assert on_broker["cancelled-1"] == [("cancelled", 1)]
    assert dead_on_broker == {
        ("broken-1", "exhausted", 2),
        ("refuses-1", "permanent_error", 1),
        ("ghost-1", "unknown_task", 0),
    }
