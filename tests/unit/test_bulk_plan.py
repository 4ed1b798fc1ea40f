"""schedule_many's bulk planner equals the planner it speeds up.

``BulkPlanner.plan`` computes per call what repeats between jobs and skips the
recent-jobs claim for ids it draws; on any request, valid or not, it must
give the same record (bytes, headers, partition), the same error, or the same
earlier result as ``TimerPlanner._plan_general``, and leave the recent-jobs
memory the same once its drawn ids are remembered.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import ConflictError, DueflowError, InvalidInput
from dueflow.ids import uuid7_hex, uuid7_time_ms
from dueflow.job_request import JobRequest
from dueflow.producers.bulk_plan import BulkPlanner
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.results import Scheduled
from dueflow.schemas.codec import decode
from tests.unit.test_planner import NOW, PLAIN, SETTINGS


def planner(
    random_bytes: Any = lambda n: b"\x5a" * n, batch: int = 4096, **kw: Any
) -> TimerPlanner:
    ids = JobIds(random_bytes=random_bytes, batch=batch)
    return TimerPlanner(SETTINGS, recent=RecentJobs(), ids=ids, **kw)


def counting_bytes() -> Any:
    """A random source whose draws differ (so the order of drawn ids shows)."""
    state = {"n": 0}

    def draw(n: int) -> bytes:
        state["n"] += 1
        return bytes((state["n"] * 7 + i) % 256 for i in range(n))

    return draw


def outcome(f: Any) -> Any:
    try:
        got = f()
    except DueflowError as exc:
        return ("error", type(exc).__name__, getattr(exc, "field", None), str(exc))
    if isinstance(got, Scheduled):
        return ("earlier", got)
    if isinstance(got, PlannedTimer):
        job, rec = got
        return (
            "planned",
            (job.job_id, job.due_ms, job.queue, job.task, job.idempotency_key),
            (rec.partition, rec.key, rec.value, rec.headers),
        )
    job_id, due_ms, queue, task, key, partition, key_bytes, value, headers = got
    return ("planned", (job_id, due_ms, queue, task, key), (partition, key_bytes, value, headers))


REQUESTS = st.one_of(
    PLAIN,
    st.builds(
        JobRequest,
        task=st.sampled_from(["t", "send_email"]),
        payload=st.one_of(st.dictionaries(st.text(max_size=3), st.integers()), st.binary()),
        delay=st.one_of(st.none(), st.integers(0, 10**5)),
        queue=st.sampled_from(["default", "billing"]),
        job_id=st.one_of(st.none(), st.sampled_from(["a", "b"])),
        jitter=st.one_of(st.none(), st.just("1s")),
        labels=st.one_of(st.none(), st.just({"k": "v"})),
    ),
)


@settings(max_examples=600, deadline=None)
@given(reqs=st.lists(REQUESTS, min_size=1, max_size=6), now=st.integers(0, 4 * 10**12))
def test_property_bulk_planner_equals_the_general_path(reqs: list[JobRequest], now: int) -> None:
    # one id per draw: ids drawn in bulk and one by one come in the same order
    fast, general = planner(counting_bytes(), batch=1), planner(counting_bytes(), batch=1)
    bulk = BulkPlanner(fast)
    for i, req in enumerate(reqs):
        at = now + i
        got = outcome(lambda r=req, t=at: bulk.plan(r, t))
        assert got == outcome(lambda r=req, t=at: general._plan_general(r, t, ()))
    bulk.remember()
    assert sorted(fast.recent._young.items()) == sorted(general.recent._young.items())
    assert sorted(fast.recent._old.items()) == sorted(general.recent._old.items())


def test_drawn_ids_are_uuid7_in_order_and_new() -> None:
    bulk = BulkPlanner(planner(counting_bytes()))
    plans = [bulk.plan(JobRequest("t", {"i": i}), NOW + i // 100) for i in range(10_000)]
    ids = [p[0] for p in plans]
    assert len(set(ids)) == len(ids)
    assert [uuid7_time_ms(j) for j in ids] == [NOW + i // 100 for i in range(10_000)]
    # the same digits as JobIds.new would have used, in the same order
    reference = JobIds(random_bytes=counting_bytes())
    assert ids[:5000] == [reference.new(NOW + i // 100) for i in range(5000)]
    assert uuid7_hex(now_ms=NOW, random_hex="0" * 18)[:13] == ids[0][:13]


def test_value_reads_back_with_fastavro() -> None:
    bulk = BulkPlanner(planner())
    plan = bulk.plan(JobRequest("send_email", {"to": "a@b"}, delay=30, max_attempts=2), NOW)
    assert not isinstance(plan, Scheduled)
    job = decode("job", plan[7])  # fastavro with schemas/job.avsc
    assert job["job_id"] == plan[0]
    assert (job["task"], job["payload"], job["due_ms"]) == (
        "send_email",
        b'{"to":"a@b"}',
        NOW + 30_000,
    )
    assert (job["max_attempts"], job["created_ms"], job["idempotency_key"]) == (2, NOW, plan[0])


def test_drawn_ids_are_remembered_for_repeats_and_cancel() -> None:
    p = planner()
    bulk = BulkPlanner(p)
    plan = bulk.plan(JobRequest("t", {"a": 1}, delay=5), NOW)
    assert not isinstance(plan, Scheduled)
    job_id = plan[0]
    assert p.recent.get(job_id) is None  # pending until remembered
    # a caller's id is claimed at once, after what is pending
    again = bulk.plan(JobRequest("t", {"a": 1}, job_id=job_id), NOW + 1)
    assert isinstance(again, Scheduled)
    assert again.duplicate
    assert again.due_ms == NOW + 5_000
    with pytest.raises(ConflictError):
        bulk.plan(JobRequest("t", {"a": 2}, job_id=job_id), NOW + 2)


def test_a_failed_write_is_forgotten() -> None:
    p = planner()
    bulk = BulkPlanner(p)
    plan = bulk.plan(JobRequest("t", b"x"), NOW)
    assert not isinstance(plan, Scheduled)
    bulk.failed(plan[0], plan[2])
    bulk.remember()
    assert p.recent.get(plan[0]) is None


def test_payload_over_the_topic_limit_is_refused() -> None:
    bulk = BulkPlanner(planner(max_record_bytes=600))
    with pytest.raises(InvalidInput) as info:
        bulk.plan(JobRequest("t", b"x" * 600), NOW)
    assert info.value.field == "payload"
    assert "a timer record of at most 600 bytes" in str(info.value)
    assert bulk.pending == []
