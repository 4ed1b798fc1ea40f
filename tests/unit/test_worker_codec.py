"""The hand-written Avro codecs agree byte for byte with fastavro."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records import worker_codec as fast
from dueflow.rules.wire_bounds import MAX_DUE_MS, MAX_INT32, MIN_TIME_MS
from tests.support.avro_values import DOUBLES, INTS, LONGS, TEXTS, avro_jobs

jobs = avro_jobs(max_payload=100)


@given(jobs)
@settings(max_examples=300, deadline=None)
def test_decode_job_matches_fastavro(job: Job) -> None:
    data = codec.encode("job", job.to_record())
    assert fast.decode_job(data) == Job.from_record(codec.decode("job", data))
    assert fast.decode_job(data, fast.JOB_V1) == job


@given(jobs, st.integers(min_value=0, max_value=50))
def test_truncated_job_is_undecodable(job: Job, cut: int) -> None:
    data = codec.encode("job", job.to_record())
    with pytest.raises(UndecodableRecord):
        fast.decode_job(data[: max(0, len(data) - 1 - cut)])


def test_garbage_and_trailing_bytes_are_undecodable() -> None:
    job = Job("j", "q", "t", b"{}", 1, "k", 2)
    data = codec.encode("job", job.to_record())
    for bad in (b"", b"\xff\xff\xff", b"not avro at all", data + b"\x00"):
        with pytest.raises(UndecodableRecord):
            fast.decode_job(bad)


def test_blocked_maps_with_byte_sizes_decode() -> None:
    # Writers may send map blocks with a negative count followed by a byte size.
    job = Job("j", "q", "t", b"{}", 1, "k", 2)
    plain = codec.encode("job", job.to_record())
    # trace map is empty (0x00) just before schedule_id; labels is the last byte.
    entry = fast._s("a") + fast._s("b")
    blocked = plain[:-1] + fast._zigzag(-1) + fast._zigzag(len(entry)) + entry + b"\x00"
    assert fast.decode_job(blocked).labels == {"a": "b"}


outcomes = st.fixed_dictionaries(
    {
        "job_id": TEXTS,
        "queue": TEXTS,
        "task": TEXTS,
        "idempotency_key": TEXTS,
        "state": st.sampled_from([s for s in fast.JOB_STATES if s not in fast.V3_STATES]),
        "attempt": INTS,
        "at_ms": LONGS,
        "due_ms": st.none() | LONGS,
        "duration_ms": st.none() | DOUBLES,
        "error_type": st.none() | TEXTS,
        "error": st.none() | TEXTS,
        "worker": st.none() | TEXTS,
        "trace_id": st.none() | TEXTS,
        "schedule_id": st.none() | TEXTS,
    }
)


@given(outcomes)
@settings(max_examples=300, deadline=None)
def test_encode_outcome_is_byte_identical(rec: dict[str, Any]) -> None:
    assert fast.encode_outcome(**rec) == codec.encode("outcome", rec, version=2)
    if rec["state"] not in fast.V2_STATES:
        assert fast.encode_outcome(**rec) == codec.encode("outcome", rec, version=1)


outcomes_v3 = st.fixed_dictionaries(
    {
        "result": st.none() | st.binary(max_size=40),
        "result_error": st.none() | TEXTS,
        "progress": st.none() | DOUBLES,
        "progress_detail": st.none() | st.binary(max_size=40),
        "exec_partition": st.none() | INTS,
        "version": st.none() | TEXTS,
        "command_id": st.none() | TEXTS,
        "first_job_id": st.none() | TEXTS,
        "group_id": st.none() | TEXTS,
    }
)


@given(outcomes, outcomes_v3, st.sampled_from(fast.JOB_STATES))
@settings(max_examples=300, deadline=None)
def test_encode_outcome_v3_is_byte_identical(
    rec: dict[str, Any], new: dict[str, Any], state: str
) -> None:
    full = {**rec, **new, "state": state}
    assert fast.encode_outcome_v3(**full) == codec.encode("outcome", full)
    assert fast.outcome_header(state) == codec.schema_header(
        "outcome", 3 if state in fast.V3_STATES else 2 if state in fast.V2_STATES else 1
    )


@given(outcomes)
@settings(max_examples=200, deadline=None)
def test_encode_scheduled_is_the_scheduled_outcome_byte_for_byte(rec: dict[str, Any]) -> None:
    rec = {**rec, "state": "scheduled", "attempt": 0, "due_ms": rec["due_ms"] or 0}
    rec.update(duration_ms=None, error_type=None, error=None, worker=None)
    got = fast.encode_scheduled(
        rec["job_id"],
        rec["queue"],
        rec["task"],
        rec["idempotency_key"],
        rec["due_ms"],
        rec["at_ms"],
        rec["trace_id"],
        rec["schedule_id"],
    )
    assert got == fast.encode_outcome(**rec) == codec.encode("outcome", rec, version=1)


key_records = st.fixed_dictionaries(
    {
        "idempotency_key": TEXTS,
        "job_id": TEXTS,
        "state": st.sampled_from(fast.KEY_STATES),
        "at_ms": LONGS,
        "attempts": INTS,
        "content_hash": st.none() | TEXTS,
    }
)


@given(key_records)
@settings(max_examples=300, deadline=None)
def test_key_state_round_trip_is_byte_identical(rec: dict[str, Any]) -> None:
    data = fast.encode_key_state(**rec)
    assert data == codec.encode("idempotency", rec, version=2)
    want = (rec["state"], rec["at_ms"], rec["attempts"])
    if not (MIN_TIME_MS <= rec["at_ms"] <= MAX_DUE_MS and 0 <= rec["attempts"] <= MAX_INT32):
        for schema in (None, codec.schema_header("idempotency", 2)):
            with pytest.raises(FieldOutOfRange):  # written by no worker: set aside
                fast.decode_key_state(data, schema)
        return
    assert fast.decode_key_state(data) == want
    assert fast.decode_key_state(data, fast.IDEMPOTENCY_V2) == want
    assert fast.decode_key_state(data, codec.schema_header("idempotency", 2)) == want
    if rec["state"] in fast.KEY_STATES_V1:
        assert fast.decode_key_state(data, fast.IDEMPOTENCY_V1) == want
    else:  # version 1 had no `retrying`
        with pytest.raises(UndecodableRecord):
            fast.decode_key_state(data, fast.IDEMPOTENCY_V1)


def test_key_state_rejects_bad_enum() -> None:
    rec = {"idempotency_key": "k", "job_id": "j", "state": "done", "at_ms": 5}
    data = bytearray(fast.encode_key_state(**rec))  # type: ignore[arg-type]
    data[4] = 0x08  # state index 4 does not exist
    with pytest.raises(UndecodableRecord):
        fast.decode_key_state(bytes(data))


@given(
    st.tuples(TEXTS, TEXTS, TEXTS, TEXTS),
    INTS,
    LONGS,
    LONGS,
    DOUBLES,
    st.none() | TEXTS,
    st.none() | TEXTS,
    TEXTS,
)
def test_encode_success_matches_the_general_encoders(
    names: tuple[str, str, str, str],
    attempt: int,
    at_ms: int,
    due_ms: int,
    duration: float,
    trace_id: str | None,
    schedule_id: str | None,
    worker: str,
) -> None:
    job_id, key, queue, task = names
    key_state, outcome = fast.encode_success(
        job_id, key, queue, task, attempt, at_ms, due_ms, duration, worker, trace_id, schedule_id
    )
    assert key_state == fast.encode_key_state(
        idempotency_key=key, job_id=job_id, state="done", at_ms=at_ms, attempts=attempt
    )
    assert outcome == codec.encode(
        "outcome",
        version=1,
        record={
            "job_id": job_id,
            "queue": queue,
            "task": task,
            "idempotency_key": key,
            "state": "succeeded",
            "attempt": attempt,
            "at_ms": at_ms,
            "due_ms": due_ms,
            "duration_ms": duration,
            "error_type": None,
            "error": None,
            "worker": worker,
            "trace_id": trace_id,
            "schedule_id": schedule_id,
        },
    )
