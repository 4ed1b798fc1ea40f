"""The worker's consumer thread reads what is there without waiting for a full batch,
and answers a settled command only once every record it polled before is on the loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dueflow.consumers.polling import ConsumerThread, GroupPoller, read_batch


class FakeConsumer:
    """``poll`` hands out one queued record; ``consume`` what is queued, never waiting."""

    def __init__(self, queued: list[str]) -> None:
        self.queued = list(queued)
        self.calls: list[tuple[str, int | None, float]] = []

    def poll(self, timeout: float) -> Any:
        self.calls.append(("poll", None, timeout))
        return self.queued.pop(0) if self.queued else None

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.calls.append(("consume", num_messages, timeout))
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out


def test_a_single_record_is_returned_at_once_not_after_the_batch_timeout() -> None:
    consumer = FakeConsumer(["r1"])
    assert read_batch(consumer, 2_000, 0.05) == ["r1"]  # type: ignore[arg-type]
    # Only the first record may wait (poll returns on the first); the rest never waits.
    assert consumer.calls == [("poll", None, 0.05), ("consume", 1_999, 0)]


def test_a_batch_keeps_its_order_and_its_size_limit() -> None:
    consumer = FakeConsumer([f"r{i}" for i in range(10)])
    assert read_batch(consumer, 4, 0.05) == ["r0", "r1", "r2", "r3"]  # type: ignore[arg-type]
    assert read_batch(consumer, 4, 0.05) == ["r4", "r5", "r6", "r7"]  # type: ignore[arg-type]
    assert read_batch(consumer, 1, 0.05) == ["r8"]  # type: ignore[arg-type]
    assert consumer.calls[-1] == ("poll", None, 0.05)  # batch of one: no consume


def test_nothing_there_returns_empty_after_the_timeout() -> None:
    consumer = FakeConsumer([])
    assert read_batch(consumer, 2_000, 0.05) == []  # type: ignore[arg-type]
    assert consumer.calls == [("poll", None, 0.05)]


class CountingConsumer:
    """Hands out ``total`` records, one per poll; counts what it returned."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.returned = 0

    def poll(self, timeout: float) -> Any:
        if self.returned >= self.total:
            time.sleep(min(timeout, 0.005))
            return None
        self.returned += 1
        return f"r{self.returned}"

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def test_a_settled_command_answers_after_every_record_polled_before_it_is_on_the_loop() -> None:
    """Two batches wait on the loop untaken: the thread holds the third back. A plain
    command is answered meanwhile; a settled one only once the held batch reached the
    loop, so what it reads of the consumer covers nothing the loop has not seen."""

    async def main() -> None:
        received: list[str] = []
        consumer = CountingConsumer(3)
        thread = ConsumerThread(
            consumer,  # type: ignore[arg-type]
            name="t",
            batch_size=1,
            on_batch=received.extend,
            poll_s=0.01,
        )
        thread.start()
        try:
            deadline = time.monotonic() + 5
            while not (len(received) == 2 and consumer.returned == 3):
                assert time.monotonic() < deadline, (received, consumer.returned)
                await asyncio.sleep(0.005)
            # the thread holds the third batch back; a plain command is answered
            plain = await asyncio.wait_for(thread.call(lambda c: consumer.returned), 5)
            assert plain == 3
            settled = asyncio.ensure_future(thread.call_settled(lambda c: consumer.returned))
            await asyncio.sleep(0.1)
            assert not settled.done()  # the third batch is still held back
            assert received == ["r1", "r2"]
            thread.batch_taken()
            thread.batch_taken()
            answer = await asyncio.wait_for(settled, 5)
            assert answer == 3
            assert received == ["r1", "r2", "r3"]  # on the loop before the answer
        finally:
            thread.stop()
            await asyncio.wait_for(thread.wait_closed(), 5)

    asyncio.run(main())


class AssigningConsumer:
    """What a rebalance callback calls on the consumer; ``incremental_assign`` may fail."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.assigned: list[Any] = []

    def incremental_assign(self, parts: list[Any]) -> None:
        if self.fail:
            raise RuntimeError("assign failed")
        self.assigned.extend(parts)

    def resume(self, parts: list[Any]) -> None:
        pass

    def consumer_group_metadata(self) -> str:
        return "metadata"


def test_the_rebalance_flag_is_up_while_a_callback_runs_and_down_after_a_failed_assign() -> None:
    """The assignment check trusts ``consumer.assignment()`` only while no rebalance
    callback runs: the flag is up during the assign and the runtime's callback, and
    down afterwards, also when the assign itself raised."""

    async def main() -> None:
        seen: list[bool] = []
        poller: GroupPoller

        async def on_assign(parts: list[Any]) -> None:
            seen.append(poller.in_callback)

        async def nothing(parts: list[Any]) -> None:
            pass

        poller = GroupPoller(
            AssigningConsumer(False),  # type: ignore[arg-type]
            ["t"],
            batch_size=10,
            on_batch=lambda records: None,
            on_assign=on_assign,
            on_revoke=nothing,
            on_lost=nothing,
            name="t",
            incremental=True,
        )
        poller._loop = asyncio.get_running_loop()
        ok = AssigningConsumer(False)
        await asyncio.to_thread(poller._assigned, ok, ["p0"])  # type: ignore[arg-type,list-item]
        assert ok.assigned == ["p0"]
        assert seen == [True]
        assert poller.in_callback is False
        failing = AssigningConsumer(True)
        with pytest.raises(RuntimeError):
            await asyncio.to_thread(poller._assigned, failing, ["p1"])  # type: ignore[arg-type,list-item]
        assert seen == [True]  # the runtime's callback did not run
        assert poller.in_callback is False

    asyncio.run(main())
