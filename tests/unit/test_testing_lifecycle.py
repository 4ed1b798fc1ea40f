"""dueflow.testing: the job lifecycle a user steers (status, cancel, reschedule, expiry,
cron overlap), with the semantics of the real client and worker."""

from __future__ import annotations

from typing import Any

from dueflow import task
from dueflow.testing import InMemoryPipeline


def recording(name: str, calls: list[Any], **options: Any) -> Any:
    @task(name, **options)
    def handler(payload: Any, ctx: Any) -> None:
        calls.append((ctx.job_id, ctx.attempt, payload))

    return handler


# ------------------------------------------------------------ status


def test_status_shows_a_pending_job_with_its_due_time_then_what_became_of_it() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        job = p.scheduler.schedule("t", {"n": 1}, delay="10m", idempotency_key="k-1")
        pending = p.scheduler.status(job.job_id)
        assert pending is not None
        assert (pending.state, pending.pending, pending.due_ms) == ("scheduled", True, job.due_ms)
        assert (pending.queue, pending.task, pending.idempotency_key) == ("default", "t", "k-1")
        assert (pending.attempts, pending.last_outcome, pending.source) == (
            0,
            "scheduled",
            "memory",
        )
        p.advance(minutes=10)
        done = p.scheduler.status(job.job_id)
        assert done is not None
        assert (done.state, done.pending, done.finished, done.attempts) == (
            "succeeded",
            False,
            True,
            1,
        )
        assert p.scheduler.status("no-such-job") is None
