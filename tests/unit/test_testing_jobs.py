"""dueflow.testing: idempotency, cancellation, payloads on the wire, eager mode, inspection,
and the scheduling API it shares with dueflow.Scheduler."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from dueflow import ConflictError, InvalidInput, Scheduler, task
from dueflow.config import QueueSpec, Settings
from dueflow.model import Backoff, BackoffKind
from dueflow.testing import InMemoryPipeline, InMemoryScheduler, RunawayJobs

FIXED = Backoff(BackoffKind.FIXED, base_ms=10_000, jitter=False)


def recording(name: str, calls: list[Any], *, fail_first: int = 0, **options: Any) -> Any:
    @task(name, **options)
    def handler(payload: Any, ctx: Any) -> None:
        calls.append((ctx.job_id, ctx.attempt, payload))
        if ctx.attempt <= fail_first:
            raise ConnectionError("not yet")

    return handler


# ------------------------------------------------------------ idempotency


def test_a_second_job_with_the_same_key_is_a_duplicate() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        first = p.scheduler.schedule("t", 1, idempotency_key="invoice-7")
        second = p.scheduler.schedule("t", 2, idempotency_key="invoice-7", delay="1h")
        assert first.job_id != second.job_id
        p.run_until_idle()
        assert calls == [(first.job_id, 1, 1)]  # the handler ran once
        assert [(r.job_id, r.outcome, r.ran) for r in p.history] == [
            (first.job_id, "succeeded", True),
            (second.job_id, "duplicate", False),
        ]
        assert p.job(second.job_id).view is not None
        assert p.job(first.job_id).view["duplicates"] == 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("max_attempts", "outcomes"),
    [
        # dead is final too: a later job with the key does not run
        (1, [("a", "dead"), ("b", "duplicate")]),
        # while the first retries, its key is taken: the second is a duplicate (its
        # attempt 1 was handed on), and the first's retry goes on (and dies here)
        (2, [("a", "retrying"), ("b", "duplicate"), ("a", "dead")]),
    ],
)
def test_a_key_is_final_once_done_or_dead_not_while_it_retries(
    max_attempts: int, outcomes: list[tuple[str, str]]
) -> None:
    @task("t", max_attempts=max_attempts, backoff=FIXED)
    def handler(payload: Any, ctx: Any) -> None:
        if ctx.job_id == "a":
            raise ConnectionError("down")

    with InMemoryPipeline([handler]) as p:
        p.scheduler.schedule("t", job_id="a", idempotency_key="k")
        p.scheduler.schedule("t", job_id="b", idempotency_key="k", delay="5s")
        p.run_until_idle()
        assert [(r.job_id, r.outcome) for r in p.history] == outcomes


def test_a_key_is_forgotten_after_the_queues_idempotency_retention() -> None:
    calls: list[Any] = []
    settings = Settings(queues=(QueueSpec("default", idempotency_retention_ms=3_600_000),))
    with InMemoryPipeline([recording("t", calls)], settings=settings) as p:
        p.scheduler.schedule("t", "first", idempotency_key="k")
        p.scheduler.schedule("t", "within", idempotency_key="k", delay="59m")
        p.scheduler.schedule("t", "after", idempotency_key="k", delay="2h")
        p.run_until_idle()
        assert [c[2] for c in calls] == ["first", "after"]
        assert [r.outcome for r in p.history] == ["succeeded", "duplicate", "succeeded"]


def test_the_same_job_id_and_content_is_scheduled_once_other_content_conflicts() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        first = p.scheduler.schedule("t", {"n": 1}, job_id="report-1", delay="1m")
        again = p.scheduler.schedule("t", {"n": 1}, job_id="report-1", delay="1m")
        assert (first.duplicate, again.duplicate) == (False, True)
        assert again.due_ms == first.due_ms
        with pytest.raises(ConflictError):
            p.scheduler.schedule("t", {"n": 2}, job_id="report-1", delay="1m")
        p.run_until_idle()
        assert calls == [("report-1", 1, {"n": 1})]


# ------------------------------------------------------------ cancellation


def test_a_cancelled_job_never_runs() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        job = p.scheduler.schedule("t", delay="1h")
        cancelled = p.scheduler.cancel(job.job_id)
        assert cancelled.known
        assert p.job(job.job_id).state == "cancelled"
        p.run_until_idle()
        assert calls == []
        (decision,) = p.history
        assert (decision.outcome, decision.ran, decision.at_ms) == ("cancelled", False, job.due_ms)


def test_a_cancel_of_a_retrying_job_stops_its_retries() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls, fail_first=1, backoff=FIXED)]) as p:
        job = p.scheduler.schedule("t")
        p.run_due()
        p.scheduler.cancel(job.job_id)
        p.run_until_idle()
        assert [r.outcome for r in p.history] == ["retrying", "cancelled"]
        assert len(calls) == 1


def test_a_cancel_from_another_client_finds_the_jobs_queue_and_a_wrong_queue_is_refused() -> None:
    """Another client does not know the job, its lookup does: the cancellation goes to
    the job's queue (it used to go to "default", and the job ran)."""
    calls: list[Any] = []
    handler = recording("t", calls, queue="billing")
    settings = Settings(queues=(QueueSpec("default"), QueueSpec("billing")))
    with InMemoryPipeline([handler], settings=settings) as p:
        job = p.scheduler.schedule("t", queue="billing", delay="1m")
        other = InMemoryScheduler(
            settings, log=p.log, clock=p.clock, random_bytes=lambda n: b"\0" * n
        ).start()  # another client: it did not schedule the job
        with pytest.raises(InvalidInput, match="was scheduled to \\('billing'\\)"):
            other.cancel(job.job_id, queue="default")
        cancelled = other.cancel(job.job_id)
        assert (cancelled.queue, cancelled.found, cancelled.known, cancelled.state) == (
            "billing",
            True,
            False,
            "scheduled",
        )
        p.run_until_idle()
        assert calls == []


