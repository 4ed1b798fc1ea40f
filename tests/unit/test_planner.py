"""The planner's fast path for plain requests equals its general path.

``TimerPlanner.plan`` handles the common request (task, payload, delay,
queue, ids, attempts) in one frame for speed; everything else goes through
``prepare_job`` + ``timer_record``. On any plain request, valid or not, both
must give the same record (bytes, headers, partition, size) or the same error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.config import load_settings
from dueflow.errors import ConflictError, DueflowError
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.results import Scheduled
from dueflow.records.job_request import JobRequest

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
        st.sampled_from(["routed-t", "nowhere.x"]),  # routed when the request has no queue
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


def planner() -> TimerPlanner:
    # the same random digits for both planners: generated ids are equal
    return TimerPlanner(
        SETTINGS, recent=RecentJobs(), ids=JobIds(random_bytes=lambda n: b"\x5a" * n)
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


@settings(max_examples=1500, deadline=None)
@given(req=PLAIN, again=PLAIN, now=st.integers(0, 4 * 10**12))
def test_property_fast_path_equals_general_path(
    req: JobRequest, again: JobRequest, now: int
) -> None:
    fast, general = planner(), planner()
    assert outcome(lambda: fast._plan_plain(req, now)) == outcome(
        lambda: general._plan_general(req, now, ())
    )
    # a second request sees the first in the recent-jobs memory the same way
    assert outcome(lambda: fast._plan_plain(again, now + 1)) == outcome(
        lambda: general._plan_general(again, now + 1, ())
    )


def test_plain_requests_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    p = planner()
    taken: list[str] = []
    monkeypatch.setattr(p, "_plan_general", lambda *a: taken.append("general"))
    monkeypatch.setattr(p, "_plan_plain", lambda *a: taken.append("plain"))
    p.plan(JobRequest("t", delay=5, job_id="j", max_attempts=2), now_ms=NOW)
    p.plan(JobRequest("t", jitter="1s"), now_ms=NOW)
    p.plan(JobRequest("t", run_at="2030-01-01T00:00:00Z"), now_ms=NOW)
    p.plan(JobRequest("t", backoff="fixed"), now_ms=NOW)
    p.plan(JobRequest("t", timeout="1s"), now_ms=NOW)
    p.plan(JobRequest("t", labels={"a": "b"}), now_ms=NOW)
    p.plan(JobRequest("t"), now_ms=NOW, trace_headers=[("traceparent", b"00-x")])
    assert taken == ["plain"] + ["general"] * 6


def test_conflict_and_duplicate_on_both_paths() -> None:
    p = planner()
    first = p.plan(JobRequest("t", {"a": 1}, job_id="j"), now_ms=NOW)
    assert isinstance(first, PlannedTimer)
    dup = p.plan(JobRequest("t", {"a": 1}, job_id="j", jitter="1s"), now_ms=NOW)
    assert isinstance(dup, Scheduled)
    assert dup.duplicate
    with pytest.raises(ConflictError):
        p.plan(JobRequest("t", {"a": 2}, job_id="j"), now_ms=NOW)
