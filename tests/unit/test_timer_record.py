"""Timer records: placement, headers that agree with the value, size estimate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.errors import ConfigError
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.job_request import JobRequest, JobRules, prepare_job
from dueflow.records.record_size import record_size
from dueflow.records.timer_record import TimerPlacer, spread_of, timer_record
from dueflow.rules.wheel import WheelGeometry, WheelLevel, place_timer
from tests.support.wheel_geometries import GEO, SMALL

NOW = 1_800_000_000_000


def job(**overrides: object) -> Job:
    fields: dict[str, object] = {
        "job_id": "job-1",
        "queue": "default",
        "task": "send_email",
        "payload": b"{}",
        "due_ms": NOW + 300_000,
        "idempotency_key": "job-1",
        "created_ms": NOW,
        "content_hash": "h",
    }
    fields.update(overrides)
    return Job(**fields)  # type: ignore[arg-type]


@settings(max_examples=600, deadline=None)
@given(
    slots=st.lists(st.integers(3, 80), min_size=1, max_size=4),
    widths=st.lists(st.integers(2, 6), min_size=4, max_size=4),
    lookahead=st.integers(0, 400),
    near=st.integers(1, 8),
    now=st.integers(0, 4 * 10**12),
    delta=st.integers(-(10**7), 10**11),
    spread=st.integers(0, 2**32 - 1),
)
def test_property_placer_is_place_timer(
    slots: list[int],
    widths: list[int],
    lookahead: int,
    near: int,
    now: int,
    delta: int,
    spread: int,
) -> None:
    levels, width = [], 100
    for i, n in enumerate(slots):
        levels.append(WheelLevel(n, width))
        width *= widths[i]
    geo = WheelGeometry(
        levels=tuple(levels),
        near_partitions=near,
        near_window_ms=100 + lookahead,
        lookahead_ms=lookahead,
    )
    try:
        geo.validate()
    except ConfigError:
        geo = GEO
    expected = place_timer(due_ms=now + delta, now_ms=now, geometry=geo, spread=spread)
    got = TimerPlacer(geo).partition(due_ms=now + delta, now_ms=now, spread=spread)
    assert got == expected.partition


@pytest.mark.parametrize(
    ("delta_ms", "partition"),
    [
        (-5_000, None),  # overdue: a near partition chosen by the key
        (250, None),
        (251, 2 + (NOW + 251) // 100 % 10),
        (850, 2 + (NOW + 850) // 100 % 10),  # level 0 reach: 9*100 - 50
        (851, 2 + 10 + (NOW + 851) // 800 % 8),
        (5_550, 2 + 10 + (NOW + 5_550) // 800 % 8),  # level 1 reach: 7*800 - 50
        (5_551, 2 + 10 + 8 + (NOW + 5_551) // 4_800 % 6),
        (10**9, 2 + 10 + 8 + (NOW + 5 * 4_800 - 50) // 4_800 % 6),  # parked at the top
    ],
)
def test_placement_table_small_geometry(delta_ms: int, partition: int | None) -> None:
    j = job(due_ms=NOW + delta_ms)
    rec = timer_record(j, now_ms=NOW, placer=TimerPlacer(SMALL))
    if partition is None:
        assert rec.partition == spread_of(b"job-1") % SMALL.near_partitions
    else:
        assert rec.partition == partition


def test_headers_agree_with_the_value() -> None:
    prepared = prepare_job(
        JobRequest(
            "send_email",
            {"to": "a@example.com"},
            delay=90,
            queue="billing",
            job_id="j-9",
            idempotency_key="invoice:9",
        ),
        now_ms=NOW,
        rules=JobRules(frozenset({"billing"})),
        new_job_id=lambda now_ms: "unused",
    )
    rec = timer_record(prepared, now_ms=NOW, placer=TimerPlacer(GEO))
    value = codec.decode("job", rec.value)
    assert rec.key == b"invoice:9"
    h = rec.headers
    assert [name for name, _ in h] == [
        hdr.DUE,
        hdr.QUEUE,
        hdr.KIND,
        hdr.JOB_ID,
        hdr.TASK,
        hdr.SCHEMA,
    ]
    assert hdr.header_int(h, hdr.DUE) == value["due_ms"] == NOW + 90_000
    assert hdr.header_text(h, hdr.QUEUE) == value["queue"] == "billing"
    assert hdr.header_text(h, hdr.KIND) == hdr.KIND_JOB
    assert hdr.header_text(h, hdr.JOB_ID) == value["job_id"] == "j-9"
    assert hdr.header_text(h, hdr.TASK) == value["task"] == "send_email"
    assert codec.parse_schema_header(hdr.header(h, hdr.SCHEMA), expected="job") == 1
    assert value["idempotency_key"] == "invoice:9"
    assert (
        rec.partition
        == place_timer(
            due_ms=NOW + 90_000, now_ms=NOW, geometry=GEO, spread=spread_of(b"invoice:9")
        ).partition
    )
    assert rec.size == record_size(rec.key, rec.value, rec.headers)


def test_cron_occurrence_and_trace_headers() -> None:
    trace = [(hdr.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]
    rec = timer_record(
        job(schedule_id="nightly", schedule_version=7),
        now_ms=NOW,
        placer=TimerPlacer(GEO),
        trace_headers=trace,
    )
    assert hdr.header_text(rec.headers, hdr.KIND) == hdr.KIND_CRON
    assert hdr.header_text(rec.headers, hdr.SCHEDULE) == "nightly"
    assert hdr.header_int(rec.headers, hdr.SCHEDULE_VERSION) == 7
    assert hdr.header(rec.headers, hdr.TRACEPARENT) == trace[0][1]
    assert rec.size == record_size(rec.key, rec.value, rec.headers)


def test_record_size_is_the_kafka_encoding() -> None:
    # Kafka v2 record: varints for length, attributes, deltas, key/value lengths,
    # header count and header lengths; 61-byte batch header.
    rec = timer_record(job(payload=b"x" * 1000), now_ms=NOW, placer=TimerPlacer(GEO))
    body = 1 + 1 + 1 + 1 + len(rec.key) + 2 + len(rec.value) + 1
    body += sum(1 + len(k) + 1 + len(v) for k, v in rec.headers)
    assert rec.size == 61 + 2 + body  # the record length varint: 2 bytes
