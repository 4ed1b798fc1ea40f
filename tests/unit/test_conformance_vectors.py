"""The conformance table every writer runs (clients/conformance/vectors.json), on the
Python side: the committed file is what the SDK's code makes today, the
scheduling client's own planner (fast path included) writes those records,
the example of docs/wire-format.md places timers the same way, and readers
decode the registry-framed variant to the same job as the plain one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dueflow.config import QueueSpec, settings_from_dict
from dueflow.errors import UndecodableRecord
from dueflow.ids import uuid7_head
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.records import codec
from dueflow.records.framing import unframe_job
from dueflow.records.worker_codec import decode_job_fields
from dueflow.rules.partitioning import murmur2
from tests.support import conformance

ROOT = Path(__file__).resolve().parents[2]
VECTORS: dict[str, Any] = json.loads(conformance.VECTORS.read_text())


def test_committed_vectors_are_what_the_sdk_writes_today() -> None:
    assert conformance.VECTORS.read_text() == conformance.render(conformance.build()), (
        "clients/conformance/vectors.json is stale: run "
        "`.venv/bin/python -m tests.support.conformance --write` and commit it"
    )


def _planner(wheel: str, random_hex: str | None, schema_id: int | None = None) -> TimerPlanner:
    geo = VECTORS["wheels"][wheel]
    settings = settings_from_dict(
        {
            "topic_prefix": VECTORS["prefix"],
            "queues": ",".join(VECTORS["queues"]),
            "wheel": {k: geo[k] for k in geo},
        }
    )
    tails = b"\x00" * 10 if random_hex is None else bytes.fromhex(random_hex)
    ids = JobIds(random_bytes=lambda n: tails * (n // 10), batch=1)
    return TimerPlanner(
        settings,
        recent=RecentJobs(),
        ids=ids,
        # the registry option (producer.schema_registry_url): the registry's id
        schema_ids=None if schema_id is None else lambda: schema_id,
    )


@pytest.mark.parametrize("case", VECTORS["schedule"], ids=lambda c: c["name"])
def test_the_scheduling_client_writes_the_vector_timer(case: dict[str, Any]) -> None:
    """``Scheduler.schedule`` plans through TimerPlanner (a fast path for plain
    requests; framed values with the registry option): its record is the
    table's, byte for byte."""
    planner = _planner(case["wheel"], case.get("random_hex"), case.get("schema_id"))
    req = conformance._request(case["request"])
    planned = planner.plan(req, now_ms=case["now_ms"])
    assert isinstance(planned, PlannedTimer)
    timer = case["expected"]["records"][0]
    value = bytes.fromhex(timer["value_hex"])
    headers = [[k, v.decode()] for k, v in planned.record.headers]
    assert planned.record.value == value
    assert headers == timer["headers"]
    assert planned.record.partition == timer["partition"]
    assert planned.record.key.hex() == timer["key_hex"]
    assert planned.job.job_id == case["expected"]["job_id"]


