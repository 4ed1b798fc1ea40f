"""What an attempt's follow-ups (``ctx.schedule``) add to its batch (no broker).

A successful attempt's batch (one transaction) holds its idempotency ``done``
record and outcome, and for each follow-up a timer record, placed by the
wheel's rule for the time it is written, and a ``scheduled`` outcome. A
failed attempt's follow-ups are not in its batch. An attempt without
follow-ups writes what it wrote before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.execution import JobExecutor
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.store import MemoryKeyStore
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.errors import DueflowError
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.timer_record import spread_of
from dueflow.rules.drain import classify_timer
from dueflow.rules.wheel import place_timer
from tests.support.attempts import NOW, SETTINGS, batch_recorder, job_delivery

N = names(SETTINGS)


@task("step", queue="jobs")
def step(payload: Any, ctx: TaskContext) -> None:
    ctx.schedule("step", {"n": payload["n"] + 1}, delay="1h")


@task("isolated-step", queue="jobs", isolation="process")
def isolated_step(payload: Any, ctx: TaskContext) -> None:
    """Runs in a child process: its follow-up travels back with the answer."""
    ctx.schedule("step", {"n": payload["n"] + 1}, idempotency_key=f"next-{payload['n']}")
    if payload.get("fail"):
        raise ValueError("the child's attempt fails")


REGISTRY = TaskRegistry([step, isolated_step])


RUNNING: set[Any] = set()  # the attempts that run (the runtime's running set)


def planner(clock: int = NOW) -> FollowUpPlanner:
    return FollowUpPlanner(
        SETTINGS, declared={"step": "jobs"}, clock=lambda: clock, running=RUNNING.__contains__
    )


def recorder(chain: FollowUpPlanner) -> BatchRecorder:
    return batch_recorder(follow_ups=chain)


def delivery(chain: FollowUpPlanner, task_name: str = "step", payload: Any = None) -> Delivery:
    job = make_job(task_name, payload or {"n": 1}, queue="jobs", key="k1", due_ms=NOW - 5)
    feed = PartitionFeed(N.exec("jobs"), 2, None, MemoryKeyStore(10**9), chain)
    d = job_delivery(feed, job, exec_headers(job, fired_ms=NOW - 4), 9)
    prepare(d, REGISTRY, now_ms=NOW, limits=WireLimits())
    d.max_attempts = 3
    return d


def context(d: Delivery) -> TaskContext:
    assert d.fields is not None
    return TaskContext(d.fields, 1, 3, d.hmap, ("exec", 2, 9), None, d)


def run(d: Delivery) -> TaskContext:
    """Run the handler as the runtime does: in the running set while it runs."""
    assert d.task is not None
    ctx = context(d)
    RUNNING.add(d)
    try:
        d.task.fn(d.payload, ctx)
    finally:
        RUNNING.discard(d)
    return ctx


def test_a_successful_attempt_writes_its_follow_up_in_its_own_batch() -> None:
    chain = planner()
    rec, d = recorder(chain), delivery(chain)
    run(d)
    written = NOW + 2_000  # the handler ran on for 2 s after the call
    rec.succeeded(d, 2.0, written)
    topics = [r[1] for r in rec.records]
    assert topics == [N.idempotency("jobs"), N.outcomes, N.timers, N.outcomes]
    _, _, partition, key, value, headers = rec.records[2]
    assert key == b"k1/0"
    due = NOW + 3_600_000  # from the call
    assert dict(headers)[hdr.DUE] == str(due).encode()
    placed = place_timer(due_ms=due, now_ms=written, geometry=SETTINGS.wheel, spread=spread_of(key))
    assert partition == placed.partition  # placed for the time it is written
    assert classify_timer(headers, key, {b"jobs": N.exec("jobs")}, {b"jobs": 6}) == (
        due,
        N.exec("jobs"),
        False,
        -1,  # a new job: its exec partition is its key's
    )
    assert codec.decode("job", value)["payload"] == b'{"n":2}'
    version = codec.parse_schema_header(
        hdr.header(rec.records[3][5], hdr.SCHEMA), expected="outcome"
    )
    outcome = codec.decode("outcome", rec.records[3][4], writer_version=version)
    assert (outcome["job_id"], outcome["state"], outcome["due_ms"]) == ("k1/0", "scheduled", due)
    assert rec._metrics.follow_ups.labels("jobs", "written")._value.get() == 1


def test_a_failed_attempts_follow_ups_are_dropped() -> None:
    chain = planner()
    rec, d = recorder(chain), delivery(chain)
    run(d)
    rec.failed(d, Failure("ValueError", "no"), 0.1, NOW)
    assert N.timers not in [r[1] for r in rec.records]  # its retry, key, outcome only
    assert [r[1] for r in rec.records] == [N.retry("jobs", 200), N.idempotency("jobs"), N.outcomes]
    assert rec._metrics.follow_ups.labels("jobs", "dropped")._value.get() == 1
    assert chain.buffers == {}  # forgotten


def test_an_attempt_without_follow_ups_writes_what_it_always_wrote() -> None:
    chain = planner()
    rec, d = recorder(chain), delivery(chain)
    rec.succeeded(d, 0.1, NOW)
    assert [r[1] for r in rec.records] == [N.idempotency("jobs"), N.outcomes]


def test_a_call_from_an_attempt_that_is_no_longer_running_raises() -> None:
    chain = planner()
    ctx = context(delivery(chain))  # not in the running set
    with pytest.raises(DueflowError, match="after the attempt ended"):
        ctx.schedule("step", queue="jobs")
    assert chain.buffers == {}  # nothing left behind for the recorder to look at


def test_a_process_isolated_handlers_follow_ups_come_back_from_the_child() -> None:
    chain = FollowUpPlanner(
        SETTINGS, declared={"step": "jobs"}, clock=lambda: NOW, running=lambda _o: True
    )

    async def main() -> list[tuple[Delivery, Failure | None]]:
        executor = JobExecutor(concurrency=2, metrics=Metrics(), isolated_processes=1)
        done: list[tuple[Delivery, Failure | None]] = []
        finished = asyncio.Event()

        def report(job: Any, failure: Failure | None, seconds: float, returned: Any) -> None:
            done.append((job, failure))
            if len(done) == 2:
                finished.set()

        try:
            for payload in ({"n": 1}, {"n": 5, "fail": True}):
                d = delivery(chain, "isolated-step", payload)
                assert d.task is not None
                executor.run(d, d.task, d.payload, context(d), 60.0, report)
            async with asyncio.timeout(60):
                await finished.wait()
        finally:
            await executor.close()
        return done

    results = {d.payload["n"]: (d, failure) for d, failure in asyncio.run(main())}
    ok, ok_failure = results[1]
    assert ok_failure is None
    rec = recorder(chain)
    rec.succeeded(ok, 0.1, NOW)
    timers = [r for r in rec.records if r[1] == N.timers]
    assert [r[3] for r in timers] == [b"next-1"]
    failed, failure = results[5]
    assert failure is not None
    assert failure.message == "the child's attempt fails"
    assert chain.pending(failed) == ()  # nothing came back from a failed child
