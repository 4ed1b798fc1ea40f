"""The asyncio client: same results, and the event loop keeps running."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import ConflictError, DueflowError, InvalidInput
from dueflow.kafka.topics import names
from dueflow.producers.aio import AsyncScheduler
from dueflow.records.job_request import JobRequest
from dueflow.records.reschedule import reschedule_key
from dueflow.records.worker_codec import decode_key_state
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, read_all
from tests.integration.test_scheduler import WHEEL, check_edge_result, edge_jobs
from tests.support.emitters import ensure_topics


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, wheel=WHEEL, queues="default:3")
    ensure_topics(s)
    return s


def test_async_schedule_bulk_cancel_and_cron(settings: Settings) -> None:
    async def main() -> None:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        ticking = asyncio.create_task(ticker())
        async with AsyncScheduler(settings) as s:
            one = await s.schedule("send_email", {"to": "a@example.com"}, delay="10s", job_id="a1")
            assert (one.job_id, one.duplicate) == ("a1", False)
            again = await s.schedule(
                "send_email", {"to": "a@example.com"}, delay="10s", job_id="a1"
            )
            assert again.duplicate
            with pytest.raises(ConflictError):
                await s.schedule("send_email", {"to": "b@example.com"}, job_id="a1")
            with pytest.raises(InvalidInput) as info:
                await s.schedule("send_email", delay="-1s")
            assert info.value.field == "delay"
            many = await asyncio.gather(*(s.schedule("t", i) for i in range(200)))
            assert len({m.job_id for m in many}) == 200
            ticks_before = ticks
            bulk = await s.schedule_many(JobRequest("t", i, delay=i % 30) for i in range(5_000))
            assert (bulk.scheduled, bulk.failed) == (5_000, 0)
            assert ticks > ticks_before  # the loop ran while the bulk call worked
            cancelled = await s.cancel("a1")
            assert cancelled.known
            assert cancelled.partition >= 0
            status = await s.status("a1")
            assert status is not None
            assert status.state == "cancelled"
            later = await s.schedule("send_email", delay="1h", job_id="a2")
            moved = await s.reschedule("a2", delay="2h")
            assert (moved.rescheduled, moved.old_due_ms) == (True, later.due_ms)
            sched = await s.add_schedule("every-5", cron="*/5 * * * *", timezone="UTC", task="t")
            assert [x.schedule_id for x in await s.list_schedules()] == ["every-5"]
            assert (await s.pause_schedule("every-5")).paused
            assert (await s.get_schedule("every-5")) is not None
            assert await s.delete_schedule("every-5")
            assert sched.version > 0
        stop.set()
        await ticking
        with pytest.raises(DueflowError, match="not started"):
            await s.schedule("t")

    asyncio.run(main())
    assert len(read_all(settings, names(settings).timers)) == 1 + 200 + 5_000 + 2
    records = {m.key(): m for m in read_all(settings, names(settings).idempotency("default"))}
    assert set(records) == {b"a1", reschedule_key(b"a2")}  # a cancel; the reschedule of a2
    idem = records[b"a1"]
    schema = hdr.header(headers_of(idem), hdr.SCHEMA)
    assert decode_key_state(idem.value() or b"", schema)[0] == "cancelled"


def test_async_schedule_many_refuses_bad_jobs_at_the_limits(settings: Settings) -> None:
    async def main() -> Any:
        async with AsyncScheduler(settings) as s:
            with pytest.raises(InvalidInput) as info:
                await s.schedule("t", {"x": float("inf")})
            assert info.value.field == "payload['x']"
            return await s.schedule_many(edge_jobs())

    check_edge_result(settings, asyncio.run(main()))
