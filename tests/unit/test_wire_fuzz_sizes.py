"""The wire fuzzer's size oracle (tests/support/wire_sizes.py and the sizes of
tests/support/wire_fuzz.py) agrees with the code, without a broker.

The oracle writes docs/wire-format.md#size-budget out again; here its numbers meet
``dueflow.records.record_size``, the emitter's drainer (driven by the in-memory
timer topic of tests/support/sim_wheel.py) and the worker's batch recorder (the
fuzzer's failing handlers failing, attempt after attempt, until a dead letter),
for every size at and around a budget the fuzzer draws.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dueflow.config import load_settings
from dueflow.consumers import TaskRegistry
from dueflow.consumers.failures import Failure, failure_of
from dueflow.consumers.feeds import (
    Delivery,
    PartitionFeed,
    WireLimits,
    attempt_limits,
    prepare,
)
from dueflow.consumers.outputs import dead_letter_fields, dead_letter_headers
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.store import MemoryKeyStore
from dueflow.errors import JobError, PermanentJobError
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.reasons import reason_label
from dueflow.records import codec
from dueflow.records.record_size import record_size
from dueflow.streams.emitter.limits import FIRE_HEADROOM, EmitterLimits
from dueflow.testing.log import MemoryRecord
from tests.chaos.handlers import chaos_doomed, chaos_ok, chaos_permanent
from tests.support import wire_fuzz as wf
from tests.support import wire_sizes as ws
from tests.support.emitters import SMALL_WHEEL
from tests.support.sim_wheel import SimWheel, Stored

NOW = 1_800_000_000_000
PREFIX = "p"
SETTINGS = load_settings(
    env={},
    overrides={
        "topic_prefix": PREFIX,
        "wheel": SMALL_WHEEL,
        "queues": [
            {"name": wf.QUEUE, "partitions": wf.EXEC_PARTITIONS, "retry_tiers_ms": list(wf.TIERS)}
        ],
    },
)
N = names(SETTINGS)
REGISTRY = TaskRegistry([chaos_ok, chaos_doomed, chaos_permanent])
LIMITS = WireLimits(skew_ms=wf.SKEW, tiers_ms=wf.TIERS)
OFFSETS = [7, 123_456]  # where the record lands: df-src and df-origin name it
EDGES = [(role, size) for role in ("timer", "exec", "retry") for size in wf.budget_sizes(role)]


def _edge_id(edge: tuple[str, wf.Size]) -> str:
    role, size = edge
    pad = f"-pad{size.pad}" if size.pad else ""
    return f"{role}-{size.budget}{size.delta:+d}-{size.task}{pad}"


def sized_record(role: str, size: wf.Size, offset: int) -> wf.Record:
    spec = wf.Spec(role, partition=1, tier=wf.TIERS[0])
    wf.with_size(spec, size)
    return wf.materialize(spec, now=NOW, tok="0123456789ab", place=wf.Place(PREFIX, offset))


# ------------------------------------------------------------------ record sizes

LENGTHS = [0, 1, 63, 64, 8_191, 8_192, 1_048_575, 1_048_576]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    key=st.none() | st.sampled_from(LENGTHS[:6]).map(lambda n: b"k" * n),
    value=st.none() | st.sampled_from(LENGTHS).map(lambda n: b"v" * n),
    headers=st.lists(
        st.tuples(
            st.text(max_size=70),
            st.sampled_from(LENGTHS[:6]).map(lambda n: b"h" * n) | st.binary(max_size=10),
        ),
        max_size=5,
    ),
)
def test_the_record_sizes_are_the_broker_s(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> None:
    assert ws.record_bytes(key, value, headers) == record_size(key, value, headers)


def test_the_sizes_land_on_their_budgets() -> None:
    """Each record is the size its budget asks for, to the byte."""
    for role, size in EDGES:
        rec = sized_record(role, size, OFFSETS[0])
        limit = wf.BUDGETS[size.budget or ""][1]
        own = record_size(rec.key, rec.value, rec.headers)
        if size.budget in ("timers", "exec", "retry"):
            assert own == limit + size.delta, _edge_id((role, size))
        elif size.budget == "fire":
            exec_headers = [*rec.headers, ("df-fired", b"1" * 13), ("df-src", b"p.timers:1:7")]
            assert record_size(rec.key, rec.value, exec_headers) == limit + size.delta
        elif size.budget == "retry-fit":
            assert wf.retry_len(rec, OFFSETS[0]) == limit + size.delta
        else:
            dead = wf.dead_letter_of(rec, OFFSETS[0], retried=False)
            assert dead is not None
            assert dead.bare == limit + size.delta


# ------------------------------------------------------------------ the emitter


def emitter_verdict(rec: wf.Record, offset: int) -> str:
    """What the drainer does with the timer ``rec`` at ``offset`` of its partition:
    ``fired`` or the quarantine reason. A timer whose headers are larger than the hot
    path allows for is fired unmeasured until the broker refuses its exec record;
    then every record is measured: the drainer runs as after that refusal."""
    limits = EmitterLimits(SETTINGS, read=lambda topics: {})  # the broker's default limits
    if any(len(v) > FIRE_HEADROOM for _, v in rec.headers):
        limits.refused(NOW)
    sim = SimWheel(SETTINGS, limits=limits)
    filler = Stored(b"x", b"x", [], NOW)
    sim.logs[rec.partition] = [filler] * offset
    sim.committed[rec.partition] = (offset, None)
    assert rec.key is not None
    assert rec.value is not None
    assert sim.append(rec.partition, Stored(rec.key, rec.value, rec.headers, NOW)) == offset
    drainer = sim.drainer(NOW)
    for t in range(NOW, NOW + 2_000, 20):
        sim.step(drainer, t)
        if drainer.touched:
            sim.commit(drainer, t)
    if sim.quarantine_reasons:
        (reason,) = sim.quarantine_reasons
        return reason
    assert [f.key for f in sim.fired] == [rec.key]
    return "fired"


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(
    "edge",
    [e for e in EDGES if e[0] == "timer"],
    ids=[_edge_id(e) for e in EDGES if e[0] == "timer"],
)
def test_the_emitter_fires_or_sets_aside_a_timer_near_its_budget_as_the_oracle_says(
    edge: tuple[str, wf.Size], offset: int
) -> None:
    rec = sized_record(*edge, offset)
    if rec.fate == "refused":
        assert record_size(rec.key, rec.value, rec.headers) > ws.TOPIC_MAX_BYTES
        return
    verdict = emitter_verdict(rec, offset)
    if rec.fate == "quarantine":
        assert reason_label(verdict) in rec.reasons, verdict
    else:
        assert rec.fate == "run"
        assert verdict == "fired"


# ------------------------------------------------------------------ the worker


def _failure(task: str, attempt: int) -> Failure:
    """What the fuzzer's handler raises, as the worker records it (with a traceback)."""
    try:
        if task == wf.DOOMED:
            raise JobError(wf.doomed_message(attempt))
        raise PermanentJobError(wf.PERMANENT_FAILURE[1])
    except JobError as exc:
        return failure_of(exc)


