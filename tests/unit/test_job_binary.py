"""The hand-written Job encoder writes exactly fastavro's bytes."""

from __future__ import annotations

import io

import fastavro
import pytest
from hypothesis import given, settings

from dueflow.model import Backoff, BackoffKind, Job
from dueflow.records import codec
from dueflow.records.job_binary import encode_job, encode_plain_job, job_values
from dueflow.records.job_request import JobRequest, JobRules, prepare_job
from dueflow.records.varint import varint
from tests.support.avro_values import LONGS, avro_jobs

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


@given(avro_jobs(max_payload=300))
@settings(max_examples=400, deadline=None)
def test_property_same_bytes_and_round_trip(job: Job) -> None:
    data = encode_job(job)
    assert data == fastavro_bytes(job)
    assert Job.from_record(codec.decode("job", data)) == job


@given(LONGS)
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


@given(avro_jobs(max_payload=300, plain=True))
@settings(max_examples=300, deadline=None)
def test_property_plain_encoder_is_the_encoder(job: Job) -> None:
    values = job_values(job)
    job_id, key = job.job_id, job.idempotency_key
    assert encode_plain_job(values, job_id.encode(), key.encode()) == fastavro_bytes(job)
