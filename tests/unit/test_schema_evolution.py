"""Rolling upgrades: records of the first released schemas (schemas/v1) are read
by the current schemas, and records of the current schemas by v1 readers.

Each schema gets a realistic record. When a schema changes, its current file
moves ahead of v1 and this test proves the change is compatible both ways
(new fields need defaults; removed fields need defaults in the old version).
"""

from __future__ import annotations

import io
from importlib import resources
from typing import Any

import fastavro
import pytest

from dueflow.records import codec

NOW = 1_800_000_000_000
BACKOFF = {
    "kind": "exponential",
    "base_ms": 1000,
    "max_ms": 60_000,
    "multiplier": 2.0,
    "jitter": True,
}

RECORDS: dict[str, dict[str, Any]] = {
    "job": {
        "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
        "queue": "billing",
        "task": "charge_card",
        "payload": b'{"amount":1299,"currency":"EUR"}',
        "content_type": "application/json",
        "due_ms": NOW + 60_000,
        "idempotency_key": "invoice:42",
        "max_attempts": 5,
        "backoff": BACKOFF,
        "timeout_ms": 30_000,
        "jitter_ms": 5_000,
        "created_ms": NOW,
        "trace": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        "schedule_id": None,
        "schedule_version": None,
        "content_hash": "5d41402abc4b2a76b9719d911017c592",
        "labels": {"tenant": "acme"},
    },
    "schedule": {
        "schedule_id": "nightly-report",
        "cron": "0 3 * * *",
        "timezone": "Europe/Paris",
        "queue": "default",
        "task": "build_report",
        "payload": b'{"kind":"daily"}',
        "content_type": "application/json",
        "jitter_ms": 60_000,
        "misfire": "fire_once",
        "start_ms": NOW,
        "end_ms": None,
        "version": NOW,
        "paused": False,
        "max_attempts": 3,
        "backoff": BACKOFF,
        "timeout_ms": 600_000,
        "created_ms": NOW,
        "updated_ms": NOW,
        "labels": {"team": "data"},
        "overlap": "buffer_one",  # version 2
    },
    "outcome": {
        "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
        "queue": "billing",
        "task": "charge_card",
        "idempotency_key": "invoice:42",
        "state": "retrying",
        "attempt": 2,
        "at_ms": NOW + 61_000,
        "due_ms": NOW + 60_000,
        "duration_ms": 12.5,
        "error_type": "TimeoutError",
        "error": "card network timed out",
        "worker": "worker-1:4242",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "schedule_id": None,
        # version 3
        "result": b'{"charged":1299}',
        "result_error": None,
        "progress": 0.5,
        "progress_detail": b'{"step":"capture"}',
        "exec_partition": 3,
        "version": "0190f0c2a1b27c3d8e9f00112233ccdd",
        "command_id": "0190f0c2a1b27c3d8e9f00112233ccdd",
        "first_job_id": None,
        "group_id": "invoices-2026-12",
    },
    "dead_letter": {
        "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
        "queue": "billing",
        "task": "charge_card",
        "idempotency_key": "invoice:42",
        "reason": "exhausted",
        "error_type": "TimeoutError",
        "error_message": "card network timed out",
        "traceback": "Traceback (most recent call last): ...",
        "attempts": 5,
        "first_failure_ms": NOW + 61_000,
        "last_failure_ms": NOW + 400_000,
        "dead_ms": NOW + 400_001,
        "original_topic": "dueflow.exec.billing",
        "original_partition": 3,
        "original_offset": 1234,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "job_value": b"\x02\x04...",
        "job_headers": {"df-attempt": b"5"},
    },
    "idempotency": {
        "idempotency_key": "invoice:42",
        "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
        "state": "cancelled",
        "at_ms": NOW + 1_000,
        "attempts": 0,
        "content_hash": "5d41402abc4b2a76b9719d911017c592",
        "run_only_due_ms": NOW + 3_600_000,  # version 3: a reschedule
    },
    "quarantined": {
        "reason": "df-due header is not a number",
        "component": "emitter",
        "source_topic": "dueflow.timers",
        "source_partition": 7,
        "source_offset": 99,
        "at_ms": NOW,
        "key": b"invoice:42",
        "value": b"\x00\x01",
        "headers": {"df-due": b"soon"},
    },
    "queue": {
        "name": "billing",
        "partitions": 12,
        "retry_tiers_ms": [1_000, 10_000, 60_000],
        "idempotency_retention_ms": 7 * 24 * 3_600_000,
        "rate_limit_per_s": 50.0,
        "created_ms": NOW,
        "created_by": "ada@ops-1",
    },
    "command": {
        "command_id": "0190f0c2a1b27c3d8e9f00112233ccdd",
        "op": "patch",
        "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
        "idempotency_key": "invoice:42",
        "queue": "billing",
        "at_ms": NOW,
        "by": "ada@ops-1",
        "expect_version": "",
        "known_due_ms": NOW + 60_000,
        "due_ms": NOW + 120_000,
        "payload": b'{"amount":1500,"currency":"EUR"}',
        "content_type": "application/json",
        "job": None,
        "job_schema": None,
        "unique": {
            "key": "invoice:42",
            "window_ms": 60_000,
            "until": "end",
            "on_duplicate": "return",
            "extend": False,
        },
        "group": {"group_id": "g1", "size": 2, "members": [b"\x02"], "then": None},
        "member": None,
    },
    "steering_state": {
        "job": {
            "job_id": "0190f0c2a1b27c3d8e9f00112233aabb",
            "idempotency_key": "invoice:42",
            "current": "",
            "current_due_ms": NOW + 60_000,
            "cancelled": False,
            "ended": None,
            "outstanding": [{"token": "", "due_ms": NOW + 60_000}],
            "patch": {
                "token": "0190f0c2a1b27c3d8e9f00112233ccdd",
                "due_ms": NOW + 120_000,
                "payload": b'{"amount":1500}',
                "content_type": "application/json",
                "command_id": "0190f0c2a1b27c3d8e9f00112233ccdd",
            },
            "exec_partition": 3,
            "last_command_id": "0190f0c2a1b27c3d8e9f00112233ccdd",
            "updated_ms": NOW,
        },
        "unique": None,
        "group": None,
    },
}


