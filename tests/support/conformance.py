"""The conformance vectors of every dueflow writer, made by the Python SDK's own code.

``clients/conformance/vectors.json`` is a table of inputs and the exact
records dueflow's Python code writes for them: wheel placement, murmur2
partitions, UUIDv7 job ids, whole schedule/cancel/reschedule records (topic,
partition, key, value, headers), the Confluent-framed variant, and inputs
that must be refused (with the field the error names). The Java, Go and
Node clients run the same table in their own test frameworks, and
``tests/unit/test_conformance_vectors.py`` checks that the committed file is
what this module makes today. Regenerate after a change to the wire format::

    .venv/bin/python -m tests.support.conformance --write
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dueflow.config import QueueSpec
from dueflow.errors import InvalidInput
from dueflow.ids import uuid7_head, uuid7_tails
from dueflow.kafka.topic_limits import default_limits_of
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord, cancel_records
from dueflow.producers.core import DEFAULT_MAX_MESSAGE_BYTES
from dueflow.producers.outcomes import scheduled_outcome
from dueflow.producers.rescheduling import moved_timer, reschedule_records
from dueflow.producers.steering_commands import command_records, verdict_of
from dueflow.producers.targets import Target
from dueflow.records import codec
from dueflow.records.job_request import (
    MAX_DUE_MS,
    JobRequest,
    JobRules,
    PreparedJob,
    encode_payload,
    prepare_job,
)
from dueflow.records.size_budget import JobBudget, job_shape
from dueflow.records.timer_record import TimerPlacer, TimerRecord, framed_timer, timer_record
from dueflow.rules.partitioning import partition_for_key
from dueflow.rules.wheel import WheelGeometry, WheelLevel, place_timer
from dueflow.steering_model import Command

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "clients" / "conformance" / "vectors.json"

PREFIX = "dueflow"
QUEUES = frozenset({"default", "billing", "emails"})
NOW_MS = 1_900_000_000_123  # 2030-03-17T17:46:40.123Z
DAY_MS = 86_400_000

WHEELS: dict[str, WheelGeometry] = {
    "default": WheelGeometry(),
    "small": WheelGeometry(
        levels=(WheelLevel(10, 1_000), WheelLevel(10, 5_000)),
        near_partitions=2,
        near_window_ms=1_500,
        lookahead_ms=200,
    ),
    "sharded": WheelGeometry(shards=4),
}

# Keys chosen for their bytes: ASCII, non-ASCII (CRC of UTF-8), 4-byte code points.
KEYS = ["job-1", "order:42/charge", "clé-été", "ключ-😀", "k"]


def wheel_doc(geo: WheelGeometry) -> dict[str, Any]:
    return {
        "near_partitions": geo.near_partitions,
        "near_window_ms": geo.near_window_ms,
        "lookahead_ms": geo.lookahead_ms,
        "levels": [[lv.slots, lv.width_ms] for lv in geo.levels],
        "shards": geo.shards,
    }


def placement_cases() -> list[dict[str, Any]]:
    """Due times around every boundary of each wheel, for several keys."""
    out: list[dict[str, Any]] = []
    for name, geo in WHEELS.items():
        deltas = {-60_000, -1, 0, 1, geo.near_window_ms, geo.near_window_ms + 1}
        for k in range(len(geo.levels)):
            reach = geo.reach_ms(k)
            deltas |= {reach - 1, reach, reach + 1}
        deltas |= {geo.levels[-1].slots * geo.levels[-1].width_ms * 3, MAX_DUE_MS - NOW_MS}
        # due exactly at a slot's start, and the last ms before it
        width0 = geo.levels[0].width_ms
        at_slot = (NOW_MS // width0 + 5) * width0 - NOW_MS
        deltas |= {at_slot, at_slot - 1}
        placer = TimerPlacer(geo)
        for key in KEYS:
            raw = key.encode()
            spread = zlib.crc32(raw)
            for delta in sorted(deltas):
                due = NOW_MS + delta
                got = place_timer(due_ms=due, now_ms=NOW_MS, geometry=geo, spread=spread)
                fast = placer.partition(due_ms=due, now_ms=NOW_MS, spread=spread)
                shard = (spread >> 16) % geo.shards
                partition = shard * geo.shard_partitions + got.partition
                assert fast == partition, (name, key, delta)
                out.append(
                    {
                        "wheel": name,
                        "key_hex": raw.hex(),
                        "now_ms": NOW_MS,
                        "due_ms": due,
                        "partition": partition,
                    }
                )
    return out


def murmur2_cases() -> list[dict[str, Any]]:
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b"abcde", b"abcdef", b"abcdefg"]
    keys += [k.encode() for k in KEYS]
    keys += [b"job-1\x00reschedule", bytes(range(256))]
    return [
        {"key_hex": k.hex(), "partitions": n, "partition": partition_for_key(k, n)}
        for k in keys
        for n in (1, 3, 12, 64)
    ]


def uuid7_cases() -> list[dict[str, Any]]:
    randoms = [bytes(10), bytes([0xFF] * 10), bytes(range(10)), bytes(range(200, 210))]
    return [
        {"now_ms": now, "random_hex": r.hex(), "job_id": uuid7_head(now) + uuid7_tails(r)[0]}
        for now in (0, NOW_MS, (1 << 48) - 1)
        for r in randoms
    ]


# One request in the shape the vectors use (every language reads this shape).
Req = dict[str, Any]


def _request(doc: Req) -> JobRequest:
    payload: Any
    pay = doc.get("payload", {"json": None})
    if "json" in pay:
        payload = pay["json"]
    elif "bytes_hex" in pay:
        payload = bytes.fromhex(pay["bytes_hex"])
    else:
        fill = pay["bytes_fill"]
        payload = bytes([fill["byte"]]) * fill["count"]
    return JobRequest(
        doc["task"],
        payload,
        run_at=None if "run_at_ms" not in doc else _instant(doc["run_at_ms"]),
        delay=None if "delay_ms" not in doc else timedelta(milliseconds=doc["delay_ms"]),
        queue=doc.get("queue", "default"),
        job_id=doc.get("job_id"),
        idempotency_key=doc.get("idempotency_key"),
        max_attempts=doc.get("max_attempts"),
        timeout=None if "timeout_ms" not in doc else timedelta(milliseconds=doc["timeout_ms"]),
        labels=doc.get("labels"),
    )


def _instant(ms: int) -> datetime | str:
    """A datetime, or for a time past the last one a datetime holds, ISO text
    (which the SDK refuses naming ``run_at``, as it does a later datetime)."""
    if ms > MAX_DUE_MS:
        return "10000-01-01T00:00:00Z"
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def prepared(doc: Req, *, now_ms: int, random_hex: str | None) -> PreparedJob:
    """The job the SDK builds for request ``doc`` (an id drawn from ``random_hex``)."""

    def new_id(now: int) -> str:
        assert random_hex is not None, "a request without job_id needs random_hex"
        return uuid7_head(now) + uuid7_tails(bytes.fromhex(random_hex))[0]

    return prepare_job(_request(doc), now_ms=now_ms, rules=JobRules(QUEUES), new_job_id=new_id)


def record_doc(rec: OutgoingRecord | TimerRecord, topic: str | None = None) -> dict[str, Any]:
    return {
        "topic": topic if topic is not None else rec.topic,  # type: ignore[union-attr]
        "partition": rec.partition,
        "key_hex": rec.key.hex(),
        "value_hex": None if rec.value is None else rec.value.hex(),
        "headers": [[k, v.decode()] for k, v in rec.headers],
    }


def schedule_doc(case: Req) -> dict[str, Any]:
    """A schedule case and the records the SDK writes for it: the timer, then the
    ``scheduled`` outcome (the SDK's default)."""
    names = TopicNames(PREFIX)
    geo = WHEELS[case["wheel"]]
    job = prepared(case["request"], now_ms=case["now_ms"], random_hex=case.get("random_hex"))
    timer = timer_record(job, now_ms=case["now_ms"], placer=TimerPlacer(geo))
    outcome = scheduled_outcome(
        names,
        job_id=job.job_id,
        queue=job.queue,
        task=job.task,
        idempotency_key=job.idempotency_key,
        due_ms=job.due_ms,
        at_ms=case["now_ms"],
    )
    request = case["request"]
    if "json" in request.get("payload", {}):  # for writers that take JSON text
        request = {**request, "payload": {**request["payload"], "json_text": job.payload.decode()}}
    expected: dict[str, Any] = {
        "job_id": job.job_id,
        "due_ms": job.due_ms,
        "content_hash": job.content_hash,
        "records": [record_doc(timer, names.timers), record_doc(outcome)],
    }
    if "schema_id" in case:  # the registry option: only the job value is framed
        expected["records"][0] = record_doc(framed_timer(timer, case["schema_id"]), names.timers)
    return {**case, "request": request, "expected": expected}


SCHEDULE_CASES: list[Req] = [
    {
        "name": "json payload after a delay, caller's job id",
        "wheel": "default",
        "now_ms": NOW_MS,
        "request": {
            "task": "send_email",
            "queue": "emails",
            "payload": {"json": {"to": "a@example.com", "n": 3}},
            "delay_ms": 600_000,
            "job_id": "job-1",
        },
    },
    {
        "name": "bytes payload at a time, idempotency key, attempts, timeout, labels",
        "wheel": "default",
        "now_ms": NOW_MS,
        "request": {
            "task": "billing:charge",
            "queue": "billing",
            "payload": {"bytes_hex": "00ff10ce"},
            "run_at_ms": NOW_MS + 3 * 3_600_000 + 17,
            "job_id": "charge-42",
            "idempotency_key": "order:42/charge",
            "max_attempts": 7,
            "timeout_ms": 30_000,
            "labels": {
                "team": "billing",
                "région": "eu",
                "😀": "4-byte",
                "\uff5a": "fullwidth",
                "9": "a digit",
                "10": "digits",
            },
        },
    },
    {
        "name": "UUIDv7 job id drawn by the client, due now (near partition)",
        "wheel": "default",
        "now_ms": NOW_MS,
        "random_hex": "0123456789abcdef0123",
        "request": {"task": "reports/daily", "payload": {"json": [1, 2, 3]}, "delay_ms": 0},
    },
    {
        "name": "sharded wheel, non-ASCII key",
        "wheel": "sharded",
        "now_ms": NOW_MS,
        "request": {
            "task": "t",
            "payload": {"json": {"b": "ü", "a": None, "c": {"z": True, "y": 1.5}}},
            "delay_ms": 90_000,
            "job_id": "j-ключ",
            "idempotency_key": "ключ-😀",
        },
    },
    {
        "name": "small wheel, level 1",
        "wheel": "small",
        "now_ms": NOW_MS,
        "request": {
            "task": "t",
            "payload": {"json": "text"},
            "delay_ms": 20_000,
            "job_id": "small-1",
        },
    },
    {
        "name": "beyond the top level (100 days)",
        "wheel": "default",
        "now_ms": NOW_MS,
        "request": {
            "task": "t",
            "payload": {"json": {}},
            "delay_ms": 100 * DAY_MS,
            "job_id": "far-1",
        },
    },
    {
        "name": "payload over 64 bytes and key of 255 code points (4-byte UTF-8 each)",
        "wheel": "default",
        "now_ms": NOW_MS,
        "request": {
            "task": "t",
            "payload": {"bytes_hex": bytes(range(200)).hex()},
            "delay_ms": 5_000,
            "job_id": "long-1",
            "idempotency_key": "😀" * 255,
        },
    },
    {
        "name": "due in the past: near partition, due kept",
        "wheel": "default",
        "now_ms": NOW_MS,
        "request": {
            "task": "t",
            "payload": {"json": None},
            "run_at_ms": NOW_MS - 3_600_000,
            "job_id": "late-1",
        },
    },
    {
        "name": "registry option: Confluent framing, schema id 42",
        "wheel": "default",
        "now_ms": NOW_MS,
        "schema_id": 42,
        "request": {
            "task": "send_email",
            "payload": {"json": {"to": "b@example.com"}},
            "delay_ms": 10_000,
            "job_id": "framed-1",
        },
    },
]

INVALID_CASES: list[Req] = [
    {"name": "task with a space", "request": {"task": "send email"}, "field": "task"},
    {"name": "empty task", "request": {"task": ""}, "field": "task"},
    {"name": "task of 201 chars", "request": {"task": "t" * 201}, "field": "task"},
    {"name": "empty job id", "request": {"task": "t", "job_id": ""}, "field": "job_id"},
    {
        "name": "job id of 256 chars",
        "request": {"task": "t", "job_id": "j" * 256},
        "field": "job_id",
    },
    {
        "name": "key of 256 code points",
        "request": {"task": "t", "job_id": "j", "idempotency_key": "😀" * 256},
        "field": "idempotency_key",
    },
    {
        "name": "empty idempotency key",
        "request": {"task": "t", "idempotency_key": ""},
        "field": "idempotency_key",
    },
    {"name": "negative delay", "request": {"task": "t", "delay_ms": -1}, "field": "delay"},
    {
        "name": "delay past the last due time",
        "request": {"task": "t", "delay_ms": MAX_DUE_MS - NOW_MS + 1},
        "field": "delay",
    },
    {
        "name": "run_at past the last due time",
        "request": {"task": "t", "run_at_ms": MAX_DUE_MS + 1},
        "field": "run_at",
    },
    {
        "name": "both run_at and delay",
        "request": {"task": "t", "run_at_ms": NOW_MS, "delay_ms": 1},
        "field": "delay",
    },
    {"name": "zero attempts", "request": {"task": "t", "max_attempts": 0}, "field": "max_attempts"},
    {
        "name": "attempts past an Avro int",
        "request": {"task": "t", "max_attempts": 1 << 31},
        "field": "max_attempts",
    },
    {"name": "zero timeout", "request": {"task": "t", "timeout_ms": 0}, "field": "timeout"},
    {
        "name": "queue that is not a queue name",
        "request": {"task": "t", "queue": "no such queue"},
        "field": "queue",
    },
    {
        "name": "timer record over max.message.bytes",
        "request": {
            "task": "t",
            "job_id": "big-1",
            "payload": {"bytes_fill": {"byte": 7, "count": DEFAULT_MAX_MESSAGE_BYTES}},
        },
        "field": "payload",
    },
]


def invalid_doc(case: Req) -> dict[str, Any]:
    """Check that the SDK refuses ``case`` naming its field."""
    try:
        job = prepared(case["request"], now_ms=NOW_MS, random_hex="00" * 10)
        record = timer_record(job, now_ms=NOW_MS, placer=TimerPlacer(WheelGeometry()))
        # the size budget of a cluster with the broker's default limits
        budget = JobBudget(default_limits_of(TopicNames(PREFIX), QueueSpec(job.queue)))
        refusal = budget.refusal(
            job_shape(record.key, record.value, record.headers, payload=len(job.payload))
        )
        if refusal is not None:
            raise refusal
    except InvalidInput as exc:
        if exc.field != case["field"]:
            raise AssertionError(f"{case['name']}: the SDK names {exc.field!r}: {exc}") from exc
        return {**case, "now_ms": NOW_MS}
    raise AssertionError(f"the SDK accepts {case['name']!r}")


def _target(job: PreparedJob) -> Target:
    return Target(
        job.job_id,
        job.queue,
        job.idempotency_key,
        True,
        "scheduled",
        job.due_ms,
        job.task,
        None,
        job.content_hash,
        True,
    )


def cancel_doc(case: Req) -> dict[str, Any]:
    """The records that cancel the job of schedule case ``case["schedule"]`` (a name)."""
    sched = _schedule_case(case["schedule"])
    job = prepared(sched["request"], now_ms=sched["now_ms"], random_hex=sched.get("random_hex"))
    records = cancel_records(
        names=TopicNames(PREFIX),
        job_id=job.job_id,
        queue=job.queue,
        idempotency_key=job.idempotency_key,
        at_ms=case["at_ms"],
        task=job.task,
        due_ms=job.due_ms,
        content_hash=job.content_hash,
        partitions=case["partitions"],
    )
    return {**case, "expected": {"records": [record_doc(r) for r in records]}}


def reschedule_doc(case: Req) -> dict[str, Any]:
    """The records that move the job of ``case["schedule"]`` to ``new_due_ms``: the new
    timer, the reschedule record (version 3, key + ``\\x00reschedule``), the outcome."""
    sched = _schedule_case(case["schedule"])
    geo = WHEELS[sched["wheel"]]
    placer = TimerPlacer(geo)
    job = prepared(sched["request"], now_ms=sched["now_ms"], random_hex=sched.get("random_hex"))
    old = timer_record(job, now_ms=sched["now_ms"], placer=placer)
    timer = moved_timer(
        old.value, old.headers, due_ms=case["new_due_ms"], now_ms=case["at_ms"], placer=placer
    )
    records = reschedule_records(
        TopicNames(PREFIX),
        _target(job),
        due_ms=case["new_due_ms"],
        at_ms=case["at_ms"],
        partitions=case["partitions"],
    )
    docs = [record_doc(timer, TopicNames(PREFIX).timers), *(record_doc(r) for r in records)]
    return {**case, "expected": {"records": docs}}


def _schedule_case(name: str) -> Req:
    return next(c for c in SCHEDULE_CASES if c["name"] == name)


LATER_MS = NOW_MS + 60_000
CANCEL_CASES: list[Req] = [
    {
        "name": "cancel a job by its key, 12 partitions",
        "schedule": ("json payload after a delay, caller's job id"),
        "at_ms": LATER_MS,
        "partitions": 12,
    },
    {
        "name": "cancel a job with a non-ASCII key, 5 partitions",
        "schedule": ("sharded wheel, non-ASCII key"),
        "at_ms": LATER_MS,
        "partitions": 5,
    },
]
RESCHEDULE_CASES: list[Req] = [
    {
        "name": "move a job later (level 2)",
        "schedule": ("json payload after a delay, caller's job id"),
        "new_due_ms": NOW_MS + 5 * 3_600_000,
        "at_ms": LATER_MS,
        "partitions": 12,
    },
    {
        "name": "move a job to now (near partition), key with a separate idempotency key",
        "schedule": ("bytes payload at a time, idempotency key, attempts, timeout, labels"),
        "new_due_ms": LATER_MS,
        "at_ms": LATER_MS,
        "partitions": 3,
    },
]


def _payload(doc: Req) -> tuple[bytes, str]:
    """The bytes and content type of a payload in the vectors' shape, as the SDK's
    ``update`` encodes them."""
    if "json" in doc:
        return encode_payload(doc["json"])
    return encode_payload(bytes.fromhex(doc["bytes_hex"]))


def command_doc(case: Req) -> dict[str, Any]:
    """The command record that steers ``case["job"]`` (job_id, idempotency_key, queue):
    op ``cancel``, ``move`` or ``patch``, with a fixed ``command_id`` and ``at_ms``."""
    job = case["job"]
    payload, content_type = (None, None)
    if "payload" in case:
        payload, content_type = _payload(case["payload"])
    cmd = Command(
        command_id=case["command_id"],
        op=case["op"],
        job_id=job["job_id"],
        idempotency_key=job["idempotency_key"],
        queue=job["queue"],
        at_ms=case["at_ms"],
        by=case.get("by"),
        expect_version=case.get("expect_version"),
        known_due_ms=case.get("known_due_ms"),
        due_ms=case.get("due_ms"),
        payload=payload,
        content_type=content_type,
    )
    (record,) = command_records(TopicNames(PREFIX), cmd, partitions=case["partitions"])
    out = dict(case)
    if "payload" in case and "json" in case["payload"]:  # for writers that take JSON text
        out["payload"] = {**case["payload"], "json_text": payload.decode()}  # type: ignore[union-attr]
    return {**out, "expected": {"records": [record_doc(record)]}}


COMMAND_ID = "0190a1b2c3d47e5f8a9b0c1d2e3f4a5b"  # a UUIDv7 as 32 hex digits
FAR_MS = 4_955_000_000_000  # 2127-01-07: far beyond any retention
COMMAND_CASES: list[Req] = [
    {
        "name": "cancel, 12 partitions",
        "op": "cancel",
        "job": {"job_id": "job-1", "idempotency_key": "job-1", "queue": "emails"},
        "command_id": COMMAND_ID,
        "at_ms": LATER_MS,
        "known_due_ms": NOW_MS + 600_000,
        "partitions": 12,
    },
    {
        "name": "cancel by id alone (no known due time), caller-given command id",
        "op": "cancel",
        "job": {"job_id": "far-1", "idempotency_key": "far-1", "queue": "default"},
        "command_id": "caller-given-id",
        "at_ms": LATER_MS,
        "partitions": 3,
    },
    {
        "name": "move a job due in 2127 later, separate idempotency key",
        "op": "move",
        "job": {"job_id": "charge-42", "idempotency_key": "order:42/charge", "queue": "billing"},
        "command_id": COMMAND_ID,
        "at_ms": LATER_MS,
        "known_due_ms": FAR_MS,
        "due_ms": FAR_MS + DAY_MS,
        "partitions": 3,
    },
    {
        "name": "patch a JSON payload and the due time, non-ASCII key, who, expected version",
        "op": "patch",
        "job": {"job_id": "j-ключ", "idempotency_key": "ключ-😀", "queue": "default"},
        "command_id": COMMAND_ID,
        "at_ms": LATER_MS,
        "known_due_ms": NOW_MS + 90_000,
        "due_ms": NOW_MS + 3_600_000,
        "payload": {"json": {"b": "ü", "a": [1, 2.5], "c": None}},
        "expect_version": "0190a1b2c3d47e5f8a9b0c1d2e3f4a5a",
        "by": "ops@host",
        "partitions": 5,
    },
    {
        "name": "patch a bytes payload, due time unchanged",
        "op": "patch",
        "job": {"job_id": "small-1", "idempotency_key": "small-1", "queue": "default"},
        "command_id": COMMAND_ID,
        "at_ms": LATER_MS,
        "known_due_ms": NOW_MS + 20_000,
        "payload": {"bytes_hex": "00ff10ce"},
        "partitions": 64,
    },
]


def _outcome(job_id: str, state: str, **fields: Any) -> bytes:
    record = {
        "job_id": job_id,
        "queue": "default",
        "task": "t",
        "idempotency_key": job_id,
        "state": state,
        "attempt": 0,
        "at_ms": LATER_MS + 5,
        **fields,
    }
    return codec.encode("outcome", record, version=3)


def verdict_doc(case: Req) -> dict[str, Any]:
    """An outcome record a client may read while it waits for the verdict on
    ``command_id`` of job ``job_id``, and the verdict in it (null: not this one)."""
    from dueflow.producers.verdicts import outcome_verdict

    value = _outcome(case["key"], case["state"], **case.get("fields", {}))
    headers = [("df-schema", case.get("schema", "dueflow.Outcome/3").encode())]
    found = outcome_verdict(
        case["key"].encode(), value, headers, case["job_id"], case["command_id"]
    )
    if found is not None:
        assert found == verdict_of(codec.decode("outcome", value, writer_version=3))
    expected = None
    if found is not None:
        expected = {
            "state": found.state,
            "code": found.code,
            "reason": found.reason,
            "due_ms": found.due_ms,
            "version": found.version,
        }
    record = {
        "key_hex": case["key"].encode().hex(),
        "value_hex": value.hex(),
        "headers": [[k, v.decode()] for k, v in headers],
    }
    return {
        "name": case["name"],
        "job_id": case["job_id"],
        "command_id": case["command_id"],
        "record": record,
        "expected": expected,
    }


VERDICT_CASES: list[Req] = [
    {
        "name": "cancelled",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "cancelled",
        "fields": {"command_id": COMMAND_ID, "version": ""},
    },
    {
        "name": "rescheduled, with the new due time and version",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "rescheduled",
        "fields": {"command_id": COMMAND_ID, "due_ms": FAR_MS, "version": COMMAND_ID},
    },
    {
        "name": "updated",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "updated",
        "fields": {"command_id": COMMAND_ID, "version": COMMAND_ID},
    },
    {
        "name": "refused: code and reason",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "refused",
        "fields": {
            "command_id": COMMAND_ID,
            "error": "started: the job is running: only a job that has not started can be moved",
        },
    },
    {
        "name": "another command's verdict: not this one",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "cancelled",
        "fields": {"command_id": "another"},
    },
    {
        "name": "another job's outcome on the partition: not this one",
        "job_id": "job-1",
        "key": "job-2",
        "command_id": COMMAND_ID,
        "state": "cancelled",
        "fields": {"command_id": COMMAND_ID},
    },
    {
        "name": "an outcome without a command (a worker's succeeded): not this one",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "succeeded",
    },
    {
        "name": "an Outcome/2 record (no command id in that version): not this one",
        "job_id": "job-1",
        "key": "job-1",
        "command_id": COMMAND_ID,
        "state": "cancelled",
        "schema": "dueflow.Outcome/2",
    },
]


def build() -> dict[str, Any]:
    """Every vector, from the Python code as it is now."""
    return {
        "about": (
            "dueflow conformance vectors, generated by tests/support/conformance.py from the "
            "Python SDK (do not edit by hand). docs/wire-format.md is the contract; "
            "clients/conformance/README.md says how each writer runs this table."
        ),
        "prefix": PREFIX,
        "queues": sorted(QUEUES),
        "max_record_bytes": DEFAULT_MAX_MESSAGE_BYTES,
        "max_due_ms": MAX_DUE_MS,
        "wheels": {name: wheel_doc(geo) for name, geo in WHEELS.items()},
        "placement": placement_cases(),
        "murmur2": murmur2_cases(),
        "uuid7": uuid7_cases(),
        "schedule": [schedule_doc(c) for c in SCHEDULE_CASES],
        "invalid": [invalid_doc(c) for c in INVALID_CASES],
        "cancel": [cancel_doc(c) for c in CANCEL_CASES],
        "reschedule": [reschedule_doc(c) for c in RESCHEDULE_CASES],
        "command": [command_doc(c) for c in COMMAND_CASES],
        "verdict": [verdict_doc(c) for c in VERDICT_CASES],
    }


def render(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help=f"write {VECTORS}")
    args = parser.parse_args(argv)
    text = render(build())
    if args.write:
        VECTORS.parent.mkdir(parents=True, exist_ok=True)
        VECTORS.write_text(text)
        print(f"wrote {VECTORS.relative_to(ROOT)}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
