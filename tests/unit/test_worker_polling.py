"""The worker's consumer thread reads what is there without waiting for a full batch."""

from __future__ import annotations

from typing import Any

from dueflow.consumers.polling import read_batch


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
