"""dueflow.testing: the job lifecycle a user steers (status, cancel, reschedule, expiry,
cron overlap), with the semantics of the real client and worker."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import InvalidInput, task
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


# ------------------------------------------------------------ cancel


def test_cancel_says_whether_it_found_the_job_and_what_state_it_was_in() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        waiting = p.scheduler.schedule("t", delay="1h")
        ran = p.scheduler.schedule("t")
        p.run_due()
        c = p.scheduler.cancel(waiting.job_id)
        assert (c.cancelled, c.found, c.state) == (True, True, "scheduled")
        assert "it will not run" in c.message
        done = p.scheduler.cancel(ran.job_id)  # it ran: nothing to cancel, nothing written
        assert (done.cancelled, done.found, done.state) == (False, True, "succeeded")
        assert "not cancelled: it has succeeded already" in done.message
        again = p.scheduler.cancel(waiting.job_id)
        assert (again.cancelled, again.state) == (False, "cancelled")
        p.run_until_idle()
        assert [c[0] for c in calls] == [ran.job_id]


def test_cancel_of_a_job_nobody_knows_needs_the_queue_and_says_it_was_not_found() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        with pytest.raises(InvalidInput, match="give queue="):
            p.scheduler.cancel("someone-elses")
        blind = p.scheduler.cancel("someone-elses", queue="default")
        assert (blind.cancelled, blind.found, blind.state) == (True, False, None)
        assert "not found" in blind.message


def test_cancel_of_a_job_due_beyond_the_queues_idempotency_retention_is_refused() -> None:
    """Workers forget a cancellation after the retention (7 days): it would not hold."""
    with InMemoryPipeline([recording("t", [])]) as p:
        far = p.scheduler.schedule("t", delay="8d")
        with pytest.raises(InvalidInput, match="idempotency_retention_ms"):
            p.scheduler.cancel(far.job_id)
        near = p.scheduler.schedule("t", delay="6d")
        assert p.scheduler.cancel(near.job_id).cancelled