# ------------------------------------------------------------ payloads


@pytest.mark.parametrize(
    ("payload", "received"),
    [
        ({"b": 1, "a": [1, 2]}, {"a": [1, 2], "b": 1}),
        ((1, 2), [1, 2]),  # JSON has no tuples
        (datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), "2030-01-02T03:04:05+00:00"),
        (None, None),
        ("text", "text"),
        (b"\x00\xffraw", b"\x00\xffraw"),  # bytes travel as they are
    ],
)
def test_the_handler_gets_the_payload_as_the_wire_gives_it(payload: Any, received: Any) -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        p.scheduler.schedule("t", payload)
        p.run_due()
        assert calls[0][2] == received


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({1, 2}, "JSON-serializable"),
        (object(), "JSON-serializable"),
        ({1: "int key"}, "JSON-serializable"),
        ("x" * 1_100_000, "bytes of payload"),
    ],
    ids=["set", "object", "int-key", "too-large"],
)
def test_a_payload_the_wire_refuses_is_refused_here(payload: Any, why: str) -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        with pytest.raises(InvalidInput, match=why) as info:
            p.scheduler.schedule("t", payload)
        assert info.value.field == "payload"
        assert p.pending() == []


def test_bad_input_is_refused_before_anything_is_written() -> None:
    with InMemoryPipeline([recording("t", [])]) as p:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"delay": "-5m"}, "delay"),
            ({"queue": "nope"}, "queue"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"backoff": "linear"}, "backoff"),
            ({"run_at": "2030-01-01T00:00:00"}, "run_at"),  # no offset
        ]
        for kwargs, field in cases:
            with pytest.raises(InvalidInput) as info:
                p.scheduler.schedule("t", **kwargs)
            assert info.value.field == field
        assert p.log.topics() == []


