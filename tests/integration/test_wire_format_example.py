"""The "any service" path: the example of docs/wire-format.md, run as written.

The code block of the doc uses only confluent_kafka, fastavro and
schemas/dueflow/schemas/job.avsc. It is executed here against the real broker, and what it
wrote is checked with dueflow's own reader: the value decodes, the headers
agree with it, and the partition is the one dueflow's placement chooses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.config import Settings, settings_from_dict
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.records import codec
from dueflow.records.job_request import JobRequest, JobRules, prepare_job
from dueflow.records.timer_record import spread_of
from dueflow.rules.wheel import WheelGeometry, place_timer, shard_for
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, read_all

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "wire-format.md"
WHEEL = {
    "levels": "10x1000,10x5000",
    "near_partitions": 2,
    "near_window_ms": 1500,
    "lookahead_ms": 200,
}


def example_namespace() -> dict[str, Any]:
    """The one ```python block of the doc, executed as a module (not as __main__)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "docs/wire-format.md should have exactly one python example"
    imports = set(re.findall(r"^(?:import|from) (\w+)", blocks[0], flags=re.MULTILINE))
    assert imports <= {"io", "json", "time", "uuid", "zlib", "fastavro", "confluent_kafka"}
    namespace: dict[str, Any] = {"__name__": "wire_format_example"}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    return namespace


def wheel_dict(geo: WheelGeometry) -> dict[str, Any]:
    return {
        "near_partitions": geo.near_partitions,
        "near_window_ms": geo.near_window_ms,
        "lookahead_ms": geo.lookahead_ms,
        "levels": [(lv.slots, lv.width_ms) for lv in geo.levels],
    }


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, wheel=WHEEL, queues="default:3,billing:2")
    assert TopicAdmin(make_admin(s), replication_factor=1).ensure(topic_layout(s)).ok
    return s


def test_the_example_place_timer_is_dueflows() -> None:
    ns = example_namespace()
    assert ns["DEFAULT_WHEEL"] == wheel_dict(WheelGeometry())  # the doc shows the defaults
    small = settings_from_dict({"wheel": WHEEL}).wheel.validate()
    sharded = settings_from_dict({"wheel": {**WHEEL, "shards": 3}}).wheel.validate()
    for geo in (WheelGeometry().validate(), small, sharded):
        now = 1_800_000_000_123
        for delta in [
            -10_000,
            0,
            2_000,
            2_001,
            62_500,
            62_501,
            3_779_500,
            3_779_501,
            226_799_501,
            5_443_199_500,
            400 * 86_400_000,
        ]:
            for key in (f"k{delta}".encode(), f"other{delta}".encode(), b"x"):
                spread = spread_of(key)
                expected = place_timer(
                    due_ms=now + delta,
                    now_ms=now,
                    geometry=geo.of_shard(shard_for(spread, geo.shards)),
                    spread=spread,
                )
                wheel = wheel_dict(geo) | ({"shards": geo.shards} if geo.shards > 1 else {})
                assert ns["place_timer"](now + delta, now, key, wheel) == expected.partition


@pytest.mark.parametrize("delay_ms", [0, 4_000, 30_000, 600_000])
def test_a_job_scheduled_without_the_sdk_is_a_valid_dueflow_timer(
    settings: Settings, delay_ms: int
) -> None:
    ns = example_namespace()
    with (ROOT / "schemas" / "dueflow" / "schemas" / "job.avsc").open() as f:
        schema = fastavro.parse_schema(json.load(f))
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap, "acks": "all", "enable.idempotence": True}
    )
    job_id, due_ms, partition = ns["schedule_job"](
        producer,
        schema,
        prefix=settings.topic_prefix,
        task="send_email",
        payload={"to": "a@example.com"},
        delay_ms=delay_ms,
        queue="billing",
        idempotency_key="welcome:a@example.com",
        wheel=wheel_dict(settings.wheel),
    )
    (msg,) = read_all(settings, names(settings).timers)
    assert msg.partition() == partition
    assert msg.key() == b"welcome:a@example.com"
    h = headers_of(msg)
    job = codec.decode(
        "job",
        msg.value() or b"",
        writer_version=codec.parse_schema_header(hdr.header(h, hdr.SCHEMA), expected="job"),
    )
    assert (job["job_id"], job["queue"], job["task"]) == (job_id, "billing", "send_email")
    assert job["due_ms"] == due_ms == hdr.header_int(h, hdr.DUE)
    assert hdr.header_text(h, hdr.QUEUE) == job["queue"]
    assert hdr.header_text(h, hdr.JOB_ID) == job_id
    assert hdr.header_text(h, hdr.KIND) == "job"
    assert json.loads(job["payload"]) == {"to": "a@example.com"}
    assert job["max_attempts"] == 4  # schema default
    # dueflow places it where the example did (the writer's now is created_ms)
    placed = place_timer(
        due_ms=due_ms,
        now_ms=job["created_ms"],
        geometry=settings.wheel,
        spread=spread_of(b"welcome:a@example.com"),
    )
    assert placed.partition == partition
    if delay_ms == 0:
        assert partition < settings.wheel.near_partitions
    # and the SDK's checks accept the same job
    prepare_job(
        JobRequest("send_email", {"to": "a@example.com"}, queue="billing", job_id=job_id),
        now_ms=job["created_ms"],
        rules=JobRules.from_settings(settings),
        new_job_id=lambda now_ms: job_id,
    )
