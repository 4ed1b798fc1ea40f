"""Rescheduling (pure): when a reschedule is refused, the timer it writes, the records,
and the workers' rule for a delivery of a rescheduled key."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.kafka.topics import TopicNames
from dueflow.model import Job
from dueflow.producers.rescheduling import moved_timer, refusal, reschedule_records
from dueflow.producers.targets import Target
from dueflow.records import codec
from dueflow.records.reschedule import MARK, key_of, reschedule_key, superseded
from dueflow.records.timer_record import TimerPlacer, timer_record
from dueflow.records.worker_codec import decode_job, decode_key_record
from dueflow.rules.wheel import WheelGeometry

T = 1_900_000_000_000
TARGET = Target(
    job_id="j",
    queue="billing",
    idempotency_key="invoice:7",
    found=True,
    state="scheduled",
    due_ms=T + 600_000,
    task="charge",
    schedule_id=None,
    content_hash="h",
    known=False,
)


@pytest.mark.parametrize(
    ("changes", "due", "reason"),
    [
        ({}, T + 1_800_000, None),
        ({"state": "rescheduled"}, T + 1_800_000, None),
        ({"state": None}, T, None),  # known to this client only: its state is not known
        ({"found": False}, T, "not found"),
        ({"schedule_id": "nightly"}, T, "a cron occurrence of schedule 'nightly'"),
        ({"state": "retrying"}, T, "it has started"),
        ({"state": "succeeded"}, T, "it has succeeded already"),
        ({"state": "dead"}, T, "it has dead already"),
        ({"state": "cancelled"}, T, "it has cancelled already"),
        ({"state": "expired"}, T, "it has expired already"),
        ({"state": "duplicate"}, T, "it ran already"),
        ({}, T + 600_000, "it is due then already"),
    ],
)
def test_when_a_reschedule_is_refused(
    changes: dict[str, Any], due: int, reason: str | None
) -> None:
    got = refusal(replace(TARGET, **changes), due)
    if reason is None:
        assert got is None
    else:
        assert got is not None
        assert reason in got


@pytest.mark.parametrize(
    ("run_only", "job_due", "skipped"),
    [
        (None, T, False),  # no reschedule: any delivery runs
        (T + 5, T + 5, False),  # the delivery due at the new time runs
        (T + 5, T, True),  # the old timer
        (T + 9, T + 5, True),  # the timer of an earlier reschedule
    ],
)
def test_the_rule_for_a_delivery(run_only: int | None, job_due: int, skipped: bool) -> None:
    assert superseded(run_only, job_due) is skipped


def test_the_reschedule_record_has_a_key_of_its_own_on_the_keys_partition() -> None:
    from dueflow.rules.partitioning import partition_for_key

    record, outcome = reschedule_records(
        TopicNames("df"), TARGET, due_ms=T + 1_800_000, at_ms=T, partitions=6
    )
    assert record.key == b"invoice:7" + MARK == reschedule_key(b"invoice:7")
    assert key_of(record.key) == b"invoice:7"
    assert key_of(b"invoice:7") is None
    assert (record.topic, record.partition) == (
        "df.idempotency.billing",
        partition_for_key(b"invoice:7", 6),  # where the job's exec records go
    )
    schema = hdr.header(record.headers, hdr.SCHEMA)
    assert schema == b"dueflow.IdempotencyRecord/3"
    assert decode_key_record(record.value or b"", schema) == ("cancelled", T, T + 1_800_000)
    version = codec.parse_schema_header(hdr.header(outcome.headers, hdr.SCHEMA), expected="outcome")
    got = codec.decode("outcome", outcome.value or b"", writer_version=version)
    assert (got["state"], got["due_ms"], got["job_id"]) == ("rescheduled", T + 1_800_000, "j")


def test_the_moved_timer_is_the_same_job_due_at_the_new_time() -> None:
    geometry = WheelGeometry()
    placer = TimerPlacer(geometry)
    job = Job("j", "billing", "charge", b'{"a":1}', T + 600_000, "invoice:7", T, max_attempts=5)
    trace = [(hdr.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]
    original = timer_record(job, now_ms=T, placer=placer, trace_headers=trace)
    exec_headers = [*original.headers, (hdr.FIRED, b"1"), (hdr.SOURCE, b"t:1:2")]
    moved = moved_timer(original.value, exec_headers, due_ms=T + 7_200_000, now_ms=T, placer=placer)
    assert decode_job(moved.value) == replace(job, due_ms=T + 7_200_000)
    assert moved.key == original.key == b"invoice:7"
    assert hdr.header(moved.headers, hdr.DUE) == b"%d" % (T + 7_200_000)
    assert hdr.header(moved.headers, hdr.TRACEPARENT) == trace[0][1]  # one trace
    assert hdr.header(moved.headers, hdr.FIRED) is None  # a timer again
    assert moved.partition == placer.partition(due_ms=T + 7_200_000, now_ms=T, spread=0)
