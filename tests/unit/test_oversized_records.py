"""A worker never writes a record its topic would refuse (no broker): a retry that
would not fit is a dead letter, a follow-up that would not fit is dead-lettered in
its own queue, and a dead letter is trimmed or keeps the job's value by reference."""

from __future__ import annotations

import dataclasses
from typing import Any

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.oversized import RECORD_TOO_LARGE_TYPE, WriteLimits
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.store import MemoryKeyStore
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.kafka.topic_limits import default_limits
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind
from dueflow.records import codec
from dueflow.records import worker_codec as fast
from dueflow.records.record_size import record_size
from dueflow.records.size_budget import VALUE_REF, QueueLimits, TopicLimit
from dueflow.rules.partitioning import partition_for_key
from tests.support.attempts import NOW, SETTINGS, batch_recorder, job_delivery

N = names(SETTINGS)
FIXED = Backoff(BackoffKind.FIXED, base_ms=500, max_ms=60_000, jitter=False)
LONG = Backoff(BackoffKind.FIXED, base_ms=30_000, max_ms=60_000, jitter=False)
TRACEBACK = "Traceback (most recent call last):\n" + "  frame\n" * 3_000 + "ValueError: no\n"


@task("flaky", queue="jobs")
def flaky(payload: Any, ctx: Any) -> None:
    raise ValueError("no")


@task("chain", queue="jobs")
def chain(payload: Any, ctx: TaskContext) -> None:
    ctx.schedule("flaky", {"blob": "x" * 20_000}, delay="1h")


def limits(**changes: int) -> QueueLimits:
    out = default_limits(SETTINGS, SETTINGS.queue("jobs"))
    for name, max_bytes in changes.items():
        if name == "retries":
            out = dataclasses.replace(
                out, retries=tuple(TopicLimit(t.topic, max_bytes) for t in out.retries)
            )
        else:
            changed: dict[str, Any] = {name: TopicLimit(getattr(out, name).topic, max_bytes)}
            out = dataclasses.replace(out, **changed)
    return out


def delivery(
    payload: Any,
    *,
    backoff: Backoff = FIXED,
    task_name: str = "flaky",
    planner: FollowUpPlanner | None = None,
) -> Delivery:
    job = make_job(task_name, payload, queue="jobs", key="k1", backoff=backoff, due_ms=NOW - 5)
    feed = PartitionFeed(N.exec("jobs"), 4, None, MemoryKeyStore(10**9), planner)
    d = job_delivery(feed, job, exec_headers(job, fired_ms=NOW - 4), 17)
    prepare(d, TaskRegistry([flaky, chain]), now_ms=NOW, limits=WireLimits())
    d.max_attempts = job.max_attempts
    return d


def recorder_with(lim: QueueLimits) -> BatchRecorder:
    rec = batch_recorder()
    rec.limits = WriteLimits(lim)
    return rec


def dead_letter_of(rec: BatchRecorder) -> tuple[Any, dict[str, Any]]:
    (dlq,) = [r for r in rec.records if r[1] == N.dlq("jobs")]
    return dlq, codec.decode("dead_letter", dlq[4])


def test_a_retry_that_would_not_fit_its_tier_is_a_dead_letter() -> None:
    rec = recorder_with(limits(retries=20_000))
    d = delivery({"blob": "x" * 19_800})  # fits exec; the retry's headers push it over
    rec.failed(d, Failure("ValueError", "no", TRACEBACK), 0.01, NOW)
    assert [r[1] for r in rec.records] == [N.dlq("jobs"), N.idempotency("jobs"), N.outcomes]
    _, dead = dead_letter_of(rec)
    assert dead["reason"] == "other"
    assert dead["error_type"] == "ValueError"  # the failure is kept
    assert dead["error_message"].startswith("not retried: the retry record would be ")
    assert dead["error_message"].endswith(
        f"bytes, over max.message.bytes 20000 of {N.retry('jobs', 500)}; "
        "the attempt failed with: no"
    )
    assert dead["traceback"] == TRACEBACK
    assert dead["attempts"] == 1
    key_state = rec.records[1][4]
    assert fast.decode_key_state(key_state, b"dueflow.IdempotencyRecord/2")[0] == "dead"
    assert rec._metrics.too_large.labels("worker", "retry record")._value.get() == 1