def worker_chain(rec: wf.Record, offset: int) -> tuple[int, Any, dict[str, Any], list[int]]:
    """Run ``rec``'s failing job through the batch recorder until it is dead-lettered:
    the attempts run, the DLQ record, its decoded value and the retry records' sizes."""
    recorder = BatchRecorder(
        SETTINGS,
        SETTINGS.queue(wf.QUEUE),
        worker_id="w",
        metrics=Metrics(),
        tracer=JobTracer(),
        rng=random.Random(1),
    )
    tier = None if rec.role == "exec" else rec.tier
    topic = N.exec(wf.QUEUE) if tier is None else N.retry(wf.QUEUE, tier)
    assert rec.sizing is not None
    task = rec.sizing.task
    key, value, headers = rec.key, rec.value, list(rec.headers)
    now, runs = NOW + 500, 0
    retries: list[int] = []
    while True:
        feed = PartitionFeed(topic, rec.partition, tier, MemoryKeyStore(10**9))
        msg = MemoryRecord(topic, rec.partition, offset, key, value, headers, now)
        d = Delivery(feed, msg, offset)
        prepare(d, REGISTRY, now_ms=now, limits=LIMITS)
        assert d.bad is None, d.bad
        assert d.task is not None
        assert d.fields is not None
        d.max_attempts, _ = attempt_limits(d.task, d.fields, SETTINGS.worker)  # as the runtime
        runs += 1
        recorder.records.clear()
        recorder.failed(d, _failure(task, d.attempt), 0.01, now)
        dead = [r for r in recorder.records if r[1] == N.dlq(wf.QUEUE)]
        if dead:
            (dlq,) = dead
            return runs, dlq, codec.decode("dead_letter", dlq[4]), retries
        (retry,) = [r for r in recorder.records if ".retry." in r[1]]
        topic, key, value, headers = retry[1], retry[3], retry[4], list(retry[5])
        tier = int(topic.rsplit(".", 1)[1].removesuffix("ms"))
        retries.append(record_size(key, value, headers))
        now += 600


