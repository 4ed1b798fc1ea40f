"""What a successful attempt's result and an attempt's progress add to its batch
(no broker).

The result goes into the ``succeeded`` outcome (version 3) of the batch that
holds the idempotency ``done`` record; a handler that returns None writes the
version 1 outcome, byte for byte what it wrote before. A value that is not JSON
or over the cap gives ``result_error`` (the job still succeeded). Progress is
written at cuts, rate-limited; what an attempt reported and was not written yet
goes with its final outcome. A follow-up scheduled with ``pass_result`` carries
the result in ``df-parent-result``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.progress import ProgressBudget, ProgressReporter
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.store import DONE, MemoryKeyStore
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.records.job_result import JobResult, check_progress
from dueflow.records.worker_codec import OUTCOME_V1, OUTCOME_V3, encode_outcome_v3, encode_success
from tests.support.attempts import NOW, SETTINGS, batch_recorder, job_delivery

N = names(SETTINGS)


@task("compute", queue="jobs")
def compute(payload: Any, ctx: TaskContext) -> Any:
    return payload


@task("small", queue="jobs", result_max_bytes=10)
def small(payload: Any, ctx: TaskContext) -> Any:
    return payload


@task("chained", queue="jobs")
def chained(payload: Any, ctx: TaskContext) -> Any:
    ctx.schedule("compute", {"n": 1}, pass_result=True)
    ctx.schedule("compute", {"n": 2})
    return payload


REGISTRY = TaskRegistry([compute, small, chained])
RUNNING: set[Any] = set()


class Clock:
    def __init__(self) -> None:
        self.ms = 0.0

    def __call__(self) -> float:
        return self.ms


def delivery(
    task_name: str = "compute",
    payload: Any = None,
    *,
    planner: FollowUpPlanner | None = None,
    reporter: ProgressReporter | None = None,
    key: str = "k1",
) -> Delivery:
    job = make_job(task_name, payload, queue="jobs", key=key, due_ms=NOW - 5)
    feed = PartitionFeed(N.exec("jobs"), 2, None, MemoryKeyStore(10**9), planner)
    feed.reporter = reporter
    d = job_delivery(feed, job, exec_headers(job, fired_ms=NOW - 4), 9)
    prepare(d, REGISTRY, now_ms=NOW, limits=WireLimits())
    d.max_attempts = 3
    return d


def outcome_of(rec: BatchRecorder) -> tuple[dict[str, Any], bytes]:
    (found,) = [r for r in rec.records if r[1] == N.outcomes]
    schema = hdr.header(found[5], hdr.SCHEMA)
    assert schema is not None
    version = codec.parse_schema_header(schema, expected="outcome")
    return codec.decode("outcome", found[4], writer_version=version), schema


def test_a_handler_that_returns_none_writes_the_outcome_it_wrote_before() -> None:
    rec, d = batch_recorder(), delivery()
    rec.succeeded(d, 0.002, NOW, None)
    assert d.fields is not None
    expected = encode_success(
        d.fields[0], "k1", "jobs", "compute", 1, NOW, NOW - 5, 2.0, "w", None, None
    )
    written = [(r[1], r[4], r[5]) for r in rec.records]
    assert written == [
        (N.idempotency("jobs"), expected[0], [(hdr.SCHEMA, b"dueflow.IdempotencyRecord/2")]),
        (N.outcomes, expected[1], [(hdr.SCHEMA, OUTCOME_V1), (hdr.FIRED, str(NOW - 4).encode())]),
    ]


def test_a_result_is_written_in_the_succeeded_outcome_beside_done() -> None:
    rec, d = batch_recorder(), delivery(payload={"sum": 6})
    rec.succeeded(d, 0.002, NOW, {"sum": 6, "items": [1, 2]})
    topics = [r[1] for r in rec.records]
    assert topics == [N.idempotency("jobs"), N.outcomes]
    outcome, schema = outcome_of(rec)
    assert schema == OUTCOME_V3
    assert outcome["state"] == "succeeded"
    assert orjson.loads(outcome["result"]) == {"sum": 6, "items": [1, 2]}
    assert outcome["result_error"] is None
    assert (outcome["job_id"], outcome["attempt"], outcome["due_ms"]) == (
        d.fields[0] if d.fields else None,
        1,
        NOW - 5,
    )
    # the key's done record: what a None-returning attempt writes
    assert d.fields is not None
    done, _outcome = encode_success(
        d.fields[0], "k1", "jobs", "compute", 1, NOW, NOW - 5, 2.0, "w", None, None
    )
    assert rec.records[0][4] == done
    assert rec.pending_final == {b"k1": DONE}


@pytest.mark.parametrize(
    ("task_name", "returned", "error"),
    [
        ("compute", {1, 2}, "result is not JSON: set value"),
        ("compute", "x" * 70_000, "result of 70,002 bytes exceeds worker.result_max_bytes"),
        ("small", "x" * 9, "result of 11 bytes exceeds worker.result_max_bytes = 10"),
    ],
)
def test_a_result_not_kept_is_an_error_in_a_succeeded_outcome(
    task_name: str, returned: Any, error: str
) -> None:
    rec, d = batch_recorder(), delivery(task_name)
    rec.succeeded(d, 0.002, NOW, returned)
    outcome, _schema = outcome_of(rec)
    assert outcome["state"] == "succeeded"
    assert outcome["result"] is None
    assert error in outcome["result_error"]
    assert next(r[1] for r in rec.records) == N.idempotency("jobs")  # done: not retried


def test_a_child_process_result_gets_the_worker_cap() -> None:
    rec, d = batch_recorder(), delivery("small")
    rec.succeeded(d, 0.002, NOW, JobResult(b'"' + b"x" * 20 + b'"'))
    outcome, _schema = outcome_of(rec)
    assert "result of 22 bytes exceeds" in outcome["result_error"]


def run_with_follow_ups(d: Delivery) -> Any:
    assert d.task is not None
    assert d.fields is not None
    ctx = TaskContext(d.fields, 1, 3, d.hmap, ("exec", 2, 9), None, d)
    RUNNING.add(d)
    try:
        return d.task.fn(d.payload, ctx)
    finally:
        RUNNING.discard(d)


def planner() -> FollowUpPlanner:
    return FollowUpPlanner(
        SETTINGS,
        declared={"compute": "jobs", "chained": "jobs"},
        clock=lambda: NOW,
        running=RUNNING.__contains__,
    )


@pytest.mark.parametrize(
    ("returned", "header"),
    [
        ({"total": 9}, (hdr.PARENT_RESULT, b'{"total":9}')),
        ({3, 4}, (hdr.PARENT_RESULT_ERROR, b"result is not JSON: set value")),
        (None, None),
    ],
)
def test_a_follow_up_with_pass_result_carries_the_result(
    returned: Any, header: tuple[str, bytes] | None
) -> None:
    chain = planner()
    rec = batch_recorder(follow_ups=chain)
    d = delivery("chained", {"x": 1}, planner=chain)
    run_with_follow_ups(d)
    rec.succeeded(d, 0.002, NOW, returned)
    timers = [r for r in rec.records if r[1] == N.timers]
    assert len(timers) == 2
    passing, other = ({k: v for k, v in t[5]} for t in timers)
    assert hdr.PARENT_RESULT not in other
    assert hdr.PARENT_RESULT_ERROR not in other
    if header is None:
        assert hdr.PARENT_RESULT not in passing
        assert hdr.PARENT_RESULT_ERROR not in passing
    else:
        name, value = header
        assert passing[name].startswith(value)


def test_a_parent_result_that_does_not_fit_the_follow_ups_budget_is_an_error_header() -> None:
    chain = planner()
    chain.max_record_bytes = 8_000  # a small timer topic limit: the follow-up alone fits
    rec = batch_recorder(follow_ups=chain)
    d = delivery("chained", {"x": 1}, planner=chain)
    run_with_follow_ups(d)
    rec.succeeded(d, 0.002, NOW, "y" * 10_000)
    (passing,) = [dict(r[5]) for r in rec.records if r[1] == N.timers and r[3] == b"k1/0"]
    assert hdr.PARENT_RESULT not in passing
    error = passing[hdr.PARENT_RESULT_ERROR]
    assert error.startswith(b"result of 10,002 bytes does not fit the follow-up: the ")
    assert b"over max.message.bytes 8000 of dueflow.timers" in error


def test_a_parent_result_that_fits_the_follow_ups_budget_is_passed() -> None:
    chain = planner()
    chain.max_record_bytes = 8_000
    rec = batch_recorder(follow_ups=chain)
    d = delivery("chained", {"x": 1}, planner=chain)
    run_with_follow_ups(d)
    rec.succeeded(d, 0.002, NOW, "y" * 1_000)
    (passing,) = [dict(r[5]) for r in rec.records if r[1] == N.timers and r[3] == b"k1/0"]
    assert passing[hdr.PARENT_RESULT] == b'"' + b"y" * 1_000 + b'"'


# ------------------------------------------------------------------ progress


def reporter(
    clock: Clock, *, per_s: int = 500, interval: int = 1_000, after: int = 1_000
) -> ProgressReporter:
    return ProgressReporter(
        queue="jobs",
        outcomes_topic=N.outcomes,
        worker_id="w",
        interval_ms=interval,
        running_after_ms=after,
        budget=ProgressBudget(per_s, now_ms=clock()),
        clock=clock,
    )


def decoded(records: list[Any]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        schema = hdr.header(r[5], hdr.SCHEMA)
        version = codec.parse_schema_header(schema, expected="outcome")
        out.append(codec.decode("outcome", r[4], writer_version=version))
    return out


def test_progress_is_written_at_most_once_per_attempt_per_interval_newest_value() -> None:
    clock = Clock()
    rep = reporter(clock)
    d = delivery(reporter=rep)
    for i in range(10_000):
        d.progressed(check_progress(i / 10_000, None))
    first = decoded(rep.records([d], at_ms=NOW))
    assert [(o["state"], o["progress"]) for o in first] == [("started", 0.9999)]
    d.progressed(check_progress(0.25, {"rows": 25}))
    clock.ms = 999
    assert rep.records([d], at_ms=NOW) == []  # within the interval: waits
    clock.ms = 1_000
    (later,) = decoded(rep.records([d], at_ms=NOW + 1_000))
    assert (later["progress"], orjson.loads(later["progress_detail"])) == (0.25, {"rows": 25})
    assert rep.records([d], at_ms=NOW + 2_000) == []  # nothing new: nothing written
    assert rep.take_counts() == (10_001, {"progress": 2, "running": 0})


def test_the_process_budget_caps_progress_outcomes_and_the_rest_wait_newest_wins() -> None:
    clock = Clock()
    rep = reporter(clock, per_s=3, interval=1)
    attempts = [delivery(reporter=rep, key=f"k{i}") for i in range(5)]
    for n, d in enumerate(attempts):
        d.progressed(check_progress(n / 10, None))
    assert len(rep.records(attempts, at_ms=NOW)) == 3
    for d in attempts:
        d.progressed(check_progress(1.0, None))  # newer values
    clock.ms = 1_000  # three more tokens
    waited = decoded(rep.records(attempts, at_ms=NOW))
    assert len(waited) == 3
    assert waited[0]["progress"] == 1.0  # the waiting ones first, with their newest value
    assert {o["idempotency_key"] for o in waited[:2]} == {"k3", "k4"}


def test_an_attempt_that_runs_long_gets_one_started_outcome_without_progress() -> None:
    clock = Clock()
    rep = reporter(clock, after=1_000)
    slow, fast = delivery(key="slow", reporter=rep), delivery(key="fast", reporter=rep)
    assert rep.records([slow, fast], at_ms=NOW) == []  # first seen now
    clock.ms = 999
    assert rep.records([slow], at_ms=NOW) == []  # fast ended meanwhile: nothing of it
    clock.ms = 1_000
    (started,) = decoded(rep.records([slow], at_ms=NOW + 1_000))
    assert (started["state"], started["progress"], started["idempotency_key"]) == (
        "started",
        None,
        "slow",
    )
    clock.ms = 5_000
    assert rep.records([slow], at_ms=NOW + 5_000) == []  # once per attempt
    assert rep.take_counts()[1] == {"progress": 0, "running": 1}


def test_report_running_after_0_writes_no_started_outcome() -> None:
    clock = Clock()
    rep = reporter(clock, after=0)
    d = delivery(reporter=rep)
    rep.records([d], at_ms=NOW)
    clock.ms = 60_000
    assert rep.records([d], at_ms=NOW) == []


@pytest.mark.parametrize("end", ["succeeded", "retrying", "dead"])
def test_progress_not_written_when_the_attempt_ends_goes_with_its_final_outcome(
    end: str,
) -> None:
    clock = Clock()
    rep = reporter(clock)
    rec = batch_recorder()
    d = delivery(reporter=rep)
    d.progressed(check_progress(0.75, "almost"))
    failure = Failure("ValueError", "boom", permanent=end == "dead")
    if end == "succeeded":
        rec.succeeded(d, 0.1, NOW, None)
    else:
        rec.failed(d, failure, 0.1, NOW)
    outcome, schema = outcome_of(rec)
    assert (outcome["state"], outcome["progress"], orjson.loads(outcome["progress_detail"])) == (
        end,
        0.75,
        "almost",
    )
    assert schema == OUTCOME_V3
    clock.ms = 10_000
    assert rep.records([], at_ms=NOW) == []  # ended: nothing more of it
    d.progressed(check_progress(0.9, None))  # a thread the handler left behind
    assert rep.records([], at_ms=NOW) == []


def test_progress_already_written_is_not_repeated_in_the_final_outcome() -> None:
    clock = Clock()
    rep = reporter(clock)
    rec = batch_recorder()
    d = delivery(reporter=rep)
    d.progressed(check_progress(0.5, None))
    assert len(rep.records([d], at_ms=NOW)) == 1
    rec.succeeded(d, 0.1, NOW, None)
    _outcome, schema = outcome_of(rec)
    assert schema == OUTCOME_V1


def test_the_recorder_adds_progress_records_at_a_cut() -> None:
    clock = Clock()
    rep = reporter(clock)
    rec = batch_recorder()
    rec.progress = rep
    d = delivery(reporter=rep)
    d.feed.tracker.add(9)
    d.progressed(check_progress(0.5, None))
    rec.add_progress([d], NOW)
    cut = rec.cut([d.feed])
    assert cut is not None
    batch, _finals, _marks = cut
    assert [r[1] for r in batch.records] == [N.outcomes]


def test_the_v3_outcome_is_byte_for_byte_the_codecs() -> None:
    """The hot path appends the result to the v1 bytes (fast.result_tail): the same
    bytes as encode_outcome_v3 and as fastavro's encoding of the same record."""
    rec, d = batch_recorder(), delivery(payload={"a": 1})
    rec.succeeded(d, 0.002, NOW, {"a": 1})
    assert d.fields is not None
    (written,) = [r[4] for r in rec.records if r[1] == N.outcomes]
    fields: dict[str, Any] = {
        "job_id": d.fields[0],
        "queue": "jobs",
        "task": "compute",
        "idempotency_key": "k1",
        "state": "succeeded",
        "attempt": 1,
        "at_ms": NOW,
        "due_ms": NOW - 5,
        "duration_ms": 2.0,
        "worker": "w",
        "result": b'{"a":1}',
    }
    assert written == encode_outcome_v3(**fields)
    assert written == codec.encode("outcome", {**fields, "result_error": None})
