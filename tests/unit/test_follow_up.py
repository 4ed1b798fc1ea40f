"""Follow-up jobs (``ctx.schedule``), the pure part: ids, checks, records, placement.

A follow-up's timer record is built by the scheduling client's own functions,
so it is refused exactly when the SDK refuses the same request (with the same
error) and otherwise has the SDK's value bytes and headers, plus ``df-parent``.
Its ids come from the parent's key and the call's index, so an attempt that
runs again asks for the very same record.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.config import load_settings
from dueflow.consumers.context import TaskContext
from dueflow.consumers.follow_ups import Attempt, FollowUpPlanner, KnownQueues, attempt_open
from dueflow.errors import DueflowError, InvalidInput
from dueflow.kafka.topic_limits import default_limits
from dueflow.kafka.topics import names
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.records import codec
from dueflow.records.follow_up import follow_up_key, place_follow_up, plan_follow_up
from dueflow.records.job_request import MAX_DUE_MS, MAX_NAME_CHARS, JobRequest, JobRules
from dueflow.records.size_budget import JobBudget
from dueflow.records.timer_record import TimerPlacer, spread_of
from dueflow.rules.wheel import place_timer

SETTINGS = load_settings(env={}, overrides={"queues": "default,billing"})
RULES = JobRules.from_settings(SETTINGS)
PLACER = TimerPlacer(SETTINGS.wheel)
TIMERS = names(SETTINGS).timers
NOW = 1_800_000_000_000
PARENT_ID, PARENT_KEY = "order-7", "order-7-key"


def plan(req: JobRequest, *, index: int = 0, now_ms: int = NOW, limit: int = 1_048_588) -> Any:
    return plan_follow_up(
        req,
        parent_job_id=PARENT_ID,
        parent_key=PARENT_KEY,
        index=index,
        now_ms=now_ms,
        rules=RULES,
        placer=PLACER,
        budget=lambda queue: JobBudget(
            default_limits(SETTINGS, SETTINGS.queue(queue), timers_max_bytes=limit)
        ),
    )


# ------------------------------------------------------------------ ids


@pytest.mark.parametrize(
    ("parent", "index", "key"),
    [
        ("k", 0, "k/0"),
        ("k", 12, "k/12"),
        ("k/0", 1, "k/0/1"),  # a follow-up of a follow-up
        ("x" * 253, 0, "x" * 253 + "/0"),  # 255 characters: as it is
    ],
)
def test_the_default_key_is_the_parents_key_and_the_calls_index(
    parent: str, index: int, key: str
) -> None:
    assert follow_up_key(parent, index) == key


def test_a_key_that_would_be_too_long_keeps_its_start_and_a_hash_of_the_whole() -> None:
    a, b = "x" * 260 + "a", "x" * 260 + "b"  # same start, different keys
    ka, kb = follow_up_key(a, 3), follow_up_key(b, 3)
    assert len(ka) == len(kb) == MAX_NAME_CHARS
    assert ka.startswith("x" * 200)
    assert ka.endswith("/3")
    assert ka != kb
    assert follow_up_key(a, 3) == ka  # deterministic
    # a chain of any length keeps bounded keys
    key = "k"
    for n in range(300):
        key = follow_up_key(key, n % 3)
        assert len(key) <= MAX_NAME_CHARS


@pytest.mark.parametrize("index", [-1, True, 1.0, "0"])
def test_an_index_is_a_non_negative_integer(index: Any) -> None:
    with pytest.raises(InvalidInput, match="index"):
        follow_up_key("k", index)


@pytest.mark.parametrize(
    ("queue", "task", "queue_of"),
    [
        ("billing", "report.daily", "billing"),  # the call's queue wins
        (None, "report.daily", "reports"),  # then [routes]
        (None, "send", "billing"),  # then the task's @task(queue=...)
        (None, "other", "default"),  # else default
    ],
)
def test_a_follow_up_without_a_queue_is_routed_as_the_sdk_routes_it(
    queue: str | None, task: str, queue_of: str
) -> None:
    settings = load_settings(
        env={}, overrides={"queues": "default,billing,reports", "routes": {"report.*": "reports"}}
    )
    planner = FollowUpPlanner(
        settings, declared={"send": "billing"}, clock=lambda: NOW, running=attempt_open
    )
    ctx = TaskContext.for_test("parent", {})
    ctx = TaskContext(ctx._fields, 1, 1, {}, ("t", 0, 0), None, Attempt(planner))
    assert ctx.schedule(task, queue=queue).queue == queue_of


def test_a_queue_the_worker_does_not_know_yet_is_looked_up_before_it_is_refused() -> None:
    """A queue registered a moment ago: the registry is read again (off the loop)."""
    exists = {"default"}
    asked: list[str] = []

    def lookup(queue: str) -> bool:
        asked.append(queue)
        exists.add("fresh")  # the registry, read to its end, has it
        return True

    known = KnownQueues(lambda: frozenset(exists), lookup)
    planner = FollowUpPlanner(
        SETTINGS, declared={}, clock=lambda: NOW, running=attempt_open, known=known
    )
    ctx = TaskContext.for_test("parent", {})
    ctx = TaskContext(ctx._fields, 1, 1, {}, ("t", 0, 0), None, Attempt(planner))
    assert ctx.schedule("send", queue="fresh").queue == "fresh"
    assert ctx.schedule("send", queue="default").queue == "default"  # known: not asked
    assert asked == ["fresh"]
    known.lookup = lambda queue: False  # not in the registry either: refused, saying how
    with pytest.raises(InvalidInput, match="dueflow queue create nope"):
        ctx.schedule("send", queue="nope")


@pytest.mark.parametrize(
    ("job_id", "key", "expected"),
    [
        (None, None, ("order-7-key/2", "order-7-key/2")),
        (None, "welcome:user-9", ("welcome:user-9", "welcome:user-9")),  # id follows the key
        ("step-2", None, ("step-2", "step-2")),  # key follows the id, as in the SDK
        ("step-2", "k2", ("step-2", "k2")),
    ],
)
def test_ids_derive_from_the_parent_or_from_the_call(
    job_id: str | None, key: str | None, expected: tuple[str, str]
) -> None:
    planned = plan(JobRequest("send", job_id=job_id, idempotency_key=key), index=2)
    fu = planned.follow_up
    assert (fu.job_id, fu.idempotency_key) == expected
    assert fu.call_index == 2
    assert planned.record.key == expected[1].encode()


@pytest.mark.parametrize(("job_id", "key"), [(None, PARENT_KEY), (PARENT_KEY, None)])
def test_the_parents_own_key_is_refused(job_id: str | None, key: str | None) -> None:
    with pytest.raises(InvalidInput) as err:
        plan(JobRequest("send", job_id=job_id, idempotency_key=key))
    assert err.value.field == "idempotency_key"
    assert "skipped as a duplicate" in err.value.accepted


def test_an_attempt_that_runs_again_asks_for_the_same_job() -> None:
    """The run that crashed before its commit and the run after it: the same job id,
    key, partition key, due time and content; only the creation time differs."""
    req = JobRequest("send", {"order": 7}, run_at="2030-01-01T00:00:00Z", labels={"a": "b"})
    first, again = plan(req, now_ms=NOW), plan(req, now_ms=NOW + 95_000)
    assert first.follow_up == again.follow_up
    assert first.record.key == again.record.key
    assert first.record.headers == again.record.headers
    one, two = (codec.decode("job", p.record.value) for p in (first, again))
    assert two.pop("created_ms") - one.pop("created_ms") == 95_000
    assert one == two


# ------------------------------------------------------------------ the SDK's checks

BOUNDARY = st.sampled_from(["x" * 255, "x" * 256, "é" * 255])
NAMES = st.one_of(st.none(), st.text(min_size=0, max_size=5), BOUNDARY, st.integers(0, 3))
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()  # NaN and infinities included: refused
    | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
REQUESTS = st.builds(
    JobRequest,
    task=st.one_of(st.sampled_from(["send", "a b", "", "x" * 201, "é"]), st.integers()),
    payload=st.one_of(JSONISH, st.binary(max_size=40), st.just({1, 2})),
    run_at=st.one_of(
        st.none(), st.sampled_from(["2030-01-01T00:00:00Z", "9999-12-31T23:59:59.999-00:01", "x"])
    ),
    delay=st.one_of(
        st.none(),
        st.integers(-5, 10**6),
        st.sampled_from(["30s", "-5s", "soon", 2**63, float("nan"), timedelta(seconds=3)]),
    ),
    queue=st.sampled_from(["default", "billing", "nope"]),
    job_id=NAMES,
    idempotency_key=NAMES,
    max_attempts=st.one_of(st.none(), st.integers(-2, 5), st.just(2**31)),
    backoff=st.sampled_from([None, "fixed:1s", "sometimes", {"kind": "fixed", "base_ms": -1}]),
    timeout=st.sampled_from([None, "30s", 0.0001]),
    jitter=st.sampled_from([None, "1m", 2**62]),
    labels=st.sampled_from([None, {"a": "b"}, {"a": 1}]),
)


def _sdk_request(req: JobRequest, index: int) -> JobRequest:
    """The request the SDK would get for the same job: ids filled in as ctx.schedule does."""
    job_id, key = req.job_id, req.idempotency_key
    if job_id is None and key is None:
        job_id = key = follow_up_key(PARENT_KEY, index)
    elif job_id is None:
        job_id = key
    from dataclasses import replace

    return replace(req, job_id=job_id, idempotency_key=key)


def _outcome(f: Any) -> Any:
    try:
        return ("ok", f())
    except DueflowError as exc:
        return ("error", type(exc).__name__, getattr(exc, "field", None), str(exc))


@settings(max_examples=600, deadline=None)
@given(req=REQUESTS, index=st.integers(0, 5))
def test_property_a_follow_up_is_refused_as_the_sdk_refuses_it_or_is_the_sdks_record(
    req: JobRequest, index: int
) -> None:
    sdk = TimerPlanner(SETTINGS, recent=RecentJobs(), ids=JobIds())
    mine = _outcome(lambda: plan(req, index=index))
    theirs = _outcome(lambda: sdk.plan(_sdk_request(req, index), now_ms=NOW))
    if theirs[0] == "error":
        if theirs[2] == "job_id" and req.job_id is None and req.idempotency_key is not None:
            # the job id stands in for the key the caller gave: the error names the key
            theirs = (
                *theirs[:2],
                "idempotency_key",
                theirs[3].replace("job_id", "idempotency_key", 1),
            )
        assert mine == theirs
        return
    assert mine[0] == "ok", mine
    planned, sdk_planned = mine[1], theirs[1]
    assert isinstance(sdk_planned, PlannedTimer)
    record, sdk_record = planned.record, sdk_planned.record
    assert (record.key, record.value, record.partition) == (
        sdk_record.key,
        sdk_record.value,
        sdk_record.partition,
    )
    assert record.headers == [*sdk_record.headers, (hdr.PARENT, PARENT_ID.encode())]
    assert planned.follow_up.due_ms == sdk_planned.job.due_ms


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"task": "send email"}, "task"),
        ({"payload": {"a": [1, float("nan")]}}, "payload['a'][1]"),
        ({"queue": "nope"}, "queue"),
        ({"run_at": "9999-12-31T23:59:59.999-00:01"}, "run_at"),
        ({"delay": (MAX_DUE_MS - NOW) // 1000 + 1}, "delay"),
        ({"delay": "-5s"}, "delay"),
        ({"delay": 5, "run_at": "2030-01-01T00:00:00Z"}, "delay"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"payload": b"x" * 10_000}, "payload"),  # beyond the record limit given below
    ],
)
def test_a_bad_call_raises_invalid_input_in_the_handler_and_keeps_nothing(
    kwargs: dict[str, Any], field: str
) -> None:
    ctx = TaskContext.for_test("parent", {}, job_id=PARENT_ID, now_ms=NOW, queues=["billing"])
    ctx._owner.planner.max_record_bytes = 8_000
    args = {"task": "send", **kwargs}
    with pytest.raises(InvalidInput) as err:
        ctx.schedule(args.pop("task"), args.pop("payload", None), **args)
    assert err.value.field == field
    assert ctx.follow_ups == ()
    ok = ctx.schedule("send")  # the next call is index 0: a refused call takes none
    assert ok.job_id == f"{PARENT_ID}/0"


# ------------------------------------------------------------------ the record


def test_the_record_is_a_job_timer_due_when_asked_with_the_parent_named() -> None:
    planned = plan(JobRequest("send", {"n": 1}, delay="90s", queue="billing"))
    h = dict(planned.record.headers)
    assert h[hdr.DUE] == str(NOW + 90_000).encode()  # never before its due time
    assert (h[hdr.QUEUE], h[hdr.KIND], h[hdr.TASK]) == (b"billing", b"job", b"send")
    assert h[hdr.PARENT] == PARENT_ID.encode()
    job = codec.decode("job", planned.record.value)
    assert (job["job_id"], job["due_ms"], job["queue"]) == (
        f"{PARENT_KEY}/0",
        NOW + 90_000,
        "billing",
    )


@pytest.mark.parametrize(
    ("due_in_ms", "written_after_ms"),
    [(0, 0), (0, 60_000), (-5_000, 0), (3_600_000, 0), (3_600_000, 3_000_000), (5_000, 4_000)],
)
def test_a_follow_up_is_placed_by_the_wheels_rule_for_the_time_it_is_written(
    due_in_ms: int, written_after_ms: int
) -> None:
    planned = plan(JobRequest("send", run_at=_iso(NOW + due_in_ms)))
    written = NOW + written_after_ms
    partition = place_follow_up(planned, now_ms=written, placer=PLACER)
    expected = place_timer(
        due_ms=NOW + due_in_ms,
        now_ms=written,
        geometry=SETTINGS.wheel,
        spread=spread_of(planned.record.key),
    )
    assert partition == expected.partition
    if due_in_ms - written_after_ms <= SETTINGS.wheel.near_window_ms:
        assert partition < SETTINGS.wheel.near_partitions  # due now: a near partition


def _iso(ms: int) -> str:
    from dueflow.timeutil import format_utc

    return format_utc(ms)


# ------------------------------------------------------------------ in a handler's context


def test_a_context_keeps_its_follow_ups_in_call_order() -> None:
    ctx = TaskContext.for_test("parent", {}, job_id="j", idempotency_key="k", now_ms=NOW)
    a = ctx.schedule("step-2", {"x": 1}, delay="1m")
    b = ctx.schedule("step-3", {"x": 2})
    assert [(f.job_id, f.task, f.due_ms, f.call_index) for f in ctx.follow_ups] == [
        ("k/0", "step-2", NOW + 60_000, 0),
        ("k/1", "step-3", NOW, 1),
    ]
    assert ctx.follow_ups == (a, b)
    assert a.due.year == 2027


def test_the_same_job_twice_is_one_follow_up_and_other_content_a_conflict() -> None:
    ctx = TaskContext.for_test("parent", {}, now_ms=NOW)
    first = ctx.schedule("send", {"x": 1}, idempotency_key="welcome:9")
    assert ctx.schedule("send", {"x": 1}, idempotency_key="welcome:9") == first
    with pytest.raises(DueflowError, match="other content") as err:
        ctx.schedule("send", {"x": 2}, idempotency_key="welcome:9")
    assert type(err.value).__name__ == "ConflictError"
    assert ctx.follow_ups == (first,)


def test_a_call_after_the_attempt_ended_raises_instead_of_vanishing() -> None:
    ctx = TaskContext.for_test("parent", {}, now_ms=NOW)
    ctx.schedule("send")
    assert [p.follow_up.job_id for p in ctx.end_attempt()] == ["test-job/0"]
    with pytest.raises(DueflowError, match="after the attempt ended"):
        ctx.schedule("send", {"late": True})


def test_a_context_without_a_planner_cannot_schedule() -> None:
    ctx = TaskContext.for_test("parent", {})
    bare = TaskContext(ctx._fields, 1, 1, {}, ("t", 0, 0))
    with pytest.raises(DueflowError, match="cannot schedule follow-ups"):
        bare.schedule("send")


def test_the_follow_up_continues_the_parents_trace() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = TaskContext.for_test("parent", {}, traceparent=parent, now_ms=NOW)
    ctx.schedule("send")
    (planned,) = ctx.end_attempt()
    assert dict(planned.record.headers)[hdr.TRACEPARENT] == parent.encode()
    assert codec.decode("job", planned.record.value)["trace"] == {"traceparent": parent}


def test_a_traced_attempts_follow_up_is_a_child_of_the_attempts_span() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from dueflow.consumers.follow_ups import Attempt, FollowUpPlanner
    from dueflow.consumers.spans import start_attempt
    from dueflow.observability.tracing import JobTracer

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    tracer = JobTracer(TracerProvider())
    step, otel = start_attempt(
        tracer,
        headers=[("traceparent", parent.encode())],
        attempt=1,
        job_id="j",
        queue="q",
        task="t",
    )
    base = TaskContext.for_test("parent", {}, traceparent=parent)
    chain = FollowUpPlanner(
        SETTINGS, declared={}, clock=lambda: NOW, running=lambda _o: True, tracing=True
    )
    ctx = TaskContext(
        base._fields, 1, 1, {"traceparent": parent.encode()}, ("t", 0, 0), otel, Attempt(chain)
    )
    ctx.schedule("send")
    step.end()
    (planned,) = ctx.end_attempt()
    traceparent = dict(planned.record.headers)[hdr.TRACEPARENT].decode()
    _, trace_id, span_id, _ = traceparent.split("-")
    assert trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"  # the same trace
    assert step.span is not None
    assert span_id == format(step.span.get_span_context().span_id, "016x")  # under the attempt


def test_a_context_in_a_child_process_schedules_with_its_own_planner() -> None:
    """isolation="process": the context is pickled; the child's planner checks the same
    rules and its buffer travels back with the answer."""
    import pickle

    ctx = TaskContext.for_test("parent", {}, idempotency_key="k", now_ms=NOW, queues=["billing"])
    child = pickle.loads(pickle.dumps(ctx))
    with pytest.raises(InvalidInput):
        child.schedule("send", queue="nope")
    fu = child.schedule("send", queue="billing", delay=10)
    assert fu.job_id == "k/0"
    assert abs(fu.due_ms - (time.time() * 1000 + 10_000)) < 60_000  # the wall clock
    sent = pickle.loads(pickle.dumps(child.end_attempt()))
    ctx.adopt_follow_ups(sent)
    assert ctx.follow_ups == (fu,)
