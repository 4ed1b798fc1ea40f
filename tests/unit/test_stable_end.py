"""Waiting until a partition's last stable offset reaches its high watermark, without a
broker (dueflow.consumers.stable_end): a fake partition, a fake clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow.config import Settings
from dueflow.consumers import partition_ends
from dueflow.consumers.stable_end import (
    ABORT_MARGIN_S,
    MAX_POLL_S,
    StableEnd,
    poll_delay,
    stable_bound_s,
    wait_until_stable,
)
from dueflow.observability.metrics import Metrics

_LOG = logging.getLogger("test.stable_end")


class Partition:
    """Its LSO as each poll sees it; the time goes on by every sleep."""

    def __init__(self, offsets: list[int]) -> None:
        self._offsets: Iterator[int] = iter(offsets)
        self.now = 100.0
        self.polls = 0
        self.slept: list[float] = []
        self.late: list[tuple[float, int]] = []

    async def stable(self) -> int:
        self.polls += 1
        return next(self._offsets)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def wait(self, high: int, *, bound_s: float = 10.0) -> int:
        return asyncio.run(
            wait_until_stable(
                self.stable,
                high,
                bound_s=bound_s,
                on_late=lambda waited, lso: self.late.append((waited, lso)),
                sleep=self.sleep,
                clock=lambda: self.now,
            )
        )


def test_no_open_transaction_costs_one_look() -> None:
    p = Partition([7])
    assert p.wait(7) == 7
    assert (p.polls, p.slept, p.late) == (1, [], [])


def test_it_reads_on_only_once_the_stable_offset_has_reached_the_high_watermark() -> None:
    # the markers of the previous owner's transaction land on the third look
    p = Partition([4, 4, 9])
    assert p.wait(9) == 9
    assert p.polls == 3
    assert p.slept == [poll_delay(0), poll_delay(1)]
    assert p.late == []


def test_what_was_written_after_the_high_watermark_does_not_hold_it_back() -> None:
    # past the high watermark seen at the start: a later transaction is not waited for
    p = Partition([4, 12])
    assert p.wait(9) == 12


def test_past_the_bound_it_says_so_and_keeps_waiting() -> None:
    p = Partition([4] * 40 + [9])
    assert p.wait(9, bound_s=5.0) == 9
    assert len(p.late) >= 2  # again after every further bound
    waited, lso = p.late[0]
    assert waited >= 5.0
    assert lso == 4
    assert p.late[1][0] >= 10.0


@pytest.mark.parametrize(
    ("polls", "delay"), [(0, 0.005), (1, 0.01), (5, 0.16), (7, MAX_POLL_S), (10_000, MAX_POLL_S)]
)
def test_polls_back_off_to_half_a_second(polls: int, delay: float) -> None:
    assert poll_delay(polls) == pytest.approx(delay)


def test_the_bound_is_the_transaction_timeout_and_the_brokers_abort() -> None:
    assert stable_bound_s(10_000) == 10.0 + ABORT_MARGIN_S


class FakeEnds:
    """A consumer's ``get_watermark_offsets``: answers in order (an exception is raised,
    ``None`` is a timeout); ``closed`` once closed."""

    def __init__(self, answers: list[int | KafkaException | None]) -> None:
        self.answers = answers
        self.asked = 0
        self.closed = False
        self.refreshed: list[str] = []

    def get_watermark_offsets(
        self, _tp: TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int] | None:
        assert not cached  # asked of the broker, never the client's cache
        assert not self.closed
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, KafkaException):
            raise answer
        return None if answer is None else (0, answer)

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed.append(topic)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _no_shared_clients() -> Iterator[None]:
    """Each test makes its own pair (a failed test leaves none behind)."""
    partition_ends._pairs.clear()
    yield
    partition_ends._pairs.clear()


def _end_with(monkeypatch: pytest.MonkeyPatch, high: FakeEnds, stable: FakeEnds) -> StableEnd:
    def consumer(_settings: Settings, _group: str, **extra: str) -> FakeEnds:
        return high if extra.get("isolation.level") == "read_uncommitted" else stable

    monkeypatch.setattr("dueflow.consumers.partition_ends.make_consumer", consumer)
    end = StableEnd(Settings(), queue="q", store="keys", metrics=Metrics(), logger=_LOG)
    end.start()
    return end


def test_a_failed_ask_is_asked_again_on_the_same_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader moving answers FENCED_LEADER_EPOCH (or "unknown partition") until the
    consumer's metadata is fresh: the client that failed asks for the topic's
    metadata, and the end is asked again on it, after a timeout too."""
    moved = KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH))
    # the high watermark: refused, no answer, then 9; the LSO: refused once, 4, then 9
    high = FakeEnds([moved, None, 9])
    stable = FakeEnds([moved, 4, 9])
    end = _end_with(monkeypatch, high, stable)
    assert asyncio.run(end.reached(TopicPartition("t", 0), 4)) == 9
    assert (high.answers, stable.answers) == ([], [])
    assert (high.asked, stable.asked) == (3, 3)
    # each failed client learnt the topic's leaders again before it was asked again
    assert (high.refreshed, stable.refreshed) == (["t", "t"], ["t"])
    end.close()
    assert high.closed
    assert stable.closed


def test_the_start_and_lso_of_a_store_partition_come_from_the_shared_lso_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key store's "up to where" is asked of the process's read_committed client
    (its connection has no fetch that the broker would answer first), again after a
    failed ask."""
    moved = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    high = FakeEnds([])
    stable = FakeEnds([moved, 7])
    end = _end_with(monkeypatch, high, stable)
    assert asyncio.run(end.low_and_stable(TopicPartition("t", 3))) == (0, 7)
    assert (high.asked, stable.asked) == (0, 2)
    assert stable.refreshed == ["t"]
    end.close()


def test_a_closed_reader_stops_asking_and_closes_its_clients_after_the_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    high = FakeEnds([])
    stable = FakeEnds([])
    end = _end_with(monkeypatch, high, stable)

    def closed_while_asked(_tp: TopicPartition, timeout: float, cached: bool) -> None:
        end.close()
        assert not high.closed  # still asking: closed after the answer
        raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))

    monkeypatch.setattr(high, "get_watermark_offsets", closed_while_asked)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(end.reached(TopicPartition("t", 0), 0))
    assert high.closed
    assert stable.closed


def test_every_store_of_a_process_shares_one_pair_closed_by_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[FakeEnds] = []

    def consumer(_settings: Settings, _group: str, **_extra: str) -> FakeEnds:
        made.append(FakeEnds([5]))
        return made[-1]

    monkeypatch.setattr("dueflow.consumers.partition_ends.make_consumer", consumer)
    ends = [
        StableEnd(Settings(), queue=q, store=s, metrics=Metrics(), logger=_LOG)
        for q in ("a", "b")
        for s in ("keys", "steering")
    ]
    for end in ends:
        end.start()
    assert len(made) == 2  # one read_uncommitted, one read_committed
    assert asyncio.run(ends[3].reached(TopicPartition("t", 0), 5)) == 5
    for end in ends[:3]:
        end.close()
    assert not any(c.closed for c in made)
    ends[3].close()
    assert all(c.closed for c in made)
    again = StableEnd(Settings(), queue="a", store="keys", metrics=Metrics(), logger=_LOG)
    again.start()  # after the last one closed: a new pair
    assert len(made) == 4
    again.close()
