"""The planner has one path: ``prepare_job`` + ``timer_record``, as every client.

``TimerPlanner.plan`` (the SDK's ``schedule``) plans every request, the common
one (task, payload, delay, queue, ids, attempts) included, with the functions
the CLI and ``ctx.schedule`` use: on any such request, valid or not, it gives
the job and record (bytes, headers, partition, size) they give, or their error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.config import load_settings
from dueflow.errors import DueflowError
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.results import Scheduled
from dueflow.records.job_request import JobRequest, JobRules, prepare_job
from dueflow.records.timer_record import TimerPlacer, timer_record

# Routes: a job without a queue goes by its task (to a queue that exists, or not).
SETTINGS = load_settings(
    env={},
    overrides={
        "queues": "default,billing",
        "routes": {"routed-t": "billing", "nowhere.*": "nope"},
    },
)
NOW = 1_800_000_000_000

BOUNDARY = st.sampled_from(["x" * 255, "x" * 256, "é" * 255])  # 255 chars is the limit
NAMES = st.one_of(st.none(), st.text(min_size=0, max_size=5), BOUNDARY, st.integers(0, 3))
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
PLAIN = st.builds(
    JobRequest,
    task=st.one_of(
        st.text(max_size=8),
        st.just(""),
        BOUNDARY,
        st.integers(),
        # routed when the request has no queue; the app's tasks (KNOWN)
        st.sampled_from(["routed-t", "nowhere.x", "t", "send_email"]),
    ),
    payload=st.one_of(JSONISH, st.binary(max_size=40), st.just({1, 2}), st.just(object())),
    delay=st.one_of(
        st.none(),
        st.integers(-5, 10**6),
        st.floats(-1, 10**5),
        st.just(float("nan")),
        st.sampled_from(["30s", "1h30m", "-5s", "soon", "", "250ms"]),
        st.just(timedelta(seconds=3)),
        st.just(True),
    ),
    queue=st.sampled_from([None, "default", "billing", "nope", ""]),
    job_id=NAMES,
    idempotency_key=NAMES,
    max_attempts=st.one_of(
        st.none(),
        st.integers(-2, 5),
        st.sampled_from([2**31 - 1, 2**31, True, 2.0]),
    ),
)


# A producer that knows its app's tasks (``app=``): others are refused unless routed.
KNOWN = JobRules.from_settings(
    SETTINGS, declared={"t": "default", "send_email": "billing"}, known_tasks=["t", "send_email"]
)


def planner(rules: JobRules | None = None) -> TimerPlanner:
    # the same random digits for both planners: generated ids are equal
    return TimerPlanner(
        SETTINGS,
        recent=RecentJobs(),
        ids=JobIds(random_bytes=lambda n: b"\x5a" * n),
        rules=rules,
    )


def outcome(f: Any) -> Any:
    try:
        got = f()
    except DueflowError as exc:
        return ("error", type(exc).__name__, getattr(exc, "field", None), str(exc))
    if isinstance(got, Scheduled):
        return ("earlier", got)
    assert isinstance(got, PlannedTimer)
    return ("planned", got.job, got.record)


def reference(req: JobRequest, now: int, rules: JobRules | None) -> Any:
    """What ``prepare_job`` + ``timer_record`` make of ``req`` (ids drawn as the planner's)."""
    ids = JobIds(random_bytes=lambda n: b"\x5a" * n)
    try:
        job = prepare_job(
            req, now_ms=now, rules=rules or JobRules.from_settings(SETTINGS), new_job_id=ids.new
        )
    except DueflowError as exc:
        return ("error", type(exc).__name__, getattr(exc, "field", None), str(exc))
    placer = TimerPlacer(SETTINGS.wheel)
    return ("planned", job, timer_record(job, now_ms=now, placer=placer))


@settings(max_examples=1500, deadline=None)
@given(req=PLAIN, again=PLAIN, now=st.integers(0, 4 * 10**12), known=st.booleans())
def test_property_the_planner_plans_as_every_client_does(
    req: JobRequest, again: JobRequest, now: int, known: bool
) -> None:
    rules = KNOWN if known else None
    assert outcome(lambda: planner(rules).plan(req, now_ms=now)) == reference(req, now, rules)
    # a second request of one planner: the same, or the first one's result (same id)
    p = planner(rules)
    first = outcome(lambda: p.plan(req, now_ms=now))
    second = outcome(lambda: p.plan(again, now_ms=now + 1))
    if first[0] == "planned" and again.job_id is not None and again.job_id == req.job_id:
        assert second[0] in ("earlier", "error"), second
    elif again.job_id is not None:
        assert second == reference(again, now + 1, rules)


def test_every_request_takes_the_one_path(monkeypatch: pytest.MonkeyPatch) -> None:
    p = TimerPlanner(SETTINGS, recent=RecentJobs(), ids=JobIds())
    taken: list[str] = []

    def counted(req: JobRequest, **kw: Any) -> Any:
        taken.append(str(req.task))
        return prepare_job(req, **kw)

    monkeypatch.setattr("dueflow.producers.core.prepare_job", counted)
    p.plan(JobRequest("a", delay=5, job_id="j", max_attempts=2), now_ms=NOW)
    p.plan(JobRequest("b", jitter="1s"), now_ms=NOW)
    p.plan(JobRequest("c", run_at="2030-01-01T00:00:00Z"), now_ms=NOW)
    p.plan(JobRequest("d", backoff="fixed", timeout="1s", labels={"a": "b"}), now_ms=NOW)
    p.plan(JobRequest("e", max_lateness="1m"), now_ms=NOW)
    p.plan(JobRequest("f"), now_ms=NOW, trace_headers=[("traceparent", b"00-x")])
    assert taken == ["a", "b", "c", "d", "e", "f"]
