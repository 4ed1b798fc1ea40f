"""The lead fence (dueflow.consumers.lead_fence) asks the last stable offsets of the
partitions whose jobs fired ahead are due, one request at a time, and moves a
partition's fence to the moment it asked once every record before the answer
was handled (no broker: an admin client that the test answers)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import PartitionFeed
from dueflow.consumers.lead_fence import (
    ASK_AFTER_S,
    POSITION_AFTER_S,
    LeadFence,
    handled_to,
    retry_delay,
)
from dueflow.consumers.store import MemoryKeyStore


class Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class FakeAdmin:
    def __init__(self) -> None:
        self.asks: list[tuple[list[int], Any, dict[TopicPartition, Future[Any]]]] = []
        self.refreshed: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed.append(topic)

    def list_offsets(self, specs: dict[TopicPartition, Any], **kw: Any) -> dict[Any, Any]:
        futures: dict[TopicPartition, Future[Any]] = {
            TopicPartition(tp.topic, tp.partition): Future() for tp in specs
        }
        self.asks.append((sorted(tp.partition for tp in specs), kw["isolation_level"], futures))
        return futures

    def answer(self, ask: int, offsets: dict[int, int | Exception]) -> None:
        for tp, future in self.asks[ask][2].items():
            value = offsets[tp.partition]
            if isinstance(value, Exception):
                future.set_exception(value)
            else:
                future.set_result(Answer(value))


def feed(partition: int, read_to: int | None = None, *, due: int = 2_000) -> PartitionFeed:
    """A partition with a job due at ``due`` waiting for its fence."""
    f = PartitionFeed("p.exec.jobs", partition, None, MemoryKeyStore(10**9))
    if read_to is not None:
        f.tracker.extend(list(range(read_to)))
    f.fenced.append((due, 0, None))  # type: ignore[arg-type]
    return f


async def asked() -> None:
    """Past the wait for the emitter's records to move the fence."""
    await asyncio.sleep(ASK_AFTER_S + 0.02)


class Setup:
    def __init__(self, *, position: int = -1) -> None:
        self.now = 1_000
        self.reached: list[tuple[int, int]] = []
        self.counted: list[str] = []
        self.positions_asked = 0
        self.position = position
        self.admin = FakeAdmin()
        self.fence = LeadFence(
            queue="jobs",
            due_now=lambda: self.now,
            on_reached=lambda f: self.reached.append((f.partition, f.fence_ms)),
            position=self._position,
            count_ask=self.counted.append,
        )
        self.fence.start(self.admin)  # type: ignore[arg-type]

    async def _position(self, tp: TopicPartition) -> int:
        self.positions_asked += 1
        return self.position


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_one_request_for_every_partition_waiting_and_one_at_a_time() -> None:
    async def main() -> None:
        s = Setup()
        a, b, c = feed(0, read_to=5), feed(1, read_to=7), feed(2, read_to=3)
        s.fence.want(a)
        await asked()
        s.fence.want(b)  # asked while the first request is under way: waits for it
        assert [ask[0] for ask in s.admin.asks] == [[0]]
        assert s.admin.asks[0][1] is IsolationLevel.READ_COMMITTED
        s.now = 1_010
        s.fence.want(c)
        s.admin.answer(0, {0: 5})
        await settle()
        assert s.reached == [(0, 1_000)]  # the fence: when it asked, not when answered
        assert a.fence_ms == 1_000
        assert [ask[0] for ask in s.admin.asks] == [[0], [1, 2]]
        s.admin.answer(1, {1: 9, 2: 3})  # partition 1 read to 7 of 9: not yet
        await settle()
        assert s.reached == [(0, 1_000), (2, 1_010)]
        assert b.fence_goal == (1_010, 9)
        assert s.counted == ["asked", "asked"]

    asyncio.run(main())