def _doc_place_timer() -> Any:
    doc = (ROOT / "docs" / "wire-format.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "wire_format_example"}
    exec(compile(block, "docs/wire-format.md", "exec"), namespace)
    return namespace["place_timer"]


def test_the_wire_format_page_places_timers_as_the_table_says() -> None:
    place_timer = _doc_place_timer()
    for case in VECTORS["placement"]:
        geo = VECTORS["wheels"][case["wheel"]]
        wheel = {**geo, "levels": [tuple(lv) for lv in geo["levels"]]}
        got = place_timer(case["due_ms"], case["now_ms"], bytes.fromhex(case["key_hex"]), wheel)
        assert got == case["partition"], case


def test_murmur2_table_holds_signed_results() -> None:
    # the table's partitions come from the signed murmur2 masked to 31 bits
    case = next(c for c in VECTORS["murmur2"] if c["key_hex"] == "" and c["partitions"] == 64)
    assert case["partition"] == (murmur2(b"") & 0x7FFFFFFF) % 64


def test_uuid7_ids_carry_their_time() -> None:
    for case in VECTORS["uuid7"]:
        assert case["job_id"].startswith(uuid7_head(case["now_ms"]))
        assert case["job_id"][16] == "8"


FRAMED = next(c for c in VECTORS["schedule"] if "schema_id" in c)


def _framed_timer() -> tuple[bytes, bytes]:
    timer = FRAMED["expected"]["records"][0]
    headers = dict(timer["headers"])
    return bytes.fromhex(timer["value_hex"]), headers["df-schema"].encode()


def test_workers_read_a_framed_job_as_the_plain_one() -> None:
    value, schema = _framed_timer()
    assert schema == b"dueflow.Job/1+confluent"
    avro, plain, schema_id = unframe_job(value, schema)
    assert (plain, schema_id) == (b"dueflow.Job/1", 42)
    fields = decode_job_fields(value, schema)
    assert fields == decode_job_fields(avro, b"dueflow.Job/1")
    assert fields[0] == "framed-1"
    # the header decides: without it the value is read as plain Avro (and fails)
    with pytest.raises(UndecodableRecord):
        decode_job_fields(value, None)
    # the codec (DLQ tools) reads it too
    assert codec.decode_job_value(value, schema)["job_id"] == "framed-1"
    assert codec.decode_job_value(avro, b"dueflow.Job/1")["job_id"] == "framed-1"


def test_a_framed_header_on_a_plain_value_is_undecodable() -> None:
    value, schema = _framed_timer()
    avro = value[5:]
    with pytest.raises(UndecodableRecord, match="magic byte"):
        decode_job_fields(avro, schema)
    with pytest.raises(UndecodableRecord, match="magic byte"):
        codec.decode_job_value(b"\x00\x00", schema)


def test_a_reader_without_the_suffix_refuses_a_framed_value() -> None:
    """What a worker of the previous release does (upgrade workers first): its
    codec reads ``dueflow.Job/1+confluent`` as a bad header."""
    _value, schema = _framed_timer()
    with pytest.raises(UndecodableRecord, match="df-schema header"):
        codec.parse_schema_header(schema, expected="job")


def test_a_reschedule_of_a_framed_job_writes_it_again_plain() -> None:
    """``Scheduler.reschedule`` copies the job's value from its timer: a framed one
    is read, and the moved timer is written plain (a header that says so)."""
    from dueflow.producers.rescheduling import moved_timer
    from dueflow.records.timer_record import TimerPlacer
    from dueflow.rules.wheel import WheelGeometry

    value, schema = _framed_timer()
    headers = [(k, v.encode()) for k, v in FRAMED["expected"]["records"][0]["headers"]]
    assert dict(headers)["df-schema"] == schema
    now = FRAMED["now_ms"]
    moved = moved_timer(
        value, headers, due_ms=now + 60_000, now_ms=now, placer=TimerPlacer(WheelGeometry())
    )
    assert dict(moved.headers)["df-schema"] == b"dueflow.Job/1"
    job = codec.decode("job", moved.value)
    assert (job["job_id"], job["due_ms"]) == ("framed-1", now + 60_000)


def test_the_dlq_view_shows_a_framed_job() -> None:
    from dueflow.apps.ops.dlq import _job_view

    value, schema = _framed_timer()
    view = _job_view(value, {"df-schema": schema})
    assert view is not None
    assert (view["job_id"], view["payload"]) == ("framed-1", '{"to":"b@example.com"}')


class _SteeringClient:
    """What :class:`SteerCalls` needs of a Scheduler: the writes are kept."""

    def __init__(self, partitions: int, at_ms: int) -> None:
        from dueflow.kafka.topics import TopicNames

        self.names = TopicNames(VECTORS["prefix"])
        self.clock = lambda: at_ms
        self._partitions = partitions
        self.written: list[Any] = []

    def queue_spec(self, name: str) -> QueueSpec:
        return QueueSpec(name, partitions=self._partitions)

    def _write_all(self, records: list[Any], what: str) -> int:
        self.written.extend(records)
        return int(records[0].partition)


def _steer_calls(client: _SteeringClient, command_id: str) -> Any:
    from dueflow.producers.steer_calls import SteerCalls

    return SteerCalls(
        client,
        verdicts=None,  # type: ignore[arg-type]  # never waits (wait=None)
        timers=None,  # type: ignore[arg-type]  # moves later only: no timer read
        new_id=lambda _now: command_id,
        recent_partition=lambda _job_id: None,
    )


SDK_COMMANDS = [c for c in VECTORS["command"] if "by" not in c and "expect_version" not in c]


@pytest.mark.parametrize("case", SDK_COMMANDS, ids=lambda c: c["name"])
def test_the_sdks_cancel_reschedule_and_update_write_the_vector_command(
    case: dict[str, Any],
) -> None:
    """``Scheduler.cancel/reschedule/update`` on a finalized queue go through
    SteerCalls: the command record it writes is the table's, byte for byte."""
    from dueflow.producers.targets import Target

    job = case["job"]
    client = _SteeringClient(case["partitions"], case["at_ms"])
    calls = _steer_calls(client, case["command_id"])
    target = Target(
        job["job_id"],
        job["queue"],
        job["idempotency_key"],
        True,
        None,
        case.get("known_due_ms"),
        "t",
        None,
        None,
        False,
    )
    if case["op"] == "cancel":
        calls.cancel(target, wait=None)
    elif case["op"] == "move":
        calls.reschedule(target, case["due_ms"], wait=None, refusal=None)
    else:
        payload, content_type = conformance._payload(case["payload"])
        calls.update(
            target,
            payload=payload,
            content_type=content_type,
            due_ms=case.get("due_ms"),
            wait=None,
        )
    (record,) = client.written
    assert conformance.record_doc(record) == case["expected"]["records"][0]


@pytest.mark.parametrize("case", VECTORS["verdict"], ids=lambda c: c["name"])
def test_the_sdk_reads_the_vector_verdicts(case: dict[str, Any]) -> None:
    from dueflow.producers.verdicts import outcome_verdict

    rec = case["record"]
    found = outcome_verdict(
        bytes.fromhex(rec["key_hex"]),
        bytes.fromhex(rec["value_hex"]),
        [(k, v.encode()) for k, v in rec["headers"]],
        case["job_id"],
        case["command_id"],
    )
    if case["expected"] is None:
        assert found is None
    else:
        assert found is not None
        want = case["expected"]
        assert (found.state, found.code, found.reason, found.due_ms, found.version) == (
            want["state"],
            want["code"],
            want["reason"],
            want["due_ms"],
            want["version"],
        )


def test_the_command_vectors_cover_every_op_a_client_sends() -> None:
    assert {c["op"] for c in VECTORS["command"]} == {"cancel", "move", "patch"}
    assert len(SDK_COMMANDS) >= 3  # most cases go through the SDK's own call path
