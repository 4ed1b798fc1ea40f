"""A job id reused from another process: told by the cluster, not only by memory.

The ``scheduled`` outcome carries the job's content hash (``df-content-hash``);
a client with ``check_existing_ids=True`` looks an explicit job id up before it
writes: the same content is the earlier job again (nothing written), other
content a :class:`ConflictError`. Here over the in-memory log, where a second
client stands for another process (its own memory knows nothing).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.errors import ConflictError
from dueflow.kafka.topics import names
from dueflow.producers.existing import existing_job
from dueflow.rules.job_status import JobStatus, scheduled_content_hash
from dueflow.testing import InMemoryPipeline, InMemoryScheduler

HASH_A = "a" * 32
HASH_B = "b" * 32


def status(**fields: Any) -> JobStatus:
    base: dict[str, Any] = {
        "job_id": "order-7",
        "state": "scheduled",
        "queue": "default",
        "task": "send",
        "idempotency_key": "order-7",
        "due_ms": 1_000,
        "attempts": 0,
        "last_outcome": "scheduled",
        "updated_ms": 1_000,
        "last_error": None,
        "schedule_id": None,
        "queues": ("default",),
        "history": (),
        "content_hash": HASH_A,
    }
    base.update(fields)
    return JobStatus(**base)


def test_no_outcome_is_a_new_job() -> None:
    assert existing_job(None, content_hash=HASH_A, task="send") is None


def test_the_same_hash_is_the_earlier_job() -> None:
    got = existing_job(status(), content_hash=HASH_A, task="send")
    assert got is not None
    assert (got.job_id, got.duplicate, got.due_ms, got.content_hash) == (
        "order-7",
        True,
        1_000,
        HASH_A,
    )


@pytest.mark.parametrize(
    ("found", "task", "says"),
    [
        (status(), "send", f"content hash {HASH_A}"),  # same task, other payload
        (status(task="other"), "send", "task 'other'"),
        (status(content_hash=None, task="other"), "send", "task 'other'"),
    ],
)
def test_other_content_is_a_conflict(found: JobStatus, task: str, says: str) -> None:
    with pytest.raises(ConflictError) as info:
        existing_job(found, content_hash=HASH_B, task=task)
    message = str(info.value)
    assert "job_id 'order-7' already exists with other content" in message
    assert says in message
    assert "not scheduled again" in message


def test_without_a_hash_the_same_task_counts_as_the_same_job() -> None:
    got = existing_job(status(content_hash=None), content_hash=HASH_B, task="send")
    assert got is not None
    assert got.duplicate
    assert got.content_hash == ""


@pytest.mark.parametrize(
    ("state", "value", "found"),
    [
        ("scheduled", HASH_A.encode(), HASH_A),
        ("succeeded", HASH_A.encode(), None),  # only the scheduled outcome says
        ("scheduled", b"short", None),
        ("scheduled", b"z" * 32, None),  # not hex
        ("scheduled", None, None),
    ],
)
def test_the_hash_is_read_from_the_scheduled_outcome_only(
    state: str, value: bytes | None, found: str | None
) -> None:
    headers = [] if value is None else [(hdr.CONTENT_HASH, value)]
    assert scheduled_content_hash({"state": state}, headers) == found


def other_process(pipeline: InMemoryPipeline, **options: Any) -> InMemoryScheduler:
    """A second client over the same log: another process, its memory empty."""
    return InMemoryScheduler(
        pipeline.settings,
        log=pipeline.log,
        clock=pipeline.clock,
        random_bytes=random.Random(7).randbytes,
        **options,
    ).start()


def scheduled_records(pipeline: InMemoryPipeline) -> int:
    return sum(1 for _ in pipeline.log.records(names(pipeline.settings).timers))


def test_a_reuse_from_another_process_is_refused_or_repeated() -> None:
    with InMemoryPipeline() as pipeline:
        first = pipeline.scheduler.schedule("send", {"n": 1}, job_id="order-7", delay="1h")
        other = other_process(pipeline, check_existing_ids=True)
        with pytest.raises(ConflictError, match="already exists with other content"):
            other.schedule("send", {"n": 2}, job_id="order-7", delay="1h")
        again = other.schedule("send", {"n": 1}, job_id="order-7", delay="2h")
        assert again.duplicate
        assert (again.job_id, again.due_ms, again.content_hash) == (
            "order-7",
            first.due_ms,
            first.content_hash,
        )
        assert scheduled_records(pipeline) == 1  # neither call wrote a timer
        # a new id is written as always
        assert not other.schedule("send", {"n": 2}, job_id="order-8").duplicate
        assert scheduled_records(pipeline) == 2


def test_jobs_of_schedule_many_carry_their_hash_too() -> None:
    with InMemoryPipeline() as pipeline:
        result = pipeline.scheduler.schedule_many(
            [{"task": "send", "payload": {"n": i}, "job_id": f"bulk-{i}"} for i in range(3)]
        )
        assert result.job_ids == ["bulk-0", "bulk-1", "bulk-2"]
        other = other_process(pipeline, check_existing_ids=True)
        with pytest.raises(ConflictError):
            other.schedule("send", {"n": 9}, job_id="bulk-1")
        assert other.schedule("send", {"n": 1}, job_id="bulk-1").duplicate


def test_without_the_check_another_process_does_not_look() -> None:
    """The default: no lookup per call (its cost), as before; the worker then skips
    the second job as a duplicate of the first."""
    with InMemoryPipeline() as pipeline:
        pipeline.scheduler.schedule("send", {"n": 1}, job_id="order-7", delay="1h")
        other = other_process(pipeline)
        assert not other.schedule("send", {"n": 2}, job_id="order-7", delay="1h").duplicate
