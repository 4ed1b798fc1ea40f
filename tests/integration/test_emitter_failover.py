"""Emitter failover with real processes: kill -9 under load, and a clean SIGTERM."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow.config import Settings
from dueflow.kafka.topics import names
from tests.conftest import KafkaCluster
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    emitter_processes,
    wait_until,
)
from tests.support.timers import ExecLog, TimerLoad, now_ms, timer_producer, write_timers


@pytest.fixture(params=[False, True], ids=["acked", "transactional"])
def pair(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[list[EmitterSubprocess]]:
    emitter = {**FAST_EMITTER, "transactional": request.param}
    s = kafka.settings(prefix, queues="default:3", wheel=SMALL_WHEEL, emitter=emitter)
    with emitter_processes(s, tmp_path, 2) as procs:
        yield procs


def _active(procs: list[EmitterSubprocess]) -> EmitterSubprocess:
    wait_until(lambda: any(p.active_count() for p in procs), 60, "an active emitter")
    (active,) = [p for p in procs if p.active_count()]
    return active


@pytest.mark.timeout(120)
def test_kill_9_of_the_active_emitter_under_load_loses_nothing_and_counts_what_it_fires_again(
    pair: list[EmitterSubprocess],
) -> None:
    """Without transactions the standby fires again what the dead emitter fired
    after its last commit (workers skip the copies): never more than it counts
    as re-fires, never a third copy. In transactions: nothing twice."""
    settings = pair[0].settings
    active = _active(pair)
    standby = next(p for p in pair if p is not active)
    log = ExecLog(settings).start()
    try:
        with TimerLoad(settings, rate=400, seconds=6.0) as load:
            wait_until(lambda: log.poll() >= 0 and len(log.records) > 300, 30, "fires under load")
            killed = time.monotonic()
            active.kill()
            took_over = wait_until(
                lambda: standby.active_count() > 0, 30, "the standby to take over"
            )
        takeover_s = took_over - killed
        log.wait_for(len(load.dues), timeout_s=40)
        log.settle(quiet_s=1.5)
        counts = Counter(r.job_id for r in log.records)
        assert set(counts) == set(load.dues), f"lost {len(set(load.dues) - set(counts))}"
        copies = sum(n - 1 for n in counts.values())
        refires = standby.metric("dueflow_emitter_refires_total")
        assert refires is not None
        if settings.emitter.transactional:
            assert (copies, refires) == (0, 0), "duplicates on the exec topic"
        else:
            assert max(counts.values()) <= 2, "a third copy"
            assert copies <= refires, (copies, refires)
        assert all(
            r.fired_ms >= r.due_ms - AHEAD_MS and r.seen_ms >= r.due_ms - AHEAD_MS
            for r in log.records
        )
        # Takeover is bounded by the session timeout (plus slack for a loaded machine).
        assert takeover_s < settings.emitter.session_timeout_ms / 1000 + 10, takeover_s
        print(f"takeover after kill -9: {takeover_s:.2f}s; {copies} fired again of {refires:.0f}")
    finally:
        log.close()


@pytest.mark.timeout(90)
def test_sigterm_commits_leaves_the_group_and_the_standby_takes_over(
    pair: list[EmitterSubprocess],
) -> None:
    settings = pair[0].settings
    active = _active(pair)
    standby = next(p for p in pair if p is not active)
    log = ExecLog(settings).start()
    try:
        first = {f"a{i}": now_ms() + i for i in range(200)}
        write_timers(timer_producer(settings), settings, first.items())
        log.wait_for(len(first), timeout_s=30)
        assert active.terminate() == 0
        assert any(e.get("event") == "emitter stopped" for e in active.events())
        wait_until(lambda: standby.active_count() > 0, 30, "the standby to take over")
        second = {f"b{i}": now_ms() + 100 + i for i in range(200)}
        write_timers(timer_producer(settings), settings, second.items())
        log.wait_for(len(first) + len(second), timeout_s=30)
        log.settle(quiet_s=1.0)
        counts = Counter(r.job_id for r in log.records)
        assert set(counts) == set(first) | set(second)
        assert set(counts.values()) == {1}
    finally:
        log.close()


def _timer_offsets(settings: Settings, group: str) -> dict[int, int]:
    consumer = Consumer(settings.client_config(**{"group.id": group}))
    try:
        tps = [
            TopicPartition(names(settings).timers, p)
            for p in range(settings.wheel.total_partitions)
        ]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
    finally:
        consumer.close()


@pytest.mark.timeout(120)
def test_switching_to_transactions_goes_on_from_the_commits_made_without_them(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    """An emitter firing without transactions hands over (SIGTERM) to one firing in
    them, as a rollback does: it copied its last accepted commit into the offsets
    group, where a transactional emitter (and the 0.1.0 release, which reads only
    that group) finds it, so nothing is fired twice and nothing is lost."""
    s = kafka.settings(prefix, queues="default:3", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    assert not s.emitter.transactional
    with emitter_processes(s, tmp_path, 1) as (acked,):
        log = ExecLog(s).start()
        transactional = EmitterSubprocess(
            s, tmp_path / "transactional.log", {"DUEFLOW_EMITTER_TRANSACTIONAL": "true"}
        )
        try:
            wait_until(lambda: acked.active_count() > 0, 60, "the first emitter active")
            first = {f"a{i}": now_ms() + 5 * i for i in range(200)}
            write_timers(timer_producer(s), s, first.items())
            log.wait_for(len(first), timeout_s=30)
            transactional.start()
            wait_until(lambda: transactional.metric("dueflow_ready") == 1, 60, "a standby")
            assert acked.terminate() == 0
            lease = {
                p: at for p, at in _timer_offsets(s, names(s).emitter_group).items() if at >= 0
            }
            mirrored = _timer_offsets(s, names(s).emitter_offsets_group)
            assert lease, "nothing committed through the lease group"
            behind = {p: (at, mirrored[p]) for p, at in lease.items() if mirrored[p] < at}
            assert not behind, f"offsets group behind the lease group: {behind}"
            wait_until(lambda: transactional.active_count() > 0, 30, "the takeover")
            second = {f"b{i}": now_ms() + 100 + 5 * i for i in range(200)}
            write_timers(timer_producer(s), s, second.items())
            log.wait_for(len(first) + len(second), timeout_s=30)
            log.settle(quiet_s=1.0)
            counts = Counter(r.job_id for r in log.records)
            assert set(counts) == set(first) | set(second)
            assert set(counts.values()) == {1}, "fired twice"
            assert all(r.fired_ms >= r.due_ms - AHEAD_MS for r in log.records)
        finally:
            transactional.stop()
            log.close()