def test_the_answer_is_reached_once_the_records_before_it_are_handled() -> None:
    async def main() -> None:
        s = Setup()
        f = feed(0, read_to=10)
        f.backlog.extend([_Rec(o) for o in range(6, 10)])  # type: ignore[misc]  # 6..9 delivered
        assert handled_to(f) == 6
        s.fence.want(f)
        await asked()
        s.admin.answer(0, {0: 8})
        await settle()
        assert s.reached == []
        f.backlog.popleft()
        s.fence.check(f)  # handled to 7
        assert s.reached == []
        f.backlog.popleft()
        s.fence.check(f)  # handled to 8: every record before the answer
        assert s.reached == [(0, 1_000)]
        assert f.fence_goal is None

    asyncio.run(main())


def test_a_failed_ask_is_asked_again_after_a_delay_and_the_metadata() -> None:
    async def main() -> None:
        s = Setup()
        f = feed(3, read_to=2)
        s.fence.want(f)
        await asked()
        s.admin.answer(0, {3: KafkaException("NOT_LEADER_OR_FOLLOWER")})
        await settle()
        assert s.reached == []
        assert s.counted == ["asked", "failed"]
        assert len(s.admin.asks) == 1  # not at once
        await asyncio.sleep(retry_delay(0) + 0.05)
        # the topic's metadata asked first (a leader may have moved), then the end
        assert s.admin.refreshed == ["p.exec.jobs"]
        assert [ask[0] for ask in s.admin.asks] == [[3], [3]]
        s.admin.answer(1, {3: 2})
        await settle()
        assert s.reached == [(3, 1_000)]

    asyncio.run(main())


def test_an_answer_past_the_last_record_is_reached_by_the_consumers_position() -> None:
    """Transaction markers end the partition: no record will come; the consumer's
    position (past the markers) says so."""

    async def main() -> None:
        s = Setup(position=12)
        f = feed(0, read_to=10)  # records 0..9, then markers at 10 and 11
        s.fence.want(f)
        await asked()
        s.admin.answer(0, {0: 12})
        await settle()
        assert s.reached == []
        await asyncio.sleep(POSITION_AFTER_S + 0.02)
        assert s.positions_asked == 1
        assert s.reached == [(0, 1_000)]

    asyncio.run(main())


def test_an_answer_past_the_position_waits_for_the_records() -> None:
    async def main() -> None:
        s = Setup(position=10)
        f = feed(0, read_to=10)
        s.fence.want(f)
        await asked()
        s.admin.answer(0, {0: 11})  # record 10 is not fetched yet
        await settle()
        await asyncio.sleep(POSITION_AFTER_S + 0.02)
        assert s.positions_asked == 1
        assert s.reached == []
        f.tracker.extend([10])  # it arrives and is handled
        s.fence.check(f)
        assert s.reached == [(0, 1_000)]

    asyncio.run(main())


def test_a_revoked_partition_is_not_asked() -> None:
    async def main() -> None:
        s = Setup()
        f = feed(0, read_to=1)
        g = feed(1, read_to=1)
        s.fence.want(f)
        await asked()
        s.fence.want(g)
        g.advance(FeedState.LOADING)
        g.advance(FeedState.REVOKED)
        s.admin.answer(0, {0: 1})
        await settle()
        assert [ask[0] for ask in s.admin.asks] == [[0]]

    asyncio.run(main())


class _Rec:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def test_the_emitters_records_move_the_fence_and_nothing_is_asked() -> None:
    async def main() -> None:
        s = Setup()
        f = feed(0, read_to=3, due=1_500)
        s.fence.want(f)
        f.fence_ms = 1_500  # a record fired at 1,500 was handled meanwhile
        s.fence.check(f)
        assert s.reached == [(0, 1_500)]
        await asked()
        assert s.admin.asks == []

    asyncio.run(main())


def test_an_answer_without_an_offset_is_a_failure_not_a_fence() -> None:
    """A leader moving can answer -1001 (no offset): the fence must not move on it."""

    async def main() -> None:
        s = Setup()
        f = feed(0, read_to=5)
        s.fence.want(f)
        await asked()
        s.admin.answer(0, {0: -1001})
        await settle()
        assert s.reached == []
        assert f.fence_ms == 0
        assert s.counted == ["asked", "failed"]
        await asyncio.sleep(retry_delay(0) + 0.05)
        assert s.admin.refreshed == ["p.exec.jobs"]
        s.admin.answer(1, {0: 5})
        await settle()
        assert s.reached == [(0, 1_000)]

    asyncio.run(main())