def test_a_retry_timer_that_would_not_fit_the_timer_topic_is_a_dead_letter() -> None:
    rec = recorder_with(limits(timers=20_000))
    d = delivery({"blob": "x" * 19_800}, backoff=LONG)
    rec.failed(d, Failure("ValueError", "no"), 0.01, NOW)
    _, dead = dead_letter_of(rec)
    assert dead["error_message"].startswith("not retried: the retry timer would be ")
    assert f"of {N.timers}" in dead["error_message"]
    assert N.timers not in [r[1] for r in rec.records]


def test_a_dead_letter_of_a_near_limit_job_keeps_the_end_of_its_traceback() -> None:
    rec = recorder_with(limits(dlq=40_000))
    d = delivery({"blob": "x" * 30_000})
    d.max_attempts = 1
    rec.failed(d, Failure("ValueError", "no", TRACEBACK), 0.01, NOW)
    dlq, dead = dead_letter_of(rec)
    assert record_size(dlq[3], dlq[4], dlq[5]) <= 40_000
    assert dead["reason"] == "exhausted"
    assert dead["job_value"] == d.msg.value()  # the job whole: redrive runs it
    assert dead["traceback"].startswith("[... ")
    assert dead["traceback"].endswith("  frame\nValueError: no\n")
    assert rec._metrics.set_aside_trimmed.labels("worker", "dead_letter", "texts")._value.get() == 1


def test_a_dead_letter_without_room_for_the_value_refers_to_the_record_that_failed() -> None:
    rec = recorder_with(limits(dlq=20_000))
    d = delivery({"blob": "x" * 30_000})
    d.max_attempts = 1
    rec.failed(d, Failure("ValueError", "no", TRACEBACK), 0.01, NOW)
    dlq, dead = dead_letter_of(rec)
    assert record_size(dlq[3], dlq[4], dlq[5]) <= 20_000
    ref = f"{N.exec('jobs')}:4:17".encode()
    assert dead["job_value"] == b""
    assert dead["job_headers"][VALUE_REF] == ref
    assert hdr.header(dlq[5], VALUE_REF) == ref
    assert dead["traceback"].endswith("ValueError: no\n")


def test_a_follow_up_that_would_not_fit_is_dead_lettered_in_its_own_queue() -> None:
    running: set[Any] = set()
    planner = FollowUpPlanner(
        SETTINGS,
        declared={"chain": "jobs", "flaky": "jobs"},
        clock=lambda: NOW,
        running=running.__contains__,
    )
    rec = batch_recorder(follow_ups=planner)
    d = delivery({}, task_name="chain", planner=planner)
    ctx = TaskContext(d.fields, 1, 3, d.hmap, ("exec", 4, 17), None, d)  # type: ignore[arg-type]
    running.add(d)
    d.task.fn(d.payload, ctx)  # type: ignore[union-attr]
    running.discard(d)
    rec.limits = WriteLimits(limits(timers=10_000))  # lowered since the call
    rec.succeeded(d, 0.1, NOW + 1)
    topics = [r[1] for r in rec.records]
    assert N.timers not in topics
    assert topics == [
        N.idempotency("jobs"),
        N.outcomes,
        N.dlq("jobs"),
        N.idempotency("jobs"),
        N.outcomes,
    ]
    dlq = rec.records[2]
    key = b"k1/0"
    assert dlq[3] == key
    assert dlq[2] == partition_for_key(key, 6)
    dead = codec.decode("dead_letter", dlq[4])
    assert (dead["job_id"], dead["error_type"], dead["attempts"]) == (
        "k1/0",
        RECORD_TOO_LARGE_TYPE,
        0,
    )
    assert dead["error_message"].startswith("not scheduled: the timer record would be ")
    assert codec.decode("job", dead["job_value"])["task"] == "flaky"  # redrive runs it
    assert fast.decode_key_state(rec.records[3][4], b"dueflow.IdempotencyRecord/2") == (
        "dead",
        dead["dead_ms"],
        0,
    )
    version = codec.parse_schema_header(
        hdr.header(rec.records[4][5], hdr.SCHEMA), expected="outcome"
    )
    assert codec.decode("outcome", rec.records[4][4], writer_version=version)["state"] == "dead"