def test_a_record_that_does_not_decode_goes_to_the_dlq() -> None:
    """A timer written by some other client with a broken value (not through the SDK)."""
    from dueflow import headers as hdr

    with InMemoryPipeline([recording("t", [])]) as p:
        p.log.append(
            "dueflow.timers",
            b"key-1",
            b"not avro",
            [(hdr.DUE, b"0"), (hdr.QUEUE, b"default"), (hdr.JOB_ID, b"j-1"), (hdr.TASK, b"t")],
        )
        (decision,) = p.run_due()
        assert (decision.outcome, decision.ran, decision.dead_reason) == (
            "dead",
            False,
            "undecodable",
        )
        assert p.dead_letters()[0].job_id == "j-1"


def test_a_timer_for_an_unknown_queue_is_quarantined() -> None:
    from dueflow import headers as hdr

    with InMemoryPipeline([recording("t", [])]) as p:
        p.log.append("dueflow.timers", b"k", b"x", [(hdr.DUE, b"0"), (hdr.QUEUE, b"nope")])
        assert p.run_due() == []
        (bad,) = p.quarantined
        assert bad.reason == "unknown queue: 'nope'"


def test_schedule_many_reports_bad_jobs_and_runs_the_others() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        result = p.scheduler.schedule_many(
            [{"task": "t", "payload": i, "delay": i} for i in range(3)]
            + [{"task": "t", "delay": "-1s"}]
        )
        assert (result.scheduled, result.failed) == (3, 1)
        assert result.errors[0].index == 3
        p.run_until_idle()
        assert [c[2] for c in calls] == [0, 1, 2]


# ------------------------------------------------------------ eager


def test_eager_runs_the_job_and_its_retries_before_schedule_returns() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls, fail_first=2, backoff=FIXED)], eager=True) as p:
        job = p.scheduler.schedule("t", "x", delay="1h")
        assert [c[1] for c in calls] == [1, 2, 3]
        runs = p.runs(job.job_id)
        assert [r.outcome for r in runs] == ["retrying", "retrying", "succeeded"]
        assert all(r.at_ms == p.clock() for r in runs)  # at once: the clock did not move
        assert runs[0].due_ms == job.due_ms > runs[0].at_ms  # the due time is still known
        assert p.pending() == []


def test_eager_leaves_cron_occurrences_to_the_clock() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)], eager=True) as p:
        p.scheduler.add_schedule("hourly", cron="0 * * * *", timezone="UTC", task="t")
        p.scheduler.schedule("t", "now")
        assert [c[2] for c in calls] == ["now"]
        p.advance(hours=2)
        assert len(calls) == 3


def test_jobs_a_handler_schedules_run_in_the_same_call() -> None:
    calls: list[Any] = []

    with InMemoryPipeline(eager=True) as p:

        @task("step")
        def step(payload: int, ctx: Any) -> None:
            calls.append(payload)
            if payload < 3:
                p.scheduler.schedule("step", payload + 1, delay="1m")

        p.register(step)
        p.scheduler.schedule("step", 1)
        assert calls == [1, 2, 3]


def test_a_job_that_schedules_itself_without_end_is_stopped() -> None:
    with InMemoryPipeline(max_runs=50) as p:

        @task("loop")
        def loop(payload: Any, ctx: Any) -> None:
            p.scheduler.schedule("loop")

        p.register(loop)
        p.scheduler.schedule("loop")
        with pytest.raises(RunawayJobs, match="more than 50 runs"):
            p.run_until_idle()


def test_a_handler_cannot_run_the_pipeline() -> None:
    with InMemoryPipeline() as p:

        @task("nested")
        def nested(payload: Any, ctx: Any) -> None:
            p.run_due()

        p.register(nested)
        p.scheduler.schedule("nested")
        (run,) = p.run_due()
        # a usage error (a DueflowError, not retriable): the job is dead at once
        assert (run.outcome, run.dead_reason) == ("dead", "permanent_error")
        assert run.error is not None
        assert "a handler cannot run it" in run.error


# ------------------------------------------------------------ inspection


