"""The wire shapes of steering: command records, steering state records, queue features."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.records import codec
from dueflow.records.command import (
    MARK,
    Command,
    check_command,
    command_headers,
    command_key,
    decode_command,
    encode_command,
    target_of,
)
from dueflow.records.features import (
    QueueFeatures,
    decode_features,
    encode_features,
    fold_features,
    steering_capable,
    worker_client_id,
)
from dueflow.records.job_request import MAX_DUE_MS
from dueflow.records.steering_state import SCHEMA as STATE_SCHEMA
from dueflow.records.steering_state import (
    JobSteering,
    Outstanding,
    Patch,
    decode_job_state,
    encode_job_state,
    job_key,
    job_of,
)

NOW = 1_800_000_000_000


def move(**kw: object) -> Command:
    base: dict[str, object] = {
        "command_id": "0190f0c2a1b27c3d8e9f00112233ccdd",
        "op": "move",
        "job_id": "j1",
        "idempotency_key": "invoice:42",
        "queue": "billing",
        "at_ms": NOW,
        "known_due_ms": NOW + 1000,
        "due_ms": NOW + 5000,
    }
    base.update(kw)
    return Command(**base)  # type: ignore[arg-type]


def test_a_command_round_trips_with_its_headers() -> None:
    cmd = move(by="ada@ops", expect_version="")
    headers = command_headers(cmd)
    assert hdr.is_command(headers)
    assert hdr.header(headers, hdr.KIND) == b"steer"
    assert hdr.header(headers, hdr.DUE) == b"0"  # never held
    assert hdr.header(headers, hdr.SCHEMA) == b"dueflow.Command/1"
    assert decode_command(encode_command(cmd), hdr.header(headers, hdr.SCHEMA)) == cmd


def test_a_command_key_is_never_a_jobs_key() -> None:
    assert command_key(b"invoice:42") == b"invoice:42" + MARK
    assert target_of(command_key(b"invoice:42")) == b"invoice:42"
    assert target_of(b"invoice:42") is None
    assert target_of(None) is None


@pytest.mark.parametrize(
    ("cmd", "field"),
    [
        (move(op="delete"), "op"),
        (move(command_id=""), "command_id"),
        (move(command_id="x" * 65), "command_id"),
        (move(job_id=""), "job_id"),
        (move(job_id="a\u202eb"), "job_id"),
        (move(idempotency_key="k\x00"), "idempotency_key"),
        (move(idempotency_key=7), "idempotency_key"),
        (move(due_ms=None), "due_ms"),
        (move(due_ms=MAX_DUE_MS + 1), "due_ms"),
        (move(due_ms=-1), "due_ms"),
        (move(known_due_ms=True), "known_due_ms"),
        (move(op="patch", payload="text"), "payload"),
        (move(op="patch", payload=b"{}", content_type=""), "content_type"),
        (move(op="replace", job=None), "job"),
    ],
)
def test_every_bad_field_is_named(cmd: Command, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_command(cmd)
    assert err.value.field == field


def test_good_commands_pass() -> None:
    check_command(move())
    check_command(move(op="cancel", due_ms=None))
    check_command(move(op="patch", payload=b'{"a":1}', due_ms=None))
    check_command(move(op="replace", job=b"\x02", due_ms=NOW))


def test_garbage_is_not_a_command() -> None:
    with pytest.raises(UndecodableRecord):
        decode_command(b"\xff\xff", b"dueflow.Command/1")
    with pytest.raises(UndecodableRecord):
        decode_command(None, None)
    with pytest.raises(UndecodableRecord):
        decode_command(encode_command(move()), b"dueflow.Job/1")


states = st.builds(
    JobSteering,
    job_id=st.text(min_size=1, max_size=20),
    idempotency_key=st.text(min_size=1, max_size=20),
    current=st.text(max_size=10),
    current_due_ms=st.none() | st.integers(0, MAX_DUE_MS),
    cancelled=st.booleans(),
    ended=st.none() | st.sampled_from(["done", "dead", "cancelled", "expired"]),
    outstanding=st.lists(
        st.builds(Outstanding, st.text(max_size=10), st.none() | st.integers(0, MAX_DUE_MS)),
        max_size=4,
    ).map(tuple),
    patch=st.none()
    | st.builds(
        Patch,
        st.text(min_size=1, max_size=10),
        st.none() | st.integers(0, MAX_DUE_MS),
        st.none() | st.binary(max_size=20),
        st.none() | st.text(max_size=10),
        st.text(min_size=1, max_size=10),
    ),
    exec_partition=st.integers(-1, 1000),
    last_command_id=st.none() | st.text(max_size=10),
    updated_ms=st.integers(0, MAX_DUE_MS),
)


@given(states)
@settings(max_examples=200, deadline=None)
def test_a_job_state_round_trips(state: JobSteering) -> None:
    assert decode_job_state(encode_job_state(state), STATE_SCHEMA) == state


def test_state_keys_are_namespaced() -> None:
    assert job_key(b"k") == b"j\x00k"
    assert job_of(b"j\x00k") == b"k"
    assert job_of(b"u\x00k") is None


def test_a_state_needs_exactly_one_section() -> None:
    empty = codec.encode("steering_state", {"job": None, "unique": None, "group": None})
    with pytest.raises(UndecodableRecord):
        decode_job_state(empty, STATE_SCHEMA)


def test_features_round_trip_and_only_go_up() -> None:
    key, value = encode_features(QueueFeatures("billing", 1, "ada", NOW))
    assert key == b"features:billing"
    got = decode_features(key, value)
    assert got == QueueFeatures("billing", 1, "ada", NOW)
    assert got.steerable
    assert decode_features(b"queue:billing", b"{}") is None  # a pause command: not ours
    lower = QueueFeatures("billing", 0, "bob", NOW + 1)
    assert fold_features([got, lower]) == {"billing": got}  # one-way
    for bad in (b"not json", b"[1]", b'{"steering": "yes"}', b'{"steering": -1}'):
        with pytest.raises(UndecodableRecord):
            decode_features(key, bad)


@pytest.mark.parametrize(
    ("client_id", "capable"),
    [
        (worker_client_id("0.1.0", "hostA"), True),
        ("dueflow-worker/0.2.0/hostA", True),
        ("dueflow-worker/1.0.0rc1/hostA", True),
        ("dueflow-worker/0.0.9/hostA", False),
        ("rdkafka", False),  # the client id of a worker of the release before
        ("", False),
        ("dueflow-worker/x/hostA", False),
    ],
)
def test_which_workers_apply_commands(client_id: str, capable: bool) -> None:
    assert steering_capable(client_id) is capable


def test_the_wire_format_example_writes_commands_as_dueflow_does() -> None:
    """docs/wire-format.md's ``steer_job`` (confluent-kafka and fastavro only): its
    murmur2 is Kafka's, and what it writes is a command a worker applies."""
    import random
    import re
    from pathlib import Path
    from typing import Any

    import fastavro

    from dueflow.rules.partitioning import murmur2, partition_for_key

    doc = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
    (block,) = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL)
    ns: dict[str, Any] = {"__name__": "wire_format_example"}
    exec(compile(block, str(doc), "exec"), ns)
    rng = random.Random(7)
    for _ in range(500):
        data = rng.randbytes(rng.randrange(0, 40))
        assert ns["murmur2"](data) == murmur2(data)

    produced: list[tuple[Any, ...]] = []

    class Producer:
        def produce(self, topic: str, value: bytes, key: bytes, partition: int, **kw: Any) -> None:
            produced.append((topic, value, key, partition, kw["headers"]))
            kw["on_delivery"](None, None)

        def flush(self, _timeout: float) -> int:
            return 0

    schema = fastavro.parse_schema(codec.schema_json("command"))
    cid = ns["steer_job"](
        Producer(),
        schema,
        prefix="df",
        queue="billing",
        partitions=12,
        op="move",
        job_id="j1",
        idempotency_key="invoice:42",
        due_ms=NOW + 60_000,
    )
    ((topic, value, key, partition, headers),) = produced
    assert topic == "df.exec.billing"
    assert key == command_key(b"invoice:42")
    assert partition == partition_for_key(b"invoice:42", 12)
    assert hdr.is_command(headers)
    cmd = decode_command(value, hdr.header(headers, hdr.SCHEMA))
    check_command(cmd)
    assert (cmd.command_id, cmd.op, cmd.due_ms, cmd.idempotency_key) == (
        cid,
        "move",
        NOW + 60_000,
        "invoice:42",
    )