def test_every_schema_has_a_first_release_and_a_record_here() -> None:
    root = resources.files("dueflow.schemas")
    for name, (_full, filename, _version) in codec.SCHEMAS.items():
        assert (root / "v1" / filename).is_file(), f"v1/{filename} is missing"
        assert name in RECORDS, f"add a realistic {name} record to this test"


def _write(schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _read(data: bytes, writer: Any, reader: Any) -> dict[str, Any]:
    out = fastavro.schemaless_reader(io.BytesIO(data), writer, reader)
    assert isinstance(out, dict)
    return out


def _shared(record: dict[str, Any], schema: Any) -> dict[str, Any]:
    names = {f["name"] for f in schema["fields"]}
    return {k: v for k, v in record.items() if k in names}


@pytest.mark.parametrize("name", sorted(codec.SCHEMAS))
def test_current_reader_reads_v1_records(name: str) -> None:
    v1 = fastavro.parse_schema(codec.schema_json(name, 1), named_schemas={})
    current = codec.parsed_schema(name)
    old_record = _shared(RECORDS[name], codec.schema_json(name, 1))
    got = _read(_write(v1, old_record), v1, current)
    for key, value in old_record.items():
        if key in got:
            assert got[key] == value, key
    # what the codec does with a df-schema header naming version 1
    assert codec.decode(name, _write(v1, old_record), writer_version=1) == got


@pytest.mark.parametrize("name", sorted(codec.SCHEMAS))
def test_v1_reader_reads_current_records(name: str) -> None:
    v1 = fastavro.parse_schema(codec.schema_json(name, 1), named_schemas={})
    current = codec.parsed_schema(name)
    record = RECORDS[name]
    got = _read(codec.encode(name, record), current, v1)
    for key, value in _shared(record, codec.schema_json(name, 1)).items():
        assert got[key] == value, key


@pytest.mark.parametrize("name", sorted(codec.SCHEMAS))
def test_current_round_trip(name: str) -> None:
    assert codec.decode(name, codec.encode(name, RECORDS[name])) == RECORDS[name]


def test_the_check_catches_an_incompatible_change() -> None:
    """A new field without a default would break old records: resolution fails."""
    changed = codec.schema_json("idempotency")
    changed["fields"] = [*changed["fields"], {"name": "owner", "type": "string"}]
    broken = fastavro.parse_schema(changed, named_schemas={})
    v1 = fastavro.parse_schema(codec.schema_json("idempotency", 1), named_schemas={})
    old = _write(v1, RECORDS["idempotency"])
    with pytest.raises(fastavro.read.SchemaResolutionError):
        _read(old, v1, broken)
    # with a default it is compatible both ways
    changed["fields"][-1]["default"] = ""
    fixed = fastavro.parse_schema(changed, named_schemas={})
    assert _read(old, v1, fixed)["owner"] == ""
    assert _read(_write(fixed, {**RECORDS["idempotency"], "owner": "x"}), fixed, v1)


@pytest.mark.parametrize(
    "state", ["rescheduled", "expired", "skipped", "updated", "refused", "deduplicated"]
)
def test_a_reader_of_version_1_reads_the_new_outcome_states_as_unknown(state: str) -> None:
    """Versions 2 and 3 add states; the enum's default makes them readable by version 1."""
    v1 = fastavro.parse_schema(codec.schema_json("outcome", 1), named_schemas={})
    data = codec.encode("outcome", {**RECORDS["outcome"], "state": state})
    assert _read(data, codec.parsed_schema("outcome"), v1)["state"] == "unknown"
    assert codec.decode("outcome", data)["state"] == state


@pytest.mark.parametrize("state", ["updated", "refused", "deduplicated"])
def test_a_reader_of_version_2_reads_version_3_outcomes(state: str) -> None:
    """The status views of the release before read what workers write now: the new
    fields are skipped, the new states are unknown, the rest is kept."""
    v2 = fastavro.parse_schema(codec.schema_json("outcome", 2), named_schemas={})
    record = {**RECORDS["outcome"], "state": state}
    got = _read(codec.encode("outcome", record), codec.parsed_schema("outcome"), v2)
    assert got["state"] == "unknown"
    assert {k: got[k] for k in got if k != "state"} == {
        k: v for k, v in record.items() if k in got and k != "state"
    }


def test_version_3_outcomes_are_version_2_bytes_followed_by_the_new_fields() -> None:
    """What lets the hand-written encoders append version 3's fields."""
    from dueflow.records import worker_codec as fast

    v2_part = _shared(RECORDS["outcome"], codec.schema_json("outcome", 2))
    full = codec.encode("outcome", RECORDS["outcome"])
    assert full.startswith(codec.encode("outcome", v2_part, version=2))
    assert fast.encode_outcome_v3(**RECORDS["outcome"]) == full


def test_records_that_need_nothing_new_are_written_as_version_1() -> None:
    """A reader resolves only the versions it knows: what version 1 can hold is written
    as version 1, byte for byte the hand-written encoders' (what workers write)."""
    from dueflow.records import worker_codec as fast

    key = {k: v for k, v in RECORDS["idempotency"].items() if k != "run_only_due_ms"}
    assert codec.encode("idempotency", key, version=1) == fast.encode_key_state(**key)
    assert codec.schema_header("idempotency", 1) == fast.IDEMPOTENCY_V1
    v1_outcome = _shared(RECORDS["outcome"], codec.schema_json("outcome", 1))
    assert codec.encode("outcome", v1_outcome, version=1) == fast.encode_outcome(**v1_outcome)
    assert codec.schema_header("outcome", 1) == fast.OUTCOME_V1
