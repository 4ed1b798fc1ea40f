"""``scheduled`` outcomes from the scheduling client: on by default, off by a flag."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.producers import bulk as bulk_module
from dueflow.producers.aio import AsyncScheduler
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, read_all
from tests.integration.worker_support import decode_outcome
from tests.support.emitters import ensure_topics

WHEEL = {"levels": "10x1000,10x5000", "near_partitions": 2, "near_window_ms": 1500}


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, wheel=WHEEL, queues="default:3")
    ensure_topics(s)
    return s


def outcomes(settings: Settings) -> list[dict[str, Any]]:
    return [
        decode_outcome(m.value() or b"", hdr.header(m.headers() or [], hdr.SCHEMA))  # type: ignore[arg-type]
        for m in read_all(settings, names(settings).outcomes)
    ]


def test_off_when_asked(settings: Settings) -> None:
    with Scheduler(settings, scheduled_outcomes=False) as s:
        s.schedule("t", {}, delay="1h")
        s.schedule_many([{"task": "t", "delay": "1h"}] * 3)
    assert outcomes(settings) == []


def test_one_outcome_per_scheduled_job_by_default(settings: Settings) -> None:
    with Scheduler(settings) as s:
        one = s.schedule("send", {"a": 1}, delay="1h", job_id="one", idempotency_key="k-one")
        again = s.schedule("send", {"a": 1}, delay="1h", job_id="one", idempotency_key="k-one")
        bulk = s.schedule_many(
            [{"task": "bulk", "payload": i, "delay": "2h"} for i in range(5)]
            + [{"task": "", "delay": "1h"}]  # refused: no outcome
        )
    assert again.duplicate  # no write, not even an outcome
    assert again.job_id == one.job_id
    assert bulk.scheduled == 5
    assert len(bulk.errors) == 1

    async def from_asyncio() -> str:
        async with AsyncScheduler(settings) as s:
            return (await s.schedule("async", None, delay="1h")).job_id

    async_id = asyncio.run(from_asyncio())
    got = {o["job_id"]: o for o in outcomes(settings)}
    assert sorted(got) == sorted(["one", async_id, *[j for j in bulk.job_ids if j]])
    assert {o["state"] for o in got.values()} == {"scheduled"}
    first = got["one"]
    assert (first["queue"], first["task"], first["idempotency_key"]) == ("default", "send", "k-one")
    assert first["due_ms"] == one.due_ms
    assert first["attempt"] == 0
    assert all(got[j]["due_ms"] == d for j, d in zip(bulk.job_ids, bulk.due_ms, strict=True) if j)


def test_a_bulk_call_writes_one_outcome_per_job_in_bounded_batches(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # batches of 100 jobs: the producer is flushed, then their outcomes are written
    monkeypatch.setattr(bulk_module, "OUTCOMES_PER_FLUSH", 100)
    with Scheduler(settings) as s:
        bulk = s.schedule_many(
            [{"task": "bulk", "payload": {"i": i}, "delay": 60 + i} for i in range(450)],
            poll_every=25,
        )
    assert bulk.scheduled == 450
    jobs = {
        job["job_id"]: job
        for job in (
            codec.decode("job", m.value() or b"")
            for m in read_all(settings, names(settings).timers)
        )
    }
    written = read_all(settings, names(settings).outcomes)
    assert sorted((m.key() or b"").decode() for m in written) == sorted(jobs)  # one per job
    for m in written:
        outcome = decode_outcome(m.value() or b"", hdr.header(headers_of(m), hdr.SCHEMA))
        job = jobs[outcome["job_id"]]
        assert outcome["state"] == "scheduled"
        # when the job was planned, and what its timer says
        assert outcome["at_ms"] == job["created_ms"]
        assert (outcome["due_ms"], outcome["idempotency_key"]) == (
            job["due_ms"],
            job["idempotency_key"],
        )
        assert (outcome["queue"], outcome["task"]) == ("default", "bulk")
        assert hdr.header(headers_of(m), hdr.CONTENT_HASH) == job["content_hash"].encode()
