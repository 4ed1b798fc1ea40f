"""ControlTail.caught_up: a worker learns which queues are paused before it starts a job,
also when the control partition has no leader yet (a topic just created)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from dueflow.config import load_settings
from dueflow.consumers.pause_tail import ControlTail


class _Answers:
    """A stand-in for the tail's ConsumerThread: ``call`` answers from a script."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls = 0

    async def call(self, command: Callable[[Any], Any]) -> Any:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _tail(answers: list[Any]) -> tuple[ControlTail, _Answers]:
    tail = ControlTail(
        load_settings(env={}, overrides={"topic_prefix": "t"}),
        quarantine=None,  # type: ignore[arg-type]  # no record is read here
        on_change=lambda _queue, _paused: None,
        group="t.worker.control",
    )
    thread = _Answers(answers)
    tail._thread = thread  # type: ignore[assignment]
    return tail, thread


def _error(code: int) -> KafkaException:
    return KafkaException(KafkaError(code))


def test_a_partition_without_a_leader_yet_is_asked_again_until_it_answers() -> None:
    tail, thread = _tail(
        [
            _error(KafkaError.NOT_LEADER_FOR_PARTITION),
            _error(KafkaError.LEADER_NOT_AVAILABLE),
            (0, 0),  # then it answers: an empty control topic
        ]
    )
    assert asyncio.run(tail.caught_up(timeout_s=5.0, retry_s=0.01)) is True
    assert thread.calls == 3


def test_a_leaderless_partition_past_the_timeout_lets_the_worker_go_on() -> None:
    tail, thread = _tail([_error(KafkaError.NOT_LEADER_FOR_PARTITION)] * 100)
    assert asyncio.run(tail.caught_up(timeout_s=0.05, retry_s=0.01)) is False
    assert 2 <= thread.calls < 100


def test_a_missing_topic_is_not_waited_for() -> None:
    tail, thread = _tail([_error(KafkaError.UNKNOWN_TOPIC_OR_PART), (0, 0)])
    assert asyncio.run(tail.caught_up(timeout_s=5.0, retry_s=0.01)) is False
    assert thread.calls == 1