def test_pending_lists_timers_and_retries_with_their_due_times() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls, fail_first=1, backoff=FIXED)]) as p:
        later = p.scheduler.schedule("t", delay="1h")
        soon = p.scheduler.schedule("t", delay="1m")
        assert [(j.job_id, j.where, j.due_ms) for j in p.pending()] == [
            (soon.job_id, "timer", soon.due_ms),
            (later.job_id, "timer", later.due_ms),
        ]
        p.advance(minutes=1)
        (retry,) = p.pending(soon.job_id)
        assert (retry.where, retry.attempt, retry.due_ms) == ("retry", 2, soon.due_ms + 10_000)
        assert p.job(soon.job_id).state == "retrying"
        assert p.job(soon.job_id).due_ms == retry.due_ms
        assert p.job(later.job_id).state == "scheduled"
        assert p.job("never-scheduled").state == "unknown"


def test_a_job_in_a_queue_no_worker_consumes_is_pending_and_says_so() -> None:
    """A task declared on "billing", a job sent to "default" explicitly: the worker of
    billing's tasks does not read it. (Without queue= it is routed to billing.)"""
    calls: list[Any] = []
    with InMemoryPipeline([recording("invoice", calls, queue="billing")]) as p:
        job = p.scheduler.schedule("invoice", queue="default")
        assert job.queue == "default"
        assert p.run_until_idle() == []
        (stuck,) = p.pending(job.job_id)
        assert (stuck.queue, stuck.where, stuck.consumed) == ("default", "exec", False)
        assert "NOT CONSUMED" in repr(stuck)
        assert p.job(job.job_id).state == "scheduled"
        routed = p.scheduler.schedule("invoice")  # by its @task: billing
        assert routed.queue == "billing"
        p.run_until_idle()
        assert [c[0] for c in calls] == [routed.job_id]


def test_status_is_what_the_status_view_shows() -> None:
    with InMemoryPipeline([recording("t", [], fail_first=1, backoff=FIXED)]) as p:
        job = p.scheduler.schedule("t", delay="1m")
        pending = p.status(job.job_id)  # the client's `scheduled` outcome, before any run
        assert pending is not None
        assert (pending["state"], pending["due_ms"], pending["attempts"]) == (
            "scheduled",
            job.due_ms,
            0,
        )
        p.advance(minutes=1)  # the first attempt fails: its retry is due 10 s later
        waiting = p.status(job.job_id)
        assert waiting is not None
        assert (waiting["state"], waiting["due_ms"]) == ("retrying", job.due_ms)
        assert waiting["next_due_ms"] == job.due_ms + 10_000
        p.run_until_idle()
        view = p.status(job.job_id)
        assert view is not None
        assert (view["state"], view["attempts"]) == ("succeeded", 2)
        assert "next_due_ms" not in view
        assert view["last_error"]["type"] == "ConnectionError"
        assert [h[0] for h in view["history"]] == ["scheduled", "retrying", "succeeded"]
        assert p.status("nope") is None


def test_ids_and_times_are_the_same_on_every_run() -> None:
    def scenario() -> list[tuple[str, int]]:
        jittered = Backoff(BackoffKind.EXPONENTIAL, base_ms=1_000, jitter=True)
        with InMemoryPipeline([recording("t", [], fail_first=2, backoff=jittered)]) as p:
            p.scheduler.schedule("t", jitter="30s")
            p.run_until_idle()
            return [(r.job_id, r.at_ms) for r in p.runs()]

    assert scenario() == scenario()


# ------------------------------------------------------------ the scheduling API

# Scheduler members that are transport, not scheduling: the in-memory client has
# them from the class (a memory producer behind them) and tests need not call them.
TRANSPORT = {"producer", "producer_settings", "write_record", "record_scheduled"}


def test_the_in_memory_scheduler_is_a_scheduler_with_the_same_signatures() -> None:
    assert issubclass(InMemoryScheduler, Scheduler)
    for name, member in inspect.getmembers(Scheduler):
        if name.startswith("_") or not callable(member):
            continue
        ours = inspect.signature(getattr(InMemoryScheduler, name))
        assert ours.parameters == inspect.signature(member).parameters, name


