"""The worker's DLQ depth gauge is asked of an admin client and never waited for."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow.consumers.dlq_depth import DlqDepth, depth_of


class Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class FakeAdmin:
    """``list_offsets`` hands back futures the test answers later (as the broker would)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[TopicPartition, Future[Any]]]] = []

    def list_offsets(
        self, topic_partition_offsets: Mapping[TopicPartition, Any], **kwargs: Any
    ) -> Mapping[TopicPartition, Future[Any]]:
        spec = next(iter(topic_partition_offsets.values()))
        end = "low" if type(spec).__name__ == "EarliestSpec" else "high"
        futures: dict[TopicPartition, Future[Any]] = {
            tp: Future() for tp in topic_partition_offsets
        }
        self.requests.append((end, futures))
        return futures

    def answer(self, end: str, offsets: dict[int, int | Exception]) -> None:
        for req_end, futures in self.requests:
            if req_end != end:
                continue
            for tp, future in futures.items():
                if future.done():
                    continue
                got = offsets[tp.partition]
                if isinstance(got, Exception):
                    future.set_exception(got)
                else:
                    future.set_result(Offset(got))


@pytest.mark.parametrize(
    ("low", "high", "depth"),
    [
        ({0: 0, 1: 0}, {0: 0, 1: 0}, 0),
        ({0: 3, 1: 0}, {0: 5, 1: 4}, 6),
        ({0: 5}, {0: 3}, 0),  # records deleted past the end read earlier: none, not negative
        ({0: 0}, {0: 2, 1: 3}, None),  # a partition unanswered: no figure
    ],
)
def test_depth_is_the_records_between_earliest_and_latest(
    low: dict[int, int], high: dict[int, int], depth: int | None
) -> None:
    assert depth_of(low, high) == depth


def test_ask_returns_at_once_and_the_gauge_is_set_when_both_ends_answer() -> None:
    admin = FakeAdmin()
    reported: list[int] = []
    watch = DlqDepth("p.dlq.jobs", 3, reported.append)
    assert not watch.ask()  # not started: nothing to ask with
    watch.start(admin)  # type: ignore[arg-type]
    assert watch.ask()
    assert [end for end, _ in admin.requests] == ["low", "high"]
    assert {tp.partition for tp in admin.requests[0][1]} == {0, 1, 2}
    assert {tp.topic for tp in admin.requests[1][1]} == {"p.dlq.jobs"}
    assert watch.asking()
    assert reported == []
    assert not watch.ask()  # one request at a time
    assert len(admin.requests) == 2
    admin.answer("low", {0: 0, 1: 2, 2: 0})
    assert reported == []
    admin.answer("high", {0: 4, 1: 3, 2: 0})
    assert reported == [5]
    assert not watch.asking()
    assert watch.ask()  # the next one goes out
    assert len(admin.requests) == 4


def test_a_failed_answer_leaves_the_gauge_alone_and_the_next_ask_goes_out() -> None:
    admin = FakeAdmin()
    reported: list[int] = []
    watch = DlqDepth("p.dlq.jobs", 2, reported.append)
    watch.start(admin)  # type: ignore[arg-type]
    watch.ask()
    admin.answer("low", {0: 0, 1: KafkaException(KafkaError(KafkaError._TIMED_OUT))})
    admin.answer("high", {0: 1, 1: 1})
    assert reported == []
    assert not watch.asking()
    watch.ask()
    admin.answer("low", {0: 0, 1: 0})
    admin.answer("high", {0: 1, 1: 1})
    assert reported == [2]


def test_a_refused_request_counts_as_answered() -> None:
    class Refusing(FakeAdmin):
        def list_offsets(self, topic_partition_offsets: Any, **kwargs: Any) -> Any:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    reported: list[int] = []
    watch = DlqDepth("p.dlq.jobs", 2, reported.append)
    watch.start(Refusing())  # type: ignore[arg-type]
    assert watch.ask()
    assert not watch.asking()
    assert reported == []
