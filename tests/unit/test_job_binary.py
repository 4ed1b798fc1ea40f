"""The hand-written Job encoder writes exactly fastavro's bytes."""

from __future__ import annotations

import io

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.model import Backoff, BackoffKind, Job
from dueflow.records import codec
from dueflow.records.job_binary import encode_job, encode_plain_job, job_values
from dueflow.records.job_request import JobRequest, JobRules, prepare_job
from dueflow.records.varint import varint

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
TEXT = st.text(max_size=40)
STRINGS = st.dictionaries(TEXT, TEXT, max_size=4)

BASE = Job(
    job_id="0190f0c2a1b27c3d8e9f00112233aabb",
    queue="default",
    task="send_email",
    payload=b'{"template":"welcome","to":"user@example.com"}',
    due_ms=1_800_000_300_000,
    idempotency_key="0190f0c2a1b27c3d8e9f00112233aabb",
    created_ms=1_800_000_000_000,
    content_hash="00112233445566778899aabbccddeeff",
)


def fastavro_bytes(job: Job) -> bytes:
    return codec.encode("job", job.to_record())


@pytest.mark.parametrize(
    "job",
    [
        BASE,
        Job("x", "q", "t", b"", 0, "k", 0),
        Job("x", "q", "t", b"\x00" * 20_000, -5, "k", -1, content_type="application/octet-stream"),
        Job(
            "é-ü",
            "billing",
            "charge",
            b"{}",
            2**62,
            "payment:42",
            1,
            max_attempts=2**31 - 1,
            backoff=Backoff(BackoffKind.FIXED, 500, 60_000, 1.5, False),
            timeout_ms=30_000,
            jitter_ms=10_000,
            trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            schedule_id="nightly",
            schedule_version=1_800_000_000_000,
            labels={"tenant": "acme", "ü": "ß"},
        ),
        Job("x", "q", "t", b"", 0, "k", 0, backoff=Backoff(BackoffKind.NONE), labels={"a": "b"}),
        Job("x", "q", "t", b"", 0, "k", 0, content_hash="h", labels={"a": "b"}),
        Job("x" * 9000, "q" * 9000, "t", b"", 0, "k" * 9000, 0, content_hash="h" * 9000),
    ],
)
def test_same_bytes_as_fastavro(job: Job) -> None:
    assert encode_job(job) == fastavro_bytes(job)
    assert Job.from_record(codec.decode("job", encode_job(job))) == job


@given(
    job_id=TEXT,
    queue=TEXT,
    task=TEXT,
    payload=st.binary(max_size=300),
    content_type=TEXT,
    due_ms=LONG,
    key=TEXT,
    created_ms=LONG,
    max_attempts=INT,
    backoff=st.none()
    | st.builds(
        Backoff,
        st.sampled_from(list(BackoffKind)),
        LONG,
        LONG,
        st.floats(allow_nan=False),
        st.booleans(),
    ),
    timeout_ms=st.none() | LONG,
    jitter_ms=LONG,
    trace=STRINGS,
    schedule_id=st.none() | TEXT,
    schedule_version=st.none() | LONG,
    content_hash=st.none() | TEXT,
    labels=STRINGS,
)
@settings(max_examples=400, deadline=None)
def test_property_same_bytes_and_round_trip(
    job_id: str,
    queue: str,
    task: str,
    payload: bytes,
    content_type: str,
    due_ms: int,
    key: str,
    created_ms: int,
    max_attempts: int,
    backoff: Backoff | None,
    timeout_ms: int | None,
    jitter_ms: int,
    trace: dict[str, str],
    schedule_id: str | None,
    schedule_version: int | None,
    content_hash: str | None,
    labels: dict[str, str],
) -> None:
    job = Job(
        job_id,
        queue,
        task,
        payload,
        due_ms,
        key,
        created_ms,
        content_type=content_type,
        max_attempts=max_attempts,
        backoff=backoff,
        timeout_ms=timeout_ms,
        jitter_ms=jitter_ms,
        trace=trace,
        schedule_id=schedule_id,
        schedule_version=schedule_version,
        content_hash=content_hash,
        labels=labels,
    )
    data = encode_job(job)
    assert data == fastavro_bytes(job)
    assert Job.from_record(codec.decode("job", data)) == job


@given(LONG)
def test_property_varint_is_avro_long(n: int) -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, {"type": "long"}, n)
    assert varint(n) == buf.getvalue()


def test_prepared_job_encodes_like_its_job() -> None:
    prepared = prepare_job(
        JobRequest("send_email", {"to": "a@example.com"}, delay="5m", jitter="10s"),
        now_ms=1_800_000_000_000,
        rules=JobRules(frozenset({"default"})),
        new_job_id=lambda now_ms: "0190f0c2a1b27c3d8e9f00112233aabb",
    )
    assert encode_job(prepared) == fastavro_bytes(prepared.to_job())


def test_out_of_range_values_are_refused() -> None:
    with pytest.raises(ValueError, match="Avro int"):
        encode_job(Job("x", "q", "t", b"", 0, "k", 0, max_attempts=2**31))
    with pytest.raises(ValueError, match="Avro long"):
        encode_job(Job("x", "q", "t", b"", 2**63, "k", 0))


@given(
    job_id=TEXT,
    queue=TEXT,
    task=TEXT,
    payload=st.binary(max_size=300),
    due_ms=LONG,
    key=TEXT,
    created_ms=LONG,
    max_attempts=INT,
    content_hash=TEXT,
)
@settings(max_examples=300, deadline=None)
def test_property_plain_encoder_is_the_encoder(
    job_id: str,
    queue: str,
    task: str,
    payload: bytes,
    due_ms: int,
    key: str,
    created_ms: int,
    max_attempts: int,
    content_hash: str,
) -> None:
    job = Job(
        job_id,
        queue,
        task,
        payload,
        due_ms,
        key,
        created_ms,
        max_attempts=max_attempts,
        content_hash=content_hash,
    )
    values = job_values(job)
    assert encode_plain_job(values, job_id.encode(), key.encode()) == fastavro_bytes(job)