FAILING = [e for e in EDGES if e[1].task != wf.TASK]


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("edge", FAILING, ids=[_edge_id(e) for e in FAILING])
def test_a_failing_job_near_a_budget_ends_as_the_oracle_says(
    edge: tuple[str, wf.Size], offset: int
) -> None:
    rec = sized_record(*edge, offset)
    assert rec.fate == "dlq"
    runs, dlq, dl, retries = worker_chain(rec, offset)
    assert dl["reason"] in rec.reasons, (dl["reason"], rec.reasons)
    assert runs == rec.runs
    if wf.dead_letter_kept(dl) != "texts":
        assert dl["error_message"].startswith(rec.message)
    if retries:
        assert retries[0] == wf.retry_len(rec, offset)
    assert record_size(dlq[3], dlq[4], dlq[5]) <= ws.SET_ASIDE_MAX_BYTES
    if rec.cut is not None:
        kept = wf.dead_letter_kept(dl)
        assert kept == rec.cut or (rec.cut == "kept" and kept != "reference"), (kept, rec.cut)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("edge", FAILING, ids=[_edge_id(e) for e in FAILING])
def test_the_oracle_s_dead_letter_is_the_worker_s_to_the_byte(
    edge: tuple[str, wf.Size], offset: int
) -> None:
    """The dead letter as the worker encodes it, error texts empty, is the size the
    oracle counts (the size its verdict compares with the DLQ's limit)."""
    rec = sized_record(*edge, offset)
    dead = wf.dead_letter_of(rec, offset, retried=False)
    assert dead is not None
    assert rec.sizing is not None
    job_id, queue, task, key_text = rec.sizing.ids
    if task == wf.PERMANENT:
        error_type, message = wf.PERMANENT_FAILURE
        reason = "permanent_error"
    else:
        error_type = wf.JOB_ERROR
        tier = N.retry(wf.QUEUE, wf.DOOMED_TIER)
        size = wf.retry_len(rec, offset)
        message = ws.not_retried(
            size, ws.TOPIC_MAX_BYTES, tier, wf.doomed_message(rec.sizing.attempt)
        )
        reason = "other"
    failure = Failure(error_type, message, "tb")
    topic = wf.Place(PREFIX).topic(rec.role, rec.tier)
    fields = dead_letter_fields(
        job_id=job_id,
        queue=queue,
        task=task,
        idempotency_key=key_text,
        reason=reason,
        failure=failure,
        attempts=rec.sizing.attempt,
        first_failure_ms=NOW,
        last_failure_ms=NOW,
        dead_ms=NOW,
        origin=(topic, rec.partition, offset),
        trace_id=None,
        value=rec.value or b"",
        headers=dict(rec.headers),
    )
    fields.update(error_type="", error_message="", traceback="")
    value = codec.encode("dead_letter", fields, version=1)
    headers = dead_letter_headers(rec.headers, failure=failure, attempts=rec.sizing.attempt)
    assert record_size(rec.key, value, headers) == dead.bare
