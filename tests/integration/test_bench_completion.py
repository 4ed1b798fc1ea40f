"""The end-to-end benchmark's completion watchers against the real broker: "done" is
the moment the workers' group has committed every exec record, not before; the
outcomes read afterwards count the duplicates and refuse a job without its own."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from benchmarks.completion import OUTCOMES_PER_JOB, OffsetWatcher, count_outcomes
from dueflow.config import Settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topics import names
from tests.conftest import KafkaCluster

pytestmark = pytest.mark.integration

QUEUE = "q"
JOBS = 9


def _topics(settings: Settings) -> tuple[str, str]:
    n = names(settings)
    exec_topic, outcomes = n.exec(QUEUE), n.outcomes
    admin = make_admin(settings)
    made = admin.create_topics([NewTopic(exec_topic, 3, 1), NewTopic(outcomes, 2, 1)])
    for future in made.values():
        future.result(30)
    return exec_topic, outcomes


def _produce(settings: Settings, records: list[tuple[str, int | None, bytes]]) -> None:
    producer = Producer(settings.client_config())
    for topic, partition, key in records:
        if partition is None:
            producer.produce(topic, b"v", key=key)
        else:
            producer.produce(topic, b"v", key=key, partition=partition)
    assert producer.flush(30) == 0


def _commit(settings: Settings, offsets: list[TopicPartition]) -> None:
    """Commit ``offsets`` for the workers' group, as a worker's transaction does."""
    group = names(settings).worker_group(QUEUE)
    consumer = Consumer(settings.client_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _answers_after(watcher: OffsetWatcher, count: int) -> None:
    """Wait until the watcher has read ``count`` more answers of the coordinator."""
    goal = watcher.asked.value + count
    deadline = time.monotonic() + 30
    while watcher.asked.value < goal:
        assert time.monotonic() < deadline, "the watcher stopped asking"
        time.sleep(0.01)


def test_done_once_every_exec_record_is_committed_and_not_before(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings = kafka.settings(prefix)
    exec_topic, _outcomes = _topics(settings)
    # 3 records on each partition: offsets 0-2
    _produce(settings, [(exec_topic, i % 3, f"job-{i}".encode()) for i in range(JOBS)])
    with OffsetWatcher(settings, QUEUE) as watcher:
        watcher.target.value = JOBS
        _answers_after(watcher, 3)
        assert watcher.done_at.value == 0.0  # nothing committed
        _commit(settings, [TopicPartition(exec_topic, p, 3) for p in (0, 1)])
        _commit(settings, [TopicPartition(exec_topic, 2, 2)])
        _answers_after(watcher, 3)
        assert watcher.done_at.value == 0.0  # one record of partition 2 is not
        before = time.time()
        _commit(settings, [TopicPartition(exec_topic, 2, 3)])
        done = watcher.wait(JOBS, 30)
        assert before <= done <= time.time()
        assert watcher.cpu_s() > 0


def test_done_waits_for_copies_past_the_job_count(kafka: KafkaCluster, prefix: str) -> None:
    """A copy the emitter fired again is one more exec record: committed offsets that
    add up to the job count but stop short of a partition's end are not done."""
    settings = kafka.settings(prefix)
    exec_topic, _outcomes = _topics(settings)
    _produce(settings, [(exec_topic, 0, f"job-{i}".encode()) for i in range(3)])
    _produce(settings, [(exec_topic, 1, b"job-0")])  # a copy of job-0
    with OffsetWatcher(settings, QUEUE) as watcher:
        watcher.target.value = 3
        _commit(settings, [TopicPartition(exec_topic, 0, 3)])
        _answers_after(watcher, 3)
        assert watcher.done_at.value == 0.0
        _commit(settings, [TopicPartition(exec_topic, 1, 1)])
        assert watcher.wait(3, 30) > 0


def test_outcomes_counted_after_the_run(kafka: KafkaCluster, prefix: str) -> None:
    settings = kafka.settings(prefix)
    _exec_topic, outcomes = _topics(settings)
    own = [(outcomes, None, f"job-{i}".encode()) for i in range(JOBS) for _ in range(2)]
    _produce(settings, [*own, (outcomes, None, b"job-4")])  # job-4's copy: `duplicate`
    assert OUTCOMES_PER_JOB == 2
    assert count_outcomes(settings, JOBS) == 1
    with pytest.raises(RuntimeError, match=f"{JOBS} of {JOBS + 1} jobs"):
        count_outcomes(settings, JOBS + 1)
