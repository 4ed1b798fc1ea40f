"""Emitter failover with real processes: kill -9 under load, and a clean SIGTERM."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KafkaCluster
from tests.support.emitters import (
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    emitter_processes,
    wait_until,
)
from tests.support.timers import ExecLog, TimerLoad, now_ms, timer_producer, write_timers


@pytest.fixture
def pair(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[list[EmitterSubprocess]]:
    s = kafka.settings(prefix, queues="default:3", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    with emitter_processes(s, tmp_path, 2) as procs:
        yield procs


def _active(procs: list[EmitterSubprocess]) -> EmitterSubprocess:
    wait_until(lambda: any(p.active_count() for p in procs), 60, "an active emitter")
    (active,) = [p for p in procs if p.active_count()]
    return active


@pytest.mark.timeout(120)
def test_kill_9_of_the_active_emitter_under_load_loses_and_duplicates_nothing(
    pair: list[EmitterSubprocess],
) -> None:
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
        assert set(counts.values()) == {1}, "duplicates on the exec topic"
        assert all(r.fired_ms >= r.due_ms and r.seen_ms >= r.due_ms for r in log.records)
        # Takeover is bounded by the session timeout (plus slack for a loaded machine).
        assert takeover_s < settings.emitter.session_timeout_ms / 1000 + 10, takeover_s
        print(f"takeover after kill -9: {takeover_s:.2f}s")
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
