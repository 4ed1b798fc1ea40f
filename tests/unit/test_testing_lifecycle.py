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
        with pytest.raises(InvalidInput, match="dueflow queue create nope"):
            p.scheduler.cancel("someone-elses", queue="nope")  # a queue nobody has
        assert p.scheduler.queue_spec("default") == p.settings.queue("default")
        blind = p.scheduler.cancel("someone-elses", queue="default")
        assert (blind.cancelled, blind.found, blind.state) == (True, False, None)
        assert "not found" in blind.message


def test_a_job_due_in_a_century_is_cancelled_for_good() -> None:
    """A cancel is a command the job's worker keeps until the job's timer has fired,
    whatever the horizon (the idempotency retention is 7 days)."""
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        far = p.scheduler.schedule("t", delay="36500d")
        done = p.scheduler.cancel(far.job_id)
        assert (done.cancelled, done.verdict) == (True, "cancelled")
        assert done.command_id is not None
        p.run_until_idle()
        assert calls == []
        assert [(r.outcome, r.ran) for r in p.history] == [("cancelled", False)]
        again = p.scheduler.cancel(far.job_id)
        assert not again.cancelled  # it has cancelled already


# ------------------------------------------------------------ reschedule


def test_a_job_moved_later_runs_then_and_not_at_its_old_time() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", {"n": 7}, delay="10m", idempotency_key="k-7")
        moved = p.scheduler.reschedule(job.job_id, delay="30m")
        assert (moved.rescheduled, moved.old_due_ms, moved.due_ms) == (
            True,
            job.due_ms,
            p.clock() + 30 * 60_000,
        )
        status = p.scheduler.status(job.job_id)
        assert status is not None
        assert (status.state, status.pending, status.due_ms) == ("rescheduled", True, moved.due_ms)
        p.advance(minutes=29)
        assert calls == []  # the old timer came and went: skipped
        assert [(r.outcome, r.ran, r.due_ms) for r in p.history] == [
            ("rescheduled", False, job.due_ms)
        ]
        p.advance(minutes=1)
        assert calls == [(job.job_id, 1, {"n": 7})]  # same job id, payload
        (run,) = p.runs(job.job_id)
        assert (run.at_ms, run.idempotency_key) == (moved.due_ms, "k-7")  # never early
        p.run_until_idle()
        assert len(calls) == 1


def test_a_job_moved_earlier_runs_then_and_its_old_timer_is_a_duplicate() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", delay="1h")
        moved = p.scheduler.reschedule(job.job_id, delay="1m")
        p.run_until_idle()
        assert [(r.outcome, r.at_ms) for r in p.history] == [
            ("succeeded", moved.due_ms),
            ("duplicate", job.due_ms),  # its key is done: never twice
        ]
        assert len(calls) == 1


def test_a_second_reschedule_supersedes_the_first() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", delay="10m")
        first = p.scheduler.reschedule(job.job_id, delay="20m")
        second = p.scheduler.reschedule(job.job_id, delay="30m")
        assert (first.rescheduled, second.rescheduled, second.old_due_ms) == (
            True,
            True,
            first.due_ms,
        )
        p.run_until_idle()
        # Moves later are lazy: the job's timer, when it fires, is written again
        # for the latest one, and that one runs.
        assert [(r.outcome, r.due_ms, r.at_ms) for r in p.history] == [
            ("rescheduled", job.due_ms, job.due_ms),
            ("succeeded", second.due_ms, second.due_ms),
        ]
        assert len(calls) == 1


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("ran", "it has succeeded already"),
        ("cancelled", "it has cancelled already"),
        ("unknown", "not found"),
        ("same time", "it is due then already"),
    ],
)
def test_a_job_that_is_not_pending_is_not_rescheduled_and_says_why(setup: str, reason: str) -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        job = p.scheduler.schedule("t", run_at="2030-01-01T01:00:00Z")
        job_id = job.job_id
        if setup == "ran":
            p.run_until_idle()
        elif setup == "cancelled":
            p.scheduler.cancel(job_id)
        elif setup == "unknown":
            job_id = "nobody-scheduled-this"
        kwargs: dict[str, Any] = {"queue": "default"} if setup == "unknown" else {}
        got = p.scheduler.reschedule(job_id, run_at="2030-01-01T01:00:00Z", **kwargs)
        assert not got.rescheduled
        assert reason in (got.reason or "")
        assert reason in got.message


