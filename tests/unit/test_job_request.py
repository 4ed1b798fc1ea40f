"""Every request field is checked before anything is written (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.errors import InvalidInput
from dueflow.model import Backoff, BackoffKind
from dueflow.records.job_request import (
    JobRequest,
    JobRules,
    PreparedJob,
    as_request,
    content_hash,
    parse_backoff,
    prepare_job,
)
from dueflow.rules.jitter import deterministic_jitter_ms

NOW = 1_800_000_000_000
RULES = JobRules(frozenset({"default", "billing"}), default_max_attempts=5)


def ids(now_ms: int) -> str:
    return "generated-id"


def prepare(req: JobRequest) -> PreparedJob:
    return prepare_job(req, now_ms=NOW, rules=RULES, new_job_id=ids)


def test_defaults() -> None:
    job = prepare(JobRequest("send_email", {"to": "a@example.com"}))
    assert job.job_id == job.idempotency_key == "generated-id"
    assert job.queue == "default"
    assert job.due_ms == job.created_ms == NOW  # no time given: due now
    assert job.payload == b'{"to":"a@example.com"}'
    assert job.content_type == "application/json"
    assert job.max_attempts == 5  # the cluster's default
    assert job.backoff is None
    assert job.timeout_ms is None
    assert job.jitter_ms == 0
    assert job.content_hash == content_hash("send_email", job.payload, "application/json")


@pytest.mark.parametrize(
    ("kwargs", "due_ms"),
    [
        ({"delay": 30}, NOW + 30_000),
        ({"delay": "1h30m"}, NOW + 5_400_000),
        ({"delay": timedelta(milliseconds=5)}, NOW + 5),
        ({"delay": 0}, NOW),
        ({"run_at": datetime(2030, 1, 1, 9, tzinfo=UTC)}, 1_893_488_400_000),
        ({"run_at": "2030-01-01T10:00:00+01:00"}, 1_893_488_400_000),
        ({"run_at": "2020-01-01T00:00:00Z"}, 1_577_836_800_000),  # past: fires at once
    ],
)
def test_due_time(kwargs: dict[str, Any], due_ms: int) -> None:
    assert prepare(JobRequest("t", **kwargs)).due_ms == due_ms


def test_bytes_payload_is_stored_as_is() -> None:
    job = prepare(JobRequest("t", b"\x00\xffraw"))
    assert job.payload == b"\x00\xffraw"
    assert job.content_type == "application/octet-stream"
    assert prepare(JobRequest("t", bytearray(b"ab"))).payload == b"ab"


def test_json_payload_is_canonical_so_equal_content_hashes_equal() -> None:
    a = prepare(JobRequest("t", {"b": 1, "a": [1, 2]}))
    b = prepare(JobRequest("t", {"a": [1, 2], "b": 1}))
    assert a.payload == b.payload == b'{"a":[1,2],"b":1}'
    assert a.content_hash == b.content_hash
    assert a.content_hash != prepare(JobRequest("other_task", {"a": [1, 2], "b": 1})).content_hash
    assert a.content_hash != prepare(JobRequest("t", {"a": [1, 2], "b": 2})).content_hash


def test_jitter_is_deterministic_per_job_id_and_never_early() -> None:
    req = JobRequest("t", delay=60, jitter="10s", job_id="job-1")
    first, again = prepare(req), prepare(req)
    assert first.due_ms == again.due_ms  # a replay places the same timer
    offset = first.due_ms - (NOW + 60_000)
    assert offset == deterministic_jitter_ms("job-1", 10_000)
    assert 0 <= offset <= 10_000
    assert first.jitter_ms == 10_000
    spread = {
        prepare(JobRequest("t", delay=60, jitter="10s", job_id=f"j{i}")).due_ms for i in range(50)
    }
    assert len(spread) > 25  # different jobs spread over the window


def test_options_are_kept() -> None:
    job = prepare(
        JobRequest(
            "t",
            queue="billing",
            job_id="j",
            idempotency_key="invoice:42",
            max_attempts=1,
            backoff="fixed:500:60000",
            timeout="30s",
            labels={"tenant": "acme"},
        )
    )
    assert (job.queue, job.job_id, job.idempotency_key, job.max_attempts) == (
        "billing",
        "j",
        "invoice:42",
        1,
    )
    assert job.backoff == Backoff(BackoffKind.FIXED, base_ms=500, max_ms=60_000)
    assert job.timeout_ms == 30_000
    assert job.labels == {"tenant": "acme"}
    assert job.to_job().idempotency_key == "invoice:42"


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"run_at": datetime(2030, 1, 1, 9)}, "run_at", "naive datetimes are rejected"),
        ({"run_at": "2030-01-01T09:00:00"}, "run_at", "has no offset"),
        ({"delay": "-5s"}, "delay", "must not be negative"),
        ({"delay": -1}, "delay", "must not be negative"),
        ({"delay": "soon"}, "delay", "'30s'"),
        ({"run_at": "2030-01-01T09:00:00Z", "delay": 5}, "delay", "either run_at or delay"),
        ({"queue": "nope"}, "queue", "one of the queues ['billing', 'default']; to create 'nope'"),
        ({"max_attempts": 0}, "max_attempts", "an integer from 1"),
        ({"max_attempts": -3}, "max_attempts", "an integer from 1"),
        ({"max_attempts": 2.0}, "max_attempts", "an integer from 1"),
        ({"max_attempts": True}, "max_attempts", "an integer from 1"),
        ({"backoff": "linear"}, "backoff", "exponential, fixed or none"),
        ({"backoff": "exponential:fast"}, "backoff", "exponential, fixed or none"),
        ({"backoff": {"kind": "cubic"}}, "backoff", "exponential, fixed or none"),
        ({"backoff": "fixed:1000:10"}, "backoff.max_ms", ">= base_ms (1000)"),
        ({"backoff": 3}, "backoff", "exponential, fixed or none"),
        ({"timeout": "0s"}, "timeout", "at least 1 ms"),
        ({"timeout": "-1s"}, "timeout", "must not be negative"),
        ({"jitter": "-1s"}, "jitter", "must not be negative"),
        ({"job_id": ""}, "job_id", "non-empty string"),
        ({"job_id": 42}, "job_id", "non-empty string"),
        ({"job_id": "x" * 256}, "job_id", "at most 255"),
        ({"idempotency_key": ""}, "idempotency_key", "non-empty string"),
        ({"payload": {1, 2}}, "payload", "JSON-serializable"),
        ({"payload": {"when": object()}}, "payload", "JSON-serializable"),
        ({"labels": {"a": 1}}, "labels", "strings to strings"),
    ],
)
def test_bad_input_names_field_value_and_accepted(
    kwargs: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        prepare(JobRequest("t", **kwargs))
    err = info.value
    assert err.field == field
    assert fragment in str(err)
    assert err.accepted  # says what would be accepted
    if field in kwargs and field != "payload":
        assert err.value == kwargs[field]


@pytest.mark.parametrize("task", ["", None, 7, "x" * 256])
def test_bad_task(task: object) -> None:
    with pytest.raises(InvalidInput) as info:
        prepare(JobRequest(task))  # type: ignore[arg-type]
    assert info.value.field == "task"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("exponential", Backoff()),
        ("none", Backoff(BackoffKind.NONE)),
        ("FIXED:2s", Backoff(BackoffKind.FIXED, base_ms=2_000)),
        ("exponential:250:1m", Backoff(base_ms=250, max_ms=60_000)),
        ({"kind": "fixed", "base_ms": 10}, Backoff(BackoffKind.FIXED, base_ms=10)),
        (Backoff(multiplier=3.0), Backoff(multiplier=3.0)),
    ],
)
def test_parse_backoff(value: Any, expected: Backoff | None) -> None:
    assert parse_backoff(value) == expected


def test_as_request_from_dict() -> None:
    assert as_request({"task": "t", "delay": 5}) == JobRequest("t", delay=5)
    with pytest.raises(InvalidInput) as info:
        as_request({"task": "t", "dealy": 5}, field="jobs[3]")
    assert info.value.field == "jobs[3].dealy"
    with pytest.raises(InvalidInput) as info:
        as_request({"payload": 1}, field="jobs[0]")
    assert info.value.field == "jobs[0].task"
    with pytest.raises(InvalidInput):
        as_request(["t"], field="jobs[0]")  # type: ignore[arg-type]


@given(
    payload=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
        max_leaves=10,
    )
)
def test_property_any_json_payload_is_accepted(payload: object) -> None:
    job = prepare(JobRequest("t", payload))
    assert job.content_type == "application/json"
    import orjson

    assert orjson.loads(job.payload) == payload
