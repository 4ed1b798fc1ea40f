"""The emitter against a real broker, with a wheel that turns in seconds."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules.cron_schedule import CronSchedule
from dueflow.rules.wheel import NEAR_LEVEL, place_timer
from tests.conftest import KafkaCluster
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    ensure_topics,
    threaded_emitter,
)
from tests.support.schedules import put_schedule
from tests.support.timers import ExecLog, now_ms, timer_producer, write_timers


def _settings(kafka: KafkaCluster, prefix: str, **emitter: Any) -> Settings:
    s = kafka.settings(
        prefix, queues="default:3", wheel=SMALL_WHEEL, emitter={**FAST_EMITTER, **emitter}
    )
    ensure_topics(s)
    return s


def _assert_once_never_early(log: ExecLog, expected: set[str]) -> None:
    counts = Counter(r.job_id for r in log.records)
    assert set(counts) == expected, f"missing {sorted(expected - set(counts))[:10]}"
    assert set(counts.values()) == {1}, [k for k, c in counts.items() if c > 1][:10]
    early = [
        r
        for r in log.records
        if r.fired_ms < r.due_ms - AHEAD_MS or r.seen_ms < r.due_ms - AHEAD_MS
    ]
    assert not early, early[:5]


@pytest.mark.timeout(90)
def test_never_early_across_every_level_and_cascade(kafka: KafkaCluster, prefix: str) -> None:
    s = _settings(kafka, prefix)
    log = ExecLog(s).start()
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            # Planned once the emitter is active (a slow start must not move the
            # timers down the wheel): overdue, near, level 0, 1, 2 and beyond the
            # top (parked, then placed again).
            start = now_ms()
            dues = {f"j{i}": start - 2_000 + i * 11 for i in range(1_400)}  # to 13.4 s ahead
            levels = Counter(
                place_timer(due_ms=d, now_ms=start, geometry=s.wheel, spread=0).level
                for d in dues.values()
            )
            assert set(levels) == {NEAR_LEVEL, 0, 1, 2}
            assert max(dues.values()) - start > s.wheel.reach_ms(2)  # some parked at the top
            write_timers(timer_producer(s), s, dues.items(), at_ms=start)
            log.wait_for(len(dues), timeout_s=40)
            log.settle(quiet_s=1.0)
            assert em.metric("dueflow_timers_cascaded_total", {"level": "1"}) > 0
            assert em.metric("dueflow_timers_cascaded_total", {"level": "2"}) > 0
            assert em.metric("dueflow_fires_total", {"queue": "default"}) == len(dues)
            assert em.metric("dueflow_emitter_leader") == 1
        _assert_once_never_early(log, set(dues))
        # Exec records keep the value bytes and carry where and when they fired.
        r = log.records[0]
        assert r.source.startswith(names(s).timers + ":")
    finally:
        log.close()


@pytest.mark.timeout(90)
def test_after_downtime_every_overdue_timer_fires_once_at_the_catchup_rate(
    kafka: KafkaCluster, prefix: str
) -> None:
    rate = 400.0
    s = _settings(kafka, prefix, catchup_max_rate_per_s=rate)
    producer = timer_producer(s)
    log = ExecLog(s).start()
    try:
        before = {f"p{i}": now_ms() + i for i in range(50)}
        with threaded_emitter(s) as em:
            em.wait_active()
            write_timers(producer, s, before.items())
            log.wait_for(len(before), timeout_s=20)  # fired and committed before the stop
        stopped = now_ms()
        # While it is down: timers for every level, due during the outage.
        dues = {f"a{i}": stopped + 300 + i * 5 for i in range(800)}  # 0.3 .. 4.3 s
        write_timers(producer, s, dues.items())
        more = {f"b{i}": now_ms() + 100 + i * 3 for i in range(400)}
        write_timers(producer, s, more.items())
        dues.update(more)
        # Down for longer than one full rotation of level 0 (0.8 s) and level 1 (4 s).
        while now_ms() < max(dues.values()) + 1_000 or now_ms() < stopped + 5_000:
            log.poll(0.1)
        assert len(log.records) == len(before)
        with threaded_emitter(s) as em:
            log.wait_for(len(dues) + len(before), timeout_s=40)
            log.settle(quiet_s=1.0)
            assert em.metric("dueflow_fires_total", {"queue": "default"}) == len(dues)
        _assert_once_never_early(log, set(dues) | set(before))
        fired = sorted(r.fired_ms for r in log.records if r.job_id in dues)
        per_second = Counter((t - fired[0]) // 1_000 for t in fired)
        assert max(per_second.values()) <= rate * 1.1 + rate / 20 + 5, per_second
    finally:
        log.close()


def _quarantined(s: Settings, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    c = Consumer(
        s.client_config(**{"group.id": f"q-{s.topic_prefix}", "isolation.level": "read_committed"})
    )
    c.assign([TopicPartition(names(s).quarantine, 0, 0)])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(100, 0.2):
                if m.error() is None:
                    out.append(codec.decode("quarantined", m.value() or b""))
    finally:
        c.close()
    return out


@pytest.mark.timeout(60)
def test_malformed_timers_are_quarantined_and_the_next_one_fires(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    topic = names(s).timers
    producer = timer_producer(s)
    due = str(now_ms() + 200).encode()
    bad: list[tuple[bytes, list[tuple[str, str | bytes | None]]]] = [
        (b"no-due", [(hdr.QUEUE, b"default")]),
        (b"bad-due", [(hdr.DUE, b"tomorrow"), (hdr.QUEUE, b"default")]),
        (b"no-queue", [(hdr.DUE, due)]),
        (b"unknown-queue", [(hdr.DUE, due), (hdr.QUEUE, b"nope")]),
    ]
    log = ExecLog(s).start()
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            for key, headers in bad:
                producer.produce(topic, b"v", key, 0, headers=headers)
            write_timers(producer, s, [("good", now_ms() + 200)])
            log.wait_for(1, timeout_s=20)
            found = _quarantined(s, len(bad))
            assert (
                em.metric(
                    "dueflow_quarantined_total", {"component": "emitter", "reason": "unknown queue"}
                )
                == 1
            )
        assert [r.job_id for r in log.settle(quiet_s=0.5)] == ["good"]
        assert sorted(r["key"] for r in found) == sorted(k for k, _ in bad)
        reasons = {r["key"]: r["reason"] for r in found}
        assert reasons[b"no-due"] == "missing df-due header"
        assert reasons[b"unknown-queue"] == "unknown queue: 'nope'"
        assert all(r["component"] == "emitter" and r["source_topic"] == topic for r in found)
    finally:
        log.close()


@pytest.mark.timeout(90)
def test_a_cron_occurrence_with_an_occurrence_out_of_range_is_quarantined(
    kafka: KafkaCluster, prefix: str
) -> None:
    """A timer of a schedule the emitter keeps, with df-sv its version and a
    df-occurrence of -10**30: its misfire plan raised InvalidInput inside the
    emitter, which ended the emitter (and its successor, on the same record)."""
    s = _settings(kafka, prefix)
    topic = names(s).timers
    producer = timer_producer(s)
    yearly = CronSchedule(
        schedule_id="yearly",
        cron="0 0 1 1 *",
        timezone="UTC",
        queue="default",
        task="tick",
        payload=b"{}",
        version=7,
        created_ms=now_ms(),
        updated_ms=now_ms(),
    )
    log = ExecLog(s).start()
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            put_schedule(producer, s, yearly)
            deadline = time.monotonic() + 30
            while em.process is not None and em.process.schedules.get("yearly") is None:
                assert time.monotonic() < deadline, "the emitter did not read the schedule"
                time.sleep(0.05)  # polling the emitter's table, with a deadline
            headers: list[tuple[str, str | bytes | None]] = [
                (hdr.DUE, str(now_ms()).encode()),
                (hdr.QUEUE, b"default"),
                (hdr.KIND, b"cron"),
                (hdr.SCHEDULE, b"yearly"),
                (hdr.SCHEDULE_VERSION, b"7"),
                (hdr.OCCURRENCE, b"-" + b"1" + b"0" * 30),
            ]
            producer.produce(topic, b"v", b"yearly@forged", 0, headers=headers)
            write_timers(producer, s, [("good", now_ms() + 200)])
            log.wait_for(1, timeout_s=20)
            (found,) = _quarantined(s, 1)
            assert em.error is None
            assert em.thread is not None
            assert em.thread.is_alive()
        assert [r.job_id for r in log.settle(quiet_s=0.5)] == ["good"]
        assert found["key"] == b"yearly@forged"
        assert found["reason"].startswith("bad cron header: df-occurrence: ")
    finally:
        log.close()


@pytest.mark.timeout(60)
def test_pending_gauges_come_from_offsets_and_fired_records_are_deleted(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    producer = timer_producer(s)
    start = now_ms()
    far = {f"far{i}": start + 60_000 + i for i in range(150)}  # beyond the top: parked
    soon = {f"soon{i}": start + 100 + i for i in range(100)}
    write_timers(producer, s, far.items())
    log = ExecLog(s).start()
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            write_timers(producer, s, soon.items())
            log.wait_for(len(soon), timeout_s=20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                em.metric("dueflow_timers_pending", {"level": "2"}) != len(far)
                or em.metric("dueflow_timers_pending", {"level": "near"}) != 0
            ):
                log.poll(0.1)
            assert em.metric("dueflow_timers_pending", {"level": "2"}) == len(far)
            assert em.metric("dueflow_timers_pending", {"level": "near"}) == 0
            # Records below the committed offsets are deleted (the topic keeps no time
            # retention): the near partitions start where the emitter committed.
            c = Consumer(s.client_config(**{"group.id": f"w-{prefix}"}))
            try:
                near = [TopicPartition(names(s).timers, p) for p in range(s.wheel.near_partitions)]
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    low_high = [c.get_watermark_offsets(tp, timeout=5) for tp in near]
                    if all(lo == hi for lo, hi in low_high if hi > 0):
                        break
                    log.poll(0.1)
                assert all(lo == hi for lo, hi in low_high if hi > 0), low_high
                assert any(hi > 0 for _, hi in low_high)
            finally:
                c.close()
    finally:
        log.close()
    assert {r.job_id for r in log.records} == set(soon)
