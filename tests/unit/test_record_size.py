"""A record's size as the broker and librdkafka count it, against a record batch
serialized byte by byte here (Kafka's v2 format, written out independently of the
module under test). ``tests/integration/test_record_size_broker.py`` checks the
same sizes against the broker and librdkafka at the exact limit."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.config import load_settings
from dueflow.model import Job
from dueflow.records.record_size import (
    PRODUCER_OVERHEAD,
    batch_size,
    body_size,
    header_bytes,
    producer_size,
    record_size,
    sized,
    varint_size,
)
from dueflow.records.timer_record import TimerPlacer, timer_record
from dueflow.records.varint import varint

Headers = list[tuple[str, bytes | None]]


def zigzag(n: int) -> bytes:
    """Kafka's varint (zig-zag, 7 bits a byte, low group first)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def kafka_batch(key: bytes | None, value: bytes | None, headers: Headers) -> bytes:
    """A v2 record batch holding one record, as a producer sends it uncompressed."""
    record = bytearray()
    record += b"\x00"  # attributes
    record += zigzag(0)  # timestamp delta
    record += zigzag(0)  # offset delta
    record += zigzag(-1) if key is None else zigzag(len(key)) + key
    record += zigzag(-1) if value is None else zigzag(len(value)) + value
    record += zigzag(len(headers))
    for name, raw in headers:
        encoded = name.encode()
        record += zigzag(len(encoded)) + encoded
        record += zigzag(-1) if raw is None else zigzag(len(raw)) + raw
    records = zigzag(len(record)) + bytes(record)
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,  # base offset
        0,  # batch length (not filled in: only the size counts)
        -1,  # partition leader epoch
        2,  # magic
        0,  # CRC
        0,  # attributes
        0,  # last offset delta
        0,  # first timestamp
        0,  # max timestamp
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
        1,  # records
    )
    assert len(header) == 61
    return header + records


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (None, None, []),
        (b"", b"", []),
        (b"k", b"v", [("h", b"x")]),
        (b"k" * 63, b"v" * 63, [("h", None)]),
        (b"k" * 64, b"v" * 64, [("h" * 64, b"x" * 64)]),
        (b"k" * 8191, b"v" * 8191, []),
        (b"k" * 8192, b"v" * 8192, [("df-due", b"1800000000000")]),
        (None, b"v" * 1_048_575, [("a", b"")] * 63),
        (b"key", b"v" * 1_048_576, [("a", b"1")] * 64),
        (b"\xe2\x82\xac" * 300, b"x" * 200_000, [("df-error", "é".encode() * 200)]),
    ],
    ids=[
        "nulls",
        "empty",
        "small",
        "one-byte-varints",
        "two-byte-varints",
        "8191",
        "8192",
        "1MiB-1-and-63-headers",
        "1MiB-and-64-headers",
        "utf8",
    ],
)
def test_record_size_is_the_batch_a_producer_sends(
    key: bytes | None, value: bytes | None, headers: Headers
) -> None:
    assert record_size(key, value, headers) == len(kafka_batch(key, value, headers))


@given(
    key=st.none() | st.binary(max_size=300),
    value=st.none() | st.binary(max_size=20_000),
    headers=st.lists(
        st.tuples(st.text(max_size=80), st.none() | st.binary(max_size=300)), max_size=70
    ),
)
@settings(max_examples=300, deadline=None)
def test_record_size_of_any_record(
    key: bytes | None, value: bytes | None, headers: Headers
) -> None:
    assert record_size(key, value, headers) == len(kafka_batch(key, value, headers))
    body = body_size(
        -1 if key is None else len(key),
        -1 if value is None else len(value),
        header_bytes(headers),
        len(headers),
    )
    assert batch_size(body) == record_size(key, value, headers)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_varint_size_is_the_length_of_the_varint(n: int) -> None:
    assert varint_size(n) == len(zigzag(n)) == len(varint(n))


@pytest.mark.parametrize("n", [0, 1, 63, 64, 8191, 8192, 1_048_575, 1_048_576, 134_217_728])
def test_sized_is_bytes_with_their_length(n: int) -> None:
    assert sized(n) == n + len(zigzag(n))


@pytest.mark.parametrize(
    ("key", "value", "headers", "expected"),
    [
        (None, None, [], PRODUCER_OVERHEAD),
        (b"k" * 10, b"v" * 100, [], PRODUCER_OVERHEAD + 110),
        # a header: its name and value with their varint lengths (null: one byte)
        (b"k", b"v", [("df-due", b"1800000000000"), ("n", None)], PRODUCER_OVERHEAD + 2 + 21 + 3),
    ],
)
def test_producer_size_is_librdkafkas_measure(
    key: bytes | None, value: bytes | None, headers: Headers, expected: int
) -> None:
    assert producer_size(key, value, headers) == expected


SETTINGS = load_settings(env={}, overrides={"queues": "default,billing"})
PLACER = TimerPlacer(SETTINGS.wheel)


@given(
    payload=st.binary(max_size=20_000),
    job_id=st.text(min_size=1, max_size=255).filter(lambda s: s.isprintable()),
    queue=st.sampled_from(["default", "billing"]),
    task=st.from_regex(r"[a-z][a-z0-9_.]{0,60}", fullmatch=True),
    delay=st.integers(min_value=0, max_value=10**9),
)
@settings(max_examples=200, deadline=None)
def test_a_timer_record_knows_its_exact_size(
    payload: bytes, job_id: str, queue: str, task: str, delay: int
) -> None:
    now = 1_800_000_000_000
    job = Job(
        job_id=job_id,
        queue=queue,
        task=task,
        payload=payload,
        due_ms=now + delay,
        idempotency_key=job_id,
        created_ms=now,
    )
    rec = timer_record(job, now_ms=now, placer=PLACER)
    assert rec.size == len(kafka_batch(rec.key, rec.value, list(rec.headers)))
