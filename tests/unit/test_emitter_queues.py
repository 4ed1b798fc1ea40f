"""The emitter's queues: a timer for a queue its registry tail has not seen yet fires.

A producer that saw a queue registered may write a timer for it before the
emitter's tail reads the registry record; the emitter then reads the registry
to its end before it calls the queue unknown (and quarantines the timer).
"""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.config import QueueSpec, load_settings
from dueflow.records.queue_registry import encode_queue
from dueflow.streams.emitter.target_queues import EmitterQueues, QueueTopics
from tests.support.sim_wheel import SimWheel

SETTINGS = load_settings(
    env={},
    overrides={
        "topic_prefix": "df",
        "wheel": {
            "levels": "12x250,10x2000,6x16000",
            "near_partitions": 2,
            "near_window_ms": 500,
            "lookahead_ms": 100,
        },
    },
)


class LateTail(QueueTopics):
    """Queues whose registry records the tail has not read yet: ``learn`` finds them."""

    def __init__(self, registered: set[str]) -> None:
        super().__init__(SETTINGS)
        self.registered = registered
        self.asked: list[bytes] = []

    def learn(self, queue: bytes, appended_ms: int) -> bool:
        self.asked.append(queue)
        if queue.decode() not in self.registered:
            return False
        self.update([*SETTINGS.queues, *(QueueSpec(q) for q in self.registered)])
        return True


@pytest.mark.parametrize("due", [10_100, 15_000], ids=["near", "level-1 slot"])
def test_a_timer_for_a_queue_registered_a_moment_ago_fires_into_it(due: int) -> None:
    tail = LateTail({"billing"})
    sim = SimWheel(SETTINGS, queues=tail)
    sim.schedule("j", due, 10_000, queue="billing")
    sim.schedule("lost", due, 10_000, queue="nope")
    d = sim.drainer(10_000)
    for t in range(10_000, due + 200, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    assert [(f.key, f.topic) for f in sim.fired] == [(b"j", "df.exec.billing")]
    assert sim.quarantined == [b"lost"]  # a queue nobody registered: set aside, once
    assert tail.asked.count(b"nope") == 1
    assert tail.asked.count(b"billing") == 1  # known from then on


class FakeReader:
    """The registry reader, without a broker: ``catch_up`` reads what was written."""

    def __init__(self, queues: EmitterQueues) -> None:
        self.catalog = queues.reader.catalog
        self.written: list[tuple[Any, ...]] = []
        self.reads = 0

    def catch_up(self, timeout_s: float = 0.0) -> bool:
        self.reads += 1
        for key, value, headers in self.written:
            self.catalog.apply(key, value, headers)
        self.written.clear()
        return True


def test_learn_reads_the_registry_unless_a_read_began_after_the_timer_was_appended() -> None:
    now = [10_000]
    queues = EmitterQueues(SETTINGS, clock_ms=lambda: now[0])
    fake = FakeReader(queues)
    queues.reader.catch_up = fake.catch_up  # type: ignore[method-assign]
    queues.reader.take_changes = lambda: set()  # type: ignore[method-assign]
    assert queues.learn(b"billing", appended_ms=9_900) is False
    assert fake.reads == 1
    # Timers appended well before that read began are judged by it: no new read.
    assert queues.learn(b"billing", appended_ms=8_000) is False
    assert queues.learn(b"other", appended_ms=8_999) is False
    assert fake.reads == 1
    # The queue gets registered; a timer written after it (and after the last read) asks.
    fake.written.append(encode_queue(QueueSpec("billing", 2), created_ms=1, created_by="t"))
    now[0] = 12_000
    assert queues.learn(b"billing", appended_ms=11_500) is True
    assert fake.reads == 2
    assert queues.exec_topics[b"billing"] == "df.exec.billing"
    assert queues.learn(b"billing", appended_ms=1) is True  # known: no read at all
    assert fake.reads == 2


def test_queue_topics_change_in_place_for_whoever_holds_them() -> None:
    topics = QueueTopics(SETTINGS)
    held, by_topic = topics.exec_topics, topics.queue_of_topic
    partitions = topics.exec_partitions
    topics.update([QueueSpec("default"), QueueSpec("billing", 3)])
    assert held == {b"default": "df.exec.default", b"billing": "df.exec.billing"}
    assert partitions == {b"default": 6, b"billing": 3}
    topics.update([QueueSpec("billing", 3)])
    assert held == {b"billing": "df.exec.billing"}
    assert partitions == {b"billing": 3}
    assert by_topic == {"df.exec.billing": "billing"}
