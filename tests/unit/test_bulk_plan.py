"""schedule_many's bulk planner equals the planner it speeds up.

``BulkPlanner.plan`` computes per call what repeats between jobs and skips the
recent-jobs claim for ids it draws; on any request, valid or not, it must
give the same record (bytes, headers, partition), the same error, or the same
earlier result as ``TimerPlanner.plan``, and leave the recent-jobs
memory the same once its drawn ids are remembered.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import ConflictError, DueflowError, InvalidInput
from dueflow.ids import uuid7_hex, uuid7_time_ms
from dueflow.producers.bulk import BulkRun
from dueflow.producers.bulk_plan import BulkPlanner
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.results import Scheduled
from dueflow.records.codec import decode
from dueflow.records.job_request import JobRequest
from dueflow.records.size_budget import RecordTooLarge
from tests.unit.test_planner import KNOWN, NOW, PLAIN, SETTINGS


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
            (job.job_id, job.due_ms, job.queue, job.task, job.idempotency_key, job.content_hash),
            (rec.partition, rec.key, rec.value, rec.headers),
        )
    job_id, due_ms, queue, task, key, partition, key_bytes, value, headers, chash = got
    return (
        "planned",
        (job_id, due_ms, queue, task, key, chash),
        (partition, key_bytes, value, headers),
    )


REQUESTS = st.one_of(
    PLAIN,
    st.builds(
        JobRequest,
        task=st.sampled_from(["t", "send_email", "routed-t", "nowhere.x"]),
        payload=st.one_of(st.dictionaries(st.text(max_size=3), st.integers()), st.binary()),
        delay=st.one_of(st.none(), st.integers(0, 10**5)),
        queue=st.sampled_from([None, "default", "billing"]),
        job_id=st.one_of(st.none(), st.sampled_from(["a", "b"])),
        jitter=st.one_of(st.none(), st.just("1s")),
        labels=st.one_of(st.none(), st.just({"k": "v"})),
    ),
)


@settings(max_examples=600, deadline=None)
@given(
    reqs=st.lists(REQUESTS, min_size=1, max_size=6),
    now=st.integers(0, 4 * 10**12),
    known=st.booleans(),
)
def test_property_bulk_planner_equals_the_general_path(
    reqs: list[JobRequest], now: int, known: bool
) -> None:
    # one id per draw: ids drawn in bulk and one by one come in the same order
    rules = KNOWN if known else None
    fast = planner(counting_bytes(), batch=1, rules=rules)
    general = planner(counting_bytes(), batch=1, rules=rules)
    bulk = BulkPlanner(fast)
    for i, req in enumerate(reqs):
        at = now + i
        got = outcome(lambda r=req, t=at: bulk.plan(r, t))
        assert got == outcome(lambda r=req, t=at: general.plan(r, now_ms=t))
    bulk.remember()
    assert len(fast.recent) == len(general.recent)  # puts the remembered ones in place
    assert sorted(fast.recent._young.items()) == sorted(general.recent._young.items())
    assert sorted(fast.recent._old.items()) == sorted(general.recent._old.items())


def test_a_task_the_app_does_not_declare_is_refused() -> None:
    bulk = BulkPlanner(planner(rules=KNOWN))
    with pytest.raises(InvalidInput) as info:
        bulk.plan(JobRequest("sned_email", {}), NOW)
    assert info.value.field == "task"
    assert "did you mean 'send_email'" in str(info.value)
    assert (bulk.pending_ids, bulk.pending) == ([], [])
    # declared, or named by the route table
    assert not isinstance(bulk.plan(JobRequest("send_email", {}), NOW), Scheduled)
    assert bulk.plan(JobRequest("routed-t", {}), NOW)[2] == "billing"


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
    job = decode("job", plan[7])  # fastavro with schemas/dueflow/schemas/job.avsc
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
    bulk = BulkPlanner(planner(max_record_bytes=6_000))
    with pytest.raises(RecordTooLarge) as info:
        bulk.plan(JobRequest("t", b"x" * 6_000), NOW)
    assert info.value.field == "payload"
    assert "over max.message.bytes 6000 of dueflow.timers" in str(info.value)
    fits = info.value.max_payload
    assert 0 < fits < 6_000
    assert str(info.value).endswith(f"; accepted: at most {fits} bytes of payload")
    assert (bulk.pending_ids, bulk.pending) == ([], [])
    # the most that fits is accepted, one byte more is not (as the planner says)
    assert not isinstance(bulk.plan(JobRequest("t", b"x" * fits), NOW), Scheduled)
    with pytest.raises(RecordTooLarge):
        bulk.plan(JobRequest("t", b"x" * (fits + 1)), NOW)


@pytest.mark.parametrize("payload", ["bytes", "json"])
def test_at_the_size_budget_bulk_and_general_refuse_and_accept_alike(payload: str) -> None:
    # every size around the most the budget lets through: the same plan or the
    # same RecordTooLarge (field, figures, accepted), with and without a job id
    with pytest.raises(RecordTooLarge) as info:
        BulkPlanner(planner(max_record_bytes=6_000)).plan(JobRequest("t", b"x" * 6_000), NOW)
    fits = info.value.max_payload
    fast = planner(counting_bytes(), batch=1, max_record_bytes=6_000)
    general = planner(counting_bytes(), batch=1, max_record_bytes=6_000)
    bulk = BulkPlanner(fast)
    refused = 0
    sizes = range(fits - 30, fits + 20)  # a JSON content type is 8 bytes shorter
    for i, size in enumerate(sizes):
        body: Any = b"x" * size if payload == "bytes" else {"p": "x" * (size - 8)}
        for job_id in (None, f"id-{i:028d}"):
            req = JobRequest("t", body, job_id=job_id, delay=60)
            got = outcome(lambda r=req, t=NOW + i: bulk.plan(r, t))
            assert got == outcome(lambda r=req, t=NOW + i: general.plan(r, now_ms=t))
            refused += got[0] == "error"
    assert 0 < refused < 2 * len(sizes)  # both sides of the limit were tried


class FakeProducer:
    """Refuses as told: BufferError ``full`` times in a row at every ``full_every``-th
    record, KafkaException for partition ``refuse``; keeps what it accepted."""

    def __init__(self, *, full_every: int = 0, full: int = 0, refuse: int = -1) -> None:
        self.full_every, self.full, self.refuse = full_every, full, refuse
        self.calls = 0
        self.polls = 0
        self.pending_full = 0
        self.records: list[tuple[str, bytes, bytes, int, list[tuple[str, bytes]]]] = []

    def produce(self, topic: str, value: bytes, key: bytes, partition: int, *rest: Any) -> None:
        self.calls += 1
        if self.full_every and self.calls % self.full_every == 0 and not self.pending_full:
            self.pending_full = self.full
        if self.pending_full:
            self.pending_full -= 1
            raise BufferError("queue full")
        if partition == self.refuse:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.records.append((topic, value, key, partition, rest[-1]))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def test_bulk_run_waits_out_a_full_queue_and_reports_refused_records() -> None:
    p = planner(counting_bytes())
    producer = FakeProducer(full_every=7, full=3)
    reqs = [JobRequest("t", {"i": i}, delay=i) for i in range(50)]
    result = BulkRun(p, producer, clock=lambda: NOW).run(reqs, flush_timeout_s=1)  # type: ignore[arg-type]
    assert (result.total, result.scheduled, result.errors) == (50, 50, [])
    assert [decode("job", r[1])["payload"] for r in producer.records] == [
        b'{"i":%d}' % i for i in range(50)
    ]
    assert producer.calls > 60  # queue full several times,
    assert producer.polls == producer.calls - 50  # and a wait for room after each
    assert all(p.recent.get(job_id) is not None for job_id in result.job_ids if job_id)

    # a record the producer refuses at once is an error of its job; the rest go on
    p = planner(counting_bytes())
    due_now = p.placer.near_window_ms // 1000 + 5  # after the near window
    refused = FakeProducer()
    reqs = [JobRequest("t", {"i": i}, delay=due_now) for i in range(3)]
    first = BulkPlanner(planner(counting_bytes())).plan(reqs[0], NOW)
    assert not isinstance(first, Scheduled)
    refused.refuse = first[5]  # every job here goes to that partition
    result = BulkRun(p, refused, clock=lambda: NOW).run(reqs, flush_timeout_s=1)  # type: ignore[arg-type]
    assert result.scheduled == 0
    assert [e.index for e in result.errors] == [0, 1, 2]
    assert result.job_ids == [None, None, None]
    assert len(p.recent) == 0  # forgotten: a retry writes them again
