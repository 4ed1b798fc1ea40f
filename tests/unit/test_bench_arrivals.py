"""benchmarks.arrivals: a measuring consumer blocks only for the first record, then
takes what is already fetched, and reads the clock once the records are in hand."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from benchmarks.arrivals import take_arrived


def msg(offset: int) -> Message:
    return Message(topic="t", partition=0, offset=offset, value=b"x")


class FakeConsumer:
    """``fetched`` records are in the client already; ``poll`` returns the first of them
    (or None, as on a timeout), ``consume`` never waits for more than there are."""

    def __init__(self, fetched: int, events: list[str]) -> None:
        self.fetched = [msg(i) for i in range(fetched)]
        self.events = events

    def poll(self, timeout: float = -1) -> Message | None:
        self.events.append(f"poll {timeout:g}")
        return self.fetched.pop(0) if self.fetched else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.events.append(f"consume {num_messages} {timeout:g}")
        taken, self.fetched = self.fetched[:num_messages], self.fetched[num_messages:]
        return taken


def clock_of(events: list[str]) -> int:
    events.append("clock")
    return 1_000


@pytest.mark.parametrize(
    ("fetched", "max_records", "taken", "calls"),
    [
        (0, 100, 0, ["poll 0.05", "clock"]),
        (1, 100, 1, ["poll 0.05", "consume 99 0", "clock"]),
        (5, 100, 5, ["poll 0.05", "consume 99 0", "clock"]),
        (500, 100, 100, ["poll 0.05", "consume 99 0", "clock"]),
        (5, 1, 1, ["poll 0.05", "clock"]),
    ],
)
def test_it_waits_for_the_first_record_only_and_takes_what_is_there(
    fetched: int, max_records: int, taken: int, calls: list[str]
) -> None:
    events: list[str] = []
    consumer = FakeConsumer(fetched, events)
    at, messages = take_arrived(
        consumer, timeout_s=0.05, max_records=max_records, clock=lambda: clock_of(events)
    )
    assert len(messages) == taken
    assert [m.offset() for m in messages] == list(range(taken))
    assert at == 1_000
    # never a consume() with a timeout (it would wait for a full batch), and the
    # receive time is read after the last record was taken
    assert events == calls


def test_records_left_over_come_with_the_next_call() -> None:
    events: list[str] = []
    consumer = FakeConsumer(150, events)
    first = take_arrived(consumer, timeout_s=0.05, max_records=100, clock=lambda: 1)
    second = take_arrived(consumer, timeout_s=0.05, max_records=100, clock=lambda: 2)
    assert [len(first.messages), len(second.messages)] == [100, 50]
    assert [m.offset() for m in second.messages] == list(range(100, 150))


def test_max_records_below_one_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"max_records: 0"):
        take_arrived(FakeConsumer(1, []), timeout_s=0.05, max_records=0)
