"""The scheduling clients' schema registry option (``producer.schema_registry_url``).

Job values framed in the Confluent wire format with the id the registry gives
job.avsc (asked for once, at the first plan), ``df-schema`` with the
``+confluent`` suffix, the size budget counting the framing, the bulk path
writing what the planner writes, and a registry that cannot be reached failing
the first schedule with its URL instead of hanging. The registry is
tests/support/fake_registry.py on a loopback port.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import ProducerSettings, Settings, load_settings
from dueflow.errors import ConfigError, SchemaRegistryError
from dueflow.producers.bulk_plan import BulkPlanner
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.producers.rescheduling import moved_timer
from dueflow.producers.schema_registry import (
    JobSchemaIds,
    job_schema_text,
    registry_ids,
    subject_of,
)
from dueflow.records.codec import decode_job_value
from dueflow.records.framing import unframe_job
from dueflow.records.job_request import JobRequest
from dueflow.records.record_size import record_size
from dueflow.records.size_budget import RecordTooLarge
from dueflow.records.timer_record import JOB_SCHEMA
from tests.support.fake_registry import FIRST_ID, fake_registry

NOW = 1_800_000_000_000


def planner(
    schema_ids: Callable[[], int] | None, *, max_record_bytes: int = 1_048_588
) -> TimerPlanner:
    return TimerPlanner(
        load_settings(env={}),
        recent=RecentJobs(),
        ids=JobIds(random_bytes=lambda n: b"\x5a" * n),
        schema_ids=schema_ids,
        max_record_bytes=max_record_bytes,
    )


def planned(p: TimerPlanner, req: JobRequest) -> PlannedTimer:
    got = p.plan(req, now_ms=NOW)
    assert isinstance(got, PlannedTimer)
    return got


def request(job_id: str, payload: object = None, **kw: Any) -> JobRequest:
    return JobRequest(
        task="t", payload={"n": 1} if payload is None else payload, job_id=job_id, **kw
    )


def test_a_framed_record_is_the_plain_one_with_the_id_and_the_suffix() -> None:
    asked: list[int] = []

    def ids() -> int:
        asked.append(1)
        return 42

    framed_planner, plain_planner = planner(ids), planner(None)
    for n, req in enumerate(
        [request("a"), request("b", b"raw", delay=60), request("c", labels={"x": "y"})]
    ):
        framed = planned(framed_planner, req).record
        plain = planned(plain_planner, req).record
        schema = hdr.header(framed.headers, hdr.SCHEMA)
        assert schema == JOB_SCHEMA + b"+confluent"
        assert framed.value == b"\x00\x00\x00\x00\x2a" + plain.value, n
        assert unframe_job(framed.value, schema) == (plain.value, JOB_SCHEMA, 42)
        assert decode_job_value(framed.value, schema) == decode_job_value(plain.value, JOB_SCHEMA)
        assert [h for h in framed.headers if h[0] != hdr.SCHEMA] == [
            h for h in plain.headers if h[0] != hdr.SCHEMA
        ]
        assert (framed.partition, framed.key) == (plain.partition, plain.key)
        assert framed.size == record_size(framed.key, framed.value, framed.headers)
        assert framed.size == plain.size + 5 + len(b"+confluent")
    assert asked == [1]  # the registry is asked once, at the first plan


def test_the_size_budget_counts_the_framing() -> None:
    plain_planner, framed_planner = (
        planner(None, max_record_bytes=20_000),
        planner(lambda: 7, max_record_bytes=20_000),
    )
    with pytest.raises(RecordTooLarge) as plain_refusal:
        plain_planner.plan(request("j-big", b"x" * 30_000), now_ms=NOW)
    most = plain_refusal.value.max_payload
    planned(plain_planner, request("j-pla", b"x" * most))
    with pytest.raises(RecordTooLarge) as framed_refusal:
        framed_planner.plan(request("j-pla", b"x" * most), now_ms=NOW)
    # 5 framing bytes in the value, 10 more in df-schema
    assert framed_refusal.value.max_payload == most - 15
    record = planned(framed_planner, request("j-frm", b"x" * (most - 15))).record
    assert record.size <= 20_000


def test_schedule_many_writes_what_the_planner_writes() -> None:
    reqs = [request(f"j{i}") for i in range(3)] + [
        JobRequest(task="t", payload=i, job_id=f"k{i}", delay=i * 100) for i in range(3)
    ]
    bulk = BulkPlanner(planner(lambda: 42))
    reference = planner(lambda: 42)
    for req in reqs:
        plan = bulk.plan(req, NOW)
        assert isinstance(plan, tuple)
        expected = planned(reference, req).record
        assert (plan[5], plan[7], plan[8]) == (
            expected.partition,
            expected.value,
            expected.headers,
        )


def test_the_registry_is_asked_once_per_process_with_job_avsc() -> None:
    with fake_registry() as (url, registry):
        settings = Settings(
            topic_prefix="acme",
            producer=ProducerSettings(
                schema_registry_url=url, schema_registry_user="svc", schema_registry_password="pw"
            ),
        )
        ids = JobSchemaIds()
        first, second = registry_ids(settings, ids), registry_ids(settings, ids)
        assert first is not None
        assert second is not None
        assert (first(), second(), ids.get(settings)) == (FIRST_ID, FIRST_ID, FIRST_ID)
    assert registry.subjects == {"acme.timers-value": [FIRST_ID]}
    assert subject_of(settings) == "acme.timers-value"
    assert json.loads(registry.schemas[FIRST_ID]) == json.loads(job_schema_text())
    assert [r[:2] for r in registry.requests] == [("POST", "/subjects/acme.timers-value/versions")]
    assert registry.auth == ["Basic " + base64.b64encode(b"svc:pw").decode()]
    assert registry_ids(Settings()) is None  # no option: plain values


def test_a_registry_that_refuses_connections_fails_the_first_plan_naming_its_url() -> None:
    with socket.socket() as s:  # a free port that nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = Settings(producer=ProducerSettings(schema_registry_url=url))
    p = planner(registry_ids(settings, JobSchemaIds()))
    with pytest.raises(SchemaRegistryError) as err:
        p.plan(request("a"), now_ms=NOW)
    assert url in str(err.value)
    assert "producer.schema_registry_url" in str(err.value)
    assert err.value.retriable
    assert err.value.status is None
    assert p.recent.get("a") is None  # nothing claimed: the job can be scheduled again


def test_a_registry_that_does_not_answer_fails_within_its_timeout() -> None:
    with socket.socket() as server:  # accepts connections (the backlog), never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        settings = Settings(
            producer=ProducerSettings(schema_registry_url=url, schema_registry_timeout_s=0.5)
        )
        started = time.monotonic()
        with pytest.raises(SchemaRegistryError, match=r"not reached within 0\.5 s"):
            JobSchemaIds().get(settings)
        assert time.monotonic() - started < 10


def test_a_registry_that_says_no_is_not_retriable() -> None:
    with fake_registry() as (url, _registry):
        settings = Settings(producer=ProducerSettings(schema_registry_url=url + "/nowhere"))
        with pytest.raises(SchemaRegistryError, match="HTTP 404") as err:
            JobSchemaIds().get(settings)
    assert err.value.status == 404
    assert not err.value.retriable


@pytest.mark.parametrize(
    ("env", "setting", "shown"),
    [
        ({"URL": "registry:8081"}, "producer.schema_registry_url", "'registry:8081'"),
        ({"URL": "http://u:pw-zq7@registry:8081"}, "producer.schema_registry_url", "not shown"),
        ({"USER": "svc"}, "producer.schema_registry_user", "'svc'"),
        ({"TIMEOUT_S": "0"}, "producer.schema_registry_timeout_s", "0.0"),
    ],
)
def test_bad_registry_settings_are_named(env: dict[str, str], setting: str, shown: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={f"DUEFLOW_PRODUCER_SCHEMA_REGISTRY_{k}": v for k, v in env.items()})
    assert err.value.setting == setting
    assert shown in str(err.value)
    assert "pw-zq7" not in str(err.value)


def test_the_password_is_not_in_the_settings_repr() -> None:
    settings = load_settings(
        env={
            "DUEFLOW_PRODUCER_SCHEMA_REGISTRY_URL": "https://registry.example:8081",
            "DUEFLOW_PRODUCER_SCHEMA_REGISTRY_USER": "svc",
            "DUEFLOW_PRODUCER_SCHEMA_REGISTRY_PASSWORD": "hunter2",
        }
    )
    assert settings.producer.schema_registry_password == "hunter2"
    assert "hunter2" not in repr(settings)


def test_a_client_with_the_option_reschedules_framed_with_its_own_id() -> None:
    """The moved timer is written the way the rescheduling client writes: framed with
    its id (which names the schema it writes with), whatever the job held before."""
    p = planner(lambda: 42)
    plain = planned(planner(None), request("moved", delay=60)).record
    framed_elsewhere = planned(planner(lambda: 7), request("moved", delay=60)).record
    due = NOW + 120_000
    expected = moved_timer(plain.value, plain.headers, due_ms=due, now_ms=NOW, placer=p.placer)
    assert hdr.header(expected.headers, hdr.SCHEMA) == JOB_SCHEMA  # without the option
    for found in (plain, framed_elsewhere):
        moved = moved_timer(
            found.value, found.headers, due_ms=due, now_ms=NOW, placer=p.placer, schema_id=42
        )
        schema = hdr.header(moved.headers, hdr.SCHEMA)
        assert schema == JOB_SCHEMA + b"+confluent"
        assert unframe_job(moved.value, schema) == (expected.value, JOB_SCHEMA, 42)
        assert decode_job_value(moved.value, schema)["due_ms"] == due
        assert moved.partition == expected.partition
