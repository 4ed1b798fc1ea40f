"""The status view's consumer hands a record to the streams without faust's four
tasks per record when the delivery completes at once, and through ``wait_first``
(the flow may be suspended meanwhile) when it has to wait or the flow is suspended;
the records of the batch topic go to their handler in lists, acknowledged only once
it has returned."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dueflow.streams.status.faust_transport import Batches, ReadCommittedConsumer, deliver


class FakeConsumer:
    """What :func:`deliver` uses of faust's consumer; ``wait_first`` as faust's
    (the first of the awaitables to finish), counting its calls."""

    def __init__(self) -> None:
        self.suspend_flow = asyncio.Event()
        self._stopped = asyncio.Event()
        self._crashed = asyncio.Event()
        self.waits = 0

    async def wait_first(self, *coros: Any) -> list[Any]:
        self.waits += 1
        tasks = [asyncio.ensure_future(c) for c in coros]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        return [t.result() for t in done]


def test_a_delivery_that_completes_at_once_runs_without_tasks() -> None:
    async def main() -> tuple[list[int], int, int]:
        consumer = FakeConsumer()
        got: list[int] = []

        async def delivery(n: int) -> None:
            got.append(n)

        before = len(asyncio.all_tasks())
        for n in range(3):
            await deliver(consumer, delivery(n))
        return got, consumer.waits, len(asyncio.all_tasks()) - before

    got, waits, tasks_left = asyncio.run(main())
    assert got == [0, 1, 2]
    assert waits == 0
    assert tasks_left == 0


def test_a_delivery_that_waits_finishes_through_wait_first() -> None:
    async def main() -> tuple[list[str], int]:
        consumer = FakeConsumer()
        room = asyncio.get_running_loop().create_future()
        got: list[str] = []

        async def delivery() -> None:
            got.append("started")
            got.append(await room)  # a full buffer: it waits for room

        asyncio.get_running_loop().call_later(0.01, room.set_result, "delivered")
        await deliver(consumer, delivery())
        return got, consumer.waits

    got, waits = asyncio.run(main())
    assert got == ["started", "delivered"], "run once, resumed with the awaited value"
    assert waits == 1


def test_a_waiting_delivery_is_dropped_when_the_flow_is_suspended() -> None:
    async def main() -> tuple[list[str], bool]:
        consumer = FakeConsumer()
        never = asyncio.get_running_loop().create_future()
        got: list[str] = []

        async def delivery() -> None:
            got.append("started")
            got.append(await never)

        asyncio.get_running_loop().call_later(0.01, consumer.suspend_flow.set)
        await deliver(consumer, delivery())
        await asyncio.sleep(0)  # the cancelled delivery's task ends
        return got, never.cancelled()

    got, cancelled = asyncio.run(main())
    assert got == ["started"]
    assert cancelled, "the waiting delivery was cancelled (as faust's wait_first does)"


def test_a_suspended_flow_goes_through_wait_first() -> None:
    async def main() -> int:
        consumer = FakeConsumer()
        consumer.suspend_flow.set()

        async def delivery() -> None:
            return None

        await deliver(consumer, delivery())
        return consumer.waits

    assert asyncio.run(main()) == 1


def test_an_error_of_the_delivery_is_raised() -> None:
    async def main() -> None:
        async def delivery() -> None:
            raise ValueError("bad record")

        await deliver(FakeConsumer(), delivery())

    with pytest.raises(ValueError, match="bad record"):
        asyncio.run(main())


# ------------------------------------------------------- records handed over in batches


class BatchConsumer(FakeConsumer):
    """What ``_hand_over`` uses of faust's consumer: the batch handler on its
    transport, the unacknowledged set, ``ack``."""

    def __init__(self, handler: Any) -> None:
        super().__init__()
        self.transport = type("T", (), {"batches": Batches("outcomes", handler, 10)})()
        self._unacked_messages: set[str] = set()
        self.acked: list[str] = []

    def ack(self, message: str) -> bool:
        self._unacked_messages.discard(message)
        self.acked.append(message)
        return True


def test_a_batch_is_acknowledged_after_its_handler_returns() -> None:
    seen: list[tuple[list[str], set[str], list[str]]] = []

    async def main() -> BatchConsumer:
        async def handler(messages: list[str]) -> None:
            await asyncio.sleep(0)  # (the changelog's wait)
            seen.append((list(messages), set(consumer._unacked_messages), list(consumer.acked)))

        consumer = BatchConsumer(handler)
        await ReadCommittedConsumer._hand_over(consumer, ["m1", "m2"])  # type: ignore[arg-type]
        return consumer

    consumer = asyncio.run(main())
    assert seen == [(["m1", "m2"], {"m1", "m2"}, [])], "pending, not acknowledged, meanwhile"
    assert consumer.acked == ["m1", "m2"]
    assert consumer._unacked_messages == set()


def test_a_batch_whose_handler_fails_is_not_acknowledged() -> None:
    async def main() -> BatchConsumer:
        async def handler(messages: list[str]) -> None:
            raise RuntimeError("changelog not stored")

        consumer = BatchConsumer(handler)
        with pytest.raises(RuntimeError, match="changelog not stored"):
            await ReadCommittedConsumer._hand_over(consumer, ["m1"])  # type: ignore[arg-type]
        return consumer

    assert asyncio.run(main()).acked == []


def test_a_batch_is_dropped_while_the_flow_is_suspended() -> None:
    handled: list[list[str]] = []

    async def main() -> BatchConsumer:
        async def handler(messages: list[str]) -> None:
            handled.append(messages)

        consumer = BatchConsumer(handler)
        consumer.suspend_flow.set()  # a rebalance: read again from the committed offsets
        await ReadCommittedConsumer._hand_over(consumer, ["m1"])  # type: ignore[arg-type]
        return consumer

    consumer = asyncio.run(main())
    assert handled == []
    assert consumer.acked == []
