"""An emitter that becomes active again in the same process reads every slot again.

Found by the chaos suite: after a broker restart the active emitter lost the
lease and took it back a few seconds later. Its warm timer consumer still had
the slots it had paused in the first active period paused (librdkafka keeps
a pause across ``unassign()``/``assign()``), the new drainer believed them
running, and nothing fired again. ``WheelSource.assign`` resumes every
partition now.
"""

from __future__ import annotations

import time

from confluent_kafka import Message

from dueflow.kafka.topics import names
from dueflow.streams.emitter.wheel_source import WheelSource
from tests.conftest import KafkaCluster
from tests.support.emitters import SMALL_WHEEL, ensure_topics
from tests.support.timers import job_value, now_ms, timer_producer


def _read(source: WheelSource, partition: int, want: int, timeout_s: float) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(got) < want:
        for msg in source.consume(100, 0.1):
            if msg.error() is None and msg.partition() == partition:
                got.append(msg)
    return got


def test_a_slot_paused_in_an_earlier_active_period_is_read_in_the_next(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings = kafka.settings(prefix, queues="default:1", wheel=SMALL_WHEEL)
    ensure_topics(settings)
    topic = names(settings).timers
    slot = settings.wheel.total_partitions - 1  # a slot of the top level
    producer = timer_producer(settings)
    for i in range(3):
        producer.produce(topic, job_value(f"j{i}", queue="default", due_ms=now_ms()), b"k", slot)
    producer.flush(30)
    every = dict.fromkeys(range(settings.wheel.total_partitions), 0)

    source = WheelSource(settings)
    source.start()
    try:
        source.assign(every)
        assert len(_read(source, slot, 3, 30)) == 3
        source.pause(slot, 0)  # the drainer parks a slot that is not open yet
        source.unassign(settings.wheel.partitions)  # the lease is lost

        source.assign(every)  # active again, a new drainer
        again = _read(source, slot, 3, 10)
        assert [m.offset() for m in again] == [0, 1, 2]
    finally:
        source.close()