def test_every_public_scheduler_method_is_known_here() -> None:
    """A new public method of Scheduler fails this test: make sure it works in memory
    (override it in dueflow.testing.scheduler if it needs more than the producer),
    test it there, then add it below."""
    public = {
        name
        for name, member in inspect.getmembers(Scheduler)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }
    tested = {
        "start",
        "close",
        "planner",
        "schedules",
        "schedule",
        "schedule_request",
        "schedule_unique",  # tests/unit/test_testing_unique.py
        "existing",  # tests/unit/test_existing_ids.py
        "schedule_many",
        "cancel",
        "cancel_plan",
        "lookup",
        "status",
        "result",  # tests/unit/test_testing_results.py (raises at once when not ended)
        "reschedule",
        "update",  # tests/unit/test_testing_steering.py
        "steerable",  # tests/unit/test_testing_steering.py
        "group",  # tests/unit/test_testing_groups.py
        "timers",
        "queue_spec",
        "add_schedule",
        "update_schedule",
        "pause_schedule",
        "resume_schedule",
        "delete_schedule",
        "get_schedule",
        "list_schedules",
        "queues",
    }
    assert public == tested | TRANSPORT


def test_the_scheduler_works_as_a_context_manager_and_after_a_restart() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("t", calls)]) as p:
        with p.scheduler as s:
            s.schedule("t", 1)
        s.start()
        s.schedule("t", 2)
        p.run_due()
        assert [c[2] for c in calls] == [1, 2]


def test_given_settings_must_configure_the_queues_of_the_tasks() -> None:
    from dueflow.errors import ConfigError

    settings = Settings(queues=(QueueSpec("default"),))
    with InMemoryPipeline(settings=settings) as p:
        with pytest.raises(ConfigError, match="'billing'"):
            p.register(recording("invoice", [], queue="billing"))
        with pytest.raises(InvalidInput, match="queue"):
            p.scheduler.schedule("invoice", queue="billing")


def test_tasks_registered_later_add_their_queues_and_get_what_waits_there() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([recording("a", calls)]) as p:
        p.register(recording("b", calls, queue="late"))
        job = p.scheduler.schedule("b", queue="late", delay="1m")
        p.run_until_idle()
        assert [c[0] for c in calls] == [job.job_id]


def test_the_worker_consumes_the_queues_of_the_tasks_registered_so_far() -> None:
    """As ``dueflow worker`` with those tasks: without tasks every configured queue;
    with tasks, their queues only (a job sent elsewhere waits, unconsumed)."""
    calls: list[Any] = []
    with InMemoryPipeline() as p:
        assert p.worker.queues == ["default"]
        p.register(recording("invoice", calls, queue="billing"))
        assert p.worker.queues == ["billing"]
        stuck = p.scheduler.schedule("invoice", queue="default")  # nobody reads it
        p.run_until_idle()
        assert calls == []
        assert [j.consumed for j in p.pending(stuck.job_id)] == [False]
        p.register(recording("other", calls))  # a task on "default": now it is read
        p.run_until_idle()
        assert [c[0] for c in calls] == [stuck.job_id]


def test_in_memory_jobs_are_routed_by_task_as_the_real_client_routes_them() -> None:
    """`schedule("charge")` goes to the queue its @task names, as with
    `Scheduler(settings, app=...)`; an unknown queue is refused the same way."""
    calls: list[Any] = []
    with InMemoryPipeline([recording("charge", calls, queue="billing")]) as p:
        job = p.scheduler.schedule("charge", {"n": 1})
        assert job.queue == "billing"
        assert p.scheduler.queues.names == {"default", "billing"}
        p.run_until_idle()
        assert calls == [(job.job_id, 1, {"n": 1})]
        p.register(recording("later", calls, queue="reports"))  # registered afterwards
        assert p.scheduler.schedule("later").queue == "reports"
        with pytest.raises(InvalidInput, match="dueflow queue create nowhere"):
            p.scheduler.schedule("charge", queue="nowhere")