def test_the_rule_when_the_job_ran_before_its_reschedule_reached_the_worker() -> None:
    """The race: the job ran at its old time; a reschedule written after that (as a
    client that did not see it run would) leaves a second timer, which the key store
    makes a duplicate: still at most once."""
    from dueflow.producers.rescheduling import moved_timer, reschedule_records
    from dueflow.producers.targets import Target

    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", delay="1m")
        (timer,) = p.log.records(p.scheduler.names.timers)
        p.advance(minutes=1)  # it runs
        late = p.clock() + 60_000
        moved = moved_timer(
            timer.value() or b"",
            timer.headers(),
            due_ms=late,
            now_ms=p.clock(),
            placer=p.scheduler.planner.placer,
        )
        p.log.append(p.scheduler.names.timers, moved.key, moved.value, moved.headers)
        target = Target(
            job.job_id, "default", job.job_id, True, "scheduled", job.due_ms, "t", None, None, True
        )
        for rec in reschedule_records(
            p.scheduler.names, target, due_ms=late, at_ms=p.clock(), partitions=1
        ):
            p.log.append(rec.topic, rec.key, rec.value, rec.headers, rec.partition)
        p.run_until_idle()
        assert [(r.outcome, r.ran) for r in p.history] == [
            ("succeeded", True),
            ("duplicate", False),
        ]
        assert len(calls) == 1


# ------------------------------------------------------------ expires / max_lateness


def test_a_job_not_started_by_its_deadline_is_not_run() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        late = p.scheduler.schedule("t", 1, delay="10m", max_lateness="5m")
        assert late.expires_ms == late.due_ms + 300_000
        soon = p.scheduler.schedule("t", 2, delay="10m", expires="2030-01-01T00:20:00Z")
        p.clock.advance(minutes=17)  # every process down past the first deadline
        p.run_due()
        assert [c[2] for c in calls] == [2]
        assert {r.job_id: r.outcome for r in p.history} == {
            late.job_id: "expired",
            soon.job_id: "succeeded",
        }
        st = p.scheduler.status(late.job_id)
        assert st is not None
        assert (st.state, st.finished) == ("expired", True)
        assert p.dead_letters() == []  # not a dead letter


def test_on_time_it_runs_and_its_retries_run_past_the_deadline() -> None:
    calls: list[Any] = []

    @task("flaky-once", max_attempts=3)
    def once(payload: Any, ctx: Any) -> None:
        calls.append((ctx.job_id, ctx.attempt, payload))
        if ctx.attempt == 1:
            raise ConnectionError("not yet")

    with InMemoryPipeline([once]) as p:
        job = p.scheduler.schedule("flaky-once", delay="1m", max_lateness=0)
        p.run_until_idle()
        assert [r.outcome for r in p.history] == ["retrying", "succeeded"]
        assert p.history[1].at_ms > (job.expires_ms or 0)  # the retry ran after it


def test_a_deadline_before_the_due_time_is_refused_and_nothing_is_written() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        before = len(p.log.records(p.scheduler.names.timers))
        with pytest.raises(InvalidInput) as info:
            p.scheduler.schedule("t", delay="1h", expires="2030-01-01T00:30:00Z")
        assert info.value.field == "expires"
        with pytest.raises(InvalidInput) as info:
            p.scheduler.schedule("t", max_lateness="-5m")
        assert info.value.field == "max_lateness"
        assert len(p.log.records(p.scheduler.names.timers)) == before


def test_a_rescheduled_job_keeps_its_window() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", delay="10m", max_lateness="1m")
        moved = p.scheduler.reschedule(job.job_id, delay="1h")
        p.advance(minutes=30)
        p.clock.advance(minutes=30, seconds=30)  # 30 s late: inside its minute
        p.run_due()
        assert [r.outcome for r in p.runs(job.job_id)] == ["succeeded"]
        assert p.runs(job.job_id)[0].at_ms == moved.due_ms + 30_000


# ------------------------------------------------------------ cron overlap


def test_a_schedule_with_an_overlap_policy_fires_on_its_schedules_partition() -> None:
    """In memory one delivery runs at a time, so no occurrence is running when the next
    comes: each runs (a cluster's worker skips or buffers them: tests/integration)."""
    from dueflow.rules.partitioning import partition_for_key

    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        s = p.scheduler.add_schedule(
            "every-minute", cron="* * * * *", timezone="UTC", task="t", overlap="skip"
        )
        assert s.overlap == "skip"
        assert p.scheduler.get_schedule("every-minute") == s
        p.advance(minutes=3)
        assert len(calls) == 3
        parts = p.settings.queue("default").partitions
        assert {r.source[1] for r in p.runs()} == {partition_for_key(b"every-minute", parts)}
        changed = p.scheduler.update_schedule("every-minute", overlap="buffer_one")
        assert (changed.overlap, changed.version > s.version) == ("buffer_one", True)
        with pytest.raises(InvalidInput) as info:
            p.scheduler.update_schedule("every-minute", overlap="sometimes")
        assert info.value.field == "overlap"
