"""Cron schedules through the emitter: DST in a test zone, updates, pause, delete, misfires."""

from __future__ import annotations

import time
import zlib
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from dueflow.config import Settings
from dueflow.model import Job
from dueflow.records import codec
from dueflow.rules.cron import (
    CronSchedule,
    MisfirePolicy,
    fire_time_ms,
    next_fire,
    parse_cron,
    zone,
)
from dueflow.rules.wheel import shard_for
from tests.conftest import KafkaCluster
from tests.support.emitters import (
    AHEAD_MS,
    FAST_EMITTER,
    SMALL_WHEEL,
    ensure_topics,
    threaded_emitter,
)
from tests.support.schedules import delete_schedule, installed_zones, put_schedule, tzif_v1
from tests.support.timers import ExecLog, Fired, now_ms, timer_producer


def _settings(kafka: KafkaCluster, prefix: str, **emitter: Any) -> Settings:
    s = kafka.settings(
        prefix, queues="default:3", wheel=SMALL_WHEEL, emitter={**FAST_EMITTER, **emitter}
    )
    ensure_topics(s)
    return s


def _schedule(sid: str, cron: str, tz: str, **fields: Any) -> CronSchedule:
    base: dict[str, Any] = {
        "schedule_id": sid,
        "cron": cron,
        "timezone": tz,
        "queue": "default",
        "task": "tick",
        "payload": b"v1",
        "version": 1,
        "created_ms": now_ms(),
        "updated_ms": now_ms(),
    }
    base.update(fields)
    return CronSchedule(**base)


def _occurrences(records: list[Fired], sid: str) -> list[int]:
    """Occurrence instants fired for ``sid`` (job id ``<sid>@<occurrence>``)."""
    return sorted(
        int(r.job_id.rsplit("@", 1)[1]) for r in records if r.job_id.startswith(sid + "@")
    )


def _chain(expr: str, tz: str, first: int, last: int) -> list[int]:
    """Every occurrence in [first, last], by the core's next_fire."""
    out, at = [first], first
    while True:
        nxt = next_fire(parse_cron(expr), after_ms=at, tz=tz)
        if nxt is None or nxt > last:
            return out
        out.append(nxt)
        at = nxt


@pytest.mark.timeout(120)
def test_cron_across_dst_gap_and_repeat_fires_at_the_documented_instants(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = _settings(kafka, prefix)
    t0 = int(time.time()) + 16  # the transitions, a few seconds from now (epoch s)
    zones = {
        # Spring forward by 20 s at t0: wall times [t0, t0+20) do not exist.
        "Gap": tzif_v1((0, False, "TST"), [(t0, 20, True, "TDT")]),
        # Fall back by 20 s at t0: wall times [t0, t0+20) happen twice.
        "Rep": tzif_v1((0, False, "TST"), [(t0 - 864_000, 20, True, "TDT"), (t0, 0, False, "TST")]),
    }
    wall = datetime.fromtimestamp(t0 + 10, UTC)  # a wall time in the gap and in the repeat
    daily = f"{wall.second} {wall.minute} {wall.hour} * * *"
    with installed_zones(tmp_path, zones) as z:
        gap, rep = z["Gap"], z["Rep"]
        offset = datetime.fromtimestamp(t0, zone(gap)).utcoffset()
        assert offset is not None
        assert offset.seconds == 20
        schedules = [
            _schedule("gap-daily", daily, gap),  # gap: fires at the fold=0 instant, t0+10
            _schedule("rep-daily", daily, rep),  # repeat, hour named: once, first pass, t0-10
            _schedule("gap-5s", "*/5 * * * * *", gap),  # every hour allowed: every real 5 s
            _schedule("rep-5s", "*/5 * * * * *", rep),  # ... both passes of the repeat
        ]
        producer = timer_producer(s)
        log = ExecLog(s).start()
        end = (t0 + 30) * 1000
        try:
            with threaded_emitter(s) as em:
                em.wait_active()
                for sch in schedules:
                    put_schedule(producer, s, sch)
                while now_ms() < end + 1_500:
                    log.poll(0.1)
                log.settle(quiet_s=0.5)
                assert em.metric("dueflow_cron_occurrences_total", {"result": "fired"}) >= 10
        finally:
            log.close()
        records = log.records
        counts = Counter(r.job_id for r in records)
        assert set(counts.values()) == {1}, "an occurrence fired twice"
        assert all(
            r.fired_ms >= r.due_ms - AHEAD_MS and r.seen_ms >= r.due_ms - AHEAD_MS for r in records
        )
        # The documented rules, by hand:
        assert _occurrences(records, "gap-daily") == [(t0 + 10) * 1000]
        assert _occurrences(records, "rep-daily") == [(t0 - 10) * 1000]
        # Every-5-seconds schedules keep firing through the transitions, one chain each.
        for sid, tz in (("gap-5s", gap), ("rep-5s", rep)):
            fired = [o for o in _occurrences(records, sid) if o <= end]
            assert fired[0] < (t0 - 5) * 1000, fired
            assert fired[-1] > (t0 + 20) * 1000, fired
            assert fired == _chain("*/5 * * * * *", tz, fired[0], fired[-1])
    # The jobs carry the schedule's payload, version and idempotency key = job id.
    job = Job.from_record(codec.decode("job", _value_of(records, "gap-daily")))
    assert (job.payload, job.schedule_id, job.schedule_version) == (b"v1", "gap-daily", 1)
    assert job.idempotency_key == job.job_id == f"gap-daily@{(t0 + 10) * 1000}"


def _value_of(records: list[Fired], sid: str) -> bytes:
    (r,) = [r for r in records if r.job_id.startswith(sid + "@")]
    return r.value


@pytest.mark.timeout(120)
def test_update_pause_resume_and_delete_take_effect_from_the_next_occurrence(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = _settings(kafka, prefix)
    producer = timer_producer(s)
    log = ExecLog(s).start()

    def payloads() -> list[bytes]:
        return [
            Job.from_record(codec.decode("job", r.value)).payload
            for r in sorted(log.records, key=lambda r: r.due_ms)
        ]

    def wait_fires(count: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(log.records) < count and time.monotonic() < deadline:
            log.poll(0.05)
        assert len(log.records) >= count

    def quiet_for(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            log.poll(0.05)

    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            every = "*/1 * * * * *"
            put_schedule(producer, s, _schedule("u", every, "UTC"))
            wait_fires(3)
            put_schedule(producer, s, _schedule("u", every, "UTC", version=2, payload=b"v2"))
            n = len(log.records)
            wait_fires(n + 3)
            put_schedule(producer, s, _schedule("u", every, "UTC", version=3, paused=True))
            quiet_for(1.5)  # an occurrence already due may still fire
            paused_at = len(log.records)
            quiet_for(2.5)
            assert len(log.records) == paused_at, "a paused schedule fired"
            put_schedule(producer, s, _schedule("u", every, "UTC", version=4, payload=b"v4"))
            wait_fires(paused_at + 2)
            delete_schedule(producer, s, "u")
            quiet_for(1.5)
            deleted_at = len(log.records)
            quiet_for(2.5)
            assert len(log.records) == deleted_at, "a deleted schedule fired"
            assert em.metric("dueflow_cron_occurrences_total", {"result": "stale"}) >= 1
        log.settle(quiet_s=0.5)
    finally:
        log.close()
    seen = payloads()
    assert seen[:3] == [b"v1"] * 3
    assert b"v2" in seen
    assert b"v4" in seen
    assert b"v3" not in seen
    # Each version takes over from the next occurrence: no v1 after a v2, no v2 after a v4.
    assert seen == sorted(seen)
    counts = Counter(r.job_id for r in log.records)
    assert set(counts.values()) == {1}
    assert all(r.fired_ms >= r.due_ms - AHEAD_MS for r in log.records)


@pytest.mark.timeout(120)
def test_misfire_policies_after_downtime(kafka: KafkaCluster, prefix: str) -> None:
    s = _settings(kafka, prefix, misfire_grace_ms=400)
    producer = timer_producer(s)
    log = ExecLog(s).start()
    policies = {f"m-{p.value}": p for p in MisfirePolicy}
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            for sid, policy in policies.items():
                put_schedule(producer, s, _schedule(sid, "*/1 * * * * *", "UTC", misfire=policy))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(
                len(_occurrences(log.records, sid)) >= 2 for sid in policies
            ):
                log.poll(0.05)
        stopped = now_ms()
        while now_ms() < stopped + 4_000:  # down for 4 s: 4 occurrences of each missed
            log.poll(0.1)
        with threaded_emitter(s) as em:
            em.wait_active()
            restarted = now_ms()
            while now_ms() < restarted + 3_000:
                log.poll(0.05)
        log.settle(quiet_s=0.5)
    finally:
        log.close()
    counts = Counter(r.job_id for r in log.records)
    assert set(counts.values()) == {1}
    assert all(r.fired_ms >= r.due_ms - AHEAD_MS for r in log.records)

    def missed(sid: str) -> list[int]:
        # fired occurrences that were due while the emitter was down (more than the
        # grace period before it came back; before it stopped, it fired those due
        # up to AHEAD_MS later)
        return [
            o for o in _occurrences(log.records, sid) if stopped + AHEAD_MS < o < restarted - 1_000
        ]

    assert len(missed("m-fire_all")) >= 3  # every missed run fired
    all_fired = _occurrences(log.records, "m-fire_all")
    assert all(b - a == 1_000 for a, b in pairwise(all_fired))
    assert len(missed("m-fire_once")) == 1  # coalesced into one run
    assert missed("m-skip") == []  # none of them
    for sid in policies:  # back on schedule after the restart
        assert any(o >= restarted + 1_000 for o in _occurrences(log.records, sid)), sid


@pytest.mark.timeout(120)
def test_jitter_beyond_the_misfire_grace_drops_no_on_time_run(
    kafka: KafkaCluster, prefix: str
) -> None:
    # Every second, 4 s of jitter, 1 s of grace, no downtime: every occurrence fires
    # at (or, behind an earlier one meant later, after) its jittered time, on time,
    # under every policy. Before, the keeper judged the nominal occurrence against
    # the grace: `skip` dropped each run whose jitter exceeded 1 s (3 in 4).
    s = _settings(kafka, prefix, misfire_grace_ms=1_000)
    producer = timer_producer(s)
    log = ExecLog(s).start()
    every = "*/1 * * * * *"
    schedules = [
        _schedule(f"j-{p.value}", every, "UTC", misfire=p, jitter_ms=4_000) for p in MisfirePolicy
    ]
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            for sch in schedules:
                put_schedule(producer, s, sch)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(
                len(_occurrences(log.records, sch.schedule_id)) >= 10 for sch in schedules
            ):
                log.poll(0.05)
            missed = em.metric("dueflow_cron_occurrences_total", {"result": "missed"})
        log.settle(quiet_s=0.5)
    finally:
        log.close()
    counts = Counter(r.job_id for r in log.records)
    assert set(counts.values()) == {1}, "an occurrence fired twice"
    assert missed == 0
    for sch in schedules:
        fired = _occurrences(log.records, sch.schedule_id)
        assert len(fired) >= 10, (sch.schedule_id, fired)
        assert fired == _chain(every, "UTC", fired[0], fired[-1]), sch.schedule_id  # no gap
        for r in log.records:
            if r.job_id.startswith(sch.schedule_id + "@"):
                occurrence = int(r.job_id.rsplit("@", 1)[1])
                assert r.fired_ms >= fire_time_ms(sch, occurrence) - AHEAD_MS, r  # its jitter kept
                assert r.fired_ms >= r.due_ms - AHEAD_MS


def _ids_per_shard(shards: int, count: int) -> list[str]:
    """``count`` schedule ids kept by each of ``shards`` shards."""
    out: dict[int, list[str]] = {s: [] for s in range(shards)}
    i = 0
    while any(len(v) < count for v in out.values()):
        sid = f"sh-{i}"
        owner = shard_for(zlib.crc32(sid.encode()), shards)
        if len(out[owner]) < count:
            out[owner].append(sid)
        i += 1
    return [sid for ids in out.values() for sid in ids]


@pytest.mark.timeout(120)
def test_each_shard_keeps_its_own_schedules_and_fires_them_once(
    kafka: KafkaCluster, prefix: str
) -> None:
    s = kafka.settings(
        prefix, queues="default:3", wheel={**SMALL_WHEEL, "shards": 3}, emitter=FAST_EMITTER
    )
    ensure_topics(s)
    producer = timer_producer(s)
    log = ExecLog(s).start()
    ids = _ids_per_shard(3, 2)
    try:
        with threaded_emitter(s) as em:
            em.wait_active()
            for sid in ids:
                put_schedule(producer, s, _schedule(sid, "*/1 * * * * *", "UTC"))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                len(_occurrences(log.records, sid)) >= 4 for sid in ids
            ):
                log.poll(0.05)
        log.settle(quiet_s=0.5)
    finally:
        log.close()
    assert set(Counter(r.job_id for r in log.records).values()) == {1}
    for sid in ids:
        fired = _occurrences(log.records, sid)
        assert len(fired) >= 4, sid
        assert all(b - a == 1_000 for a, b in pairwise(fired)), (sid, fired)
        owner = shard_for(zlib.crc32(sid.encode()), 3)
        shards = {
            s.wheel.shard_of(r.timer_partition)
            for r in log.records
            if r.job_id.startswith(sid + "@")
        }
        assert shards == {owner}, (sid, shards)
    assert all(r.fired_ms >= r.due_ms - AHEAD_MS for r in log.records)


@pytest.mark.timeout(150)
def test_schedules_move_to_their_shard_without_a_gap_when_shards_are_added(
    kafka: KafkaCluster, prefix: str
) -> None:
    one = kafka.settings(prefix, queues="default:3", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    ensure_topics(one)
    two = kafka.settings(
        prefix, queues="default:3", wheel={**SMALL_WHEEL, "shards": 2}, emitter=FAST_EMITTER
    )
    ids = _ids_per_shard(2, 2)
    producer = timer_producer(one)
    log = ExecLog(one).start()
    try:
        with threaded_emitter(one) as em:
            em.wait_active()
            for sid in ids:
                put_schedule(producer, one, _schedule(sid, "*/1 * * * * *", "UTC"))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(
                len(_occurrences(log.records, sid)) >= 2 for sid in ids
            ):
                log.poll(0.05)
        ensure_topics(two)  # grows the timer and lease topics
        with threaded_emitter(two) as em:
            em.wait_active()
            restarted = now_ms()
            while now_ms() < restarted + 4_000:
                log.poll(0.05)
            moved = em.metric("dueflow_cron_occurrences_total", {"result": "moved"})
        log.settle(quiet_s=0.5)
    finally:
        log.close()
    assert set(Counter(r.job_id for r in log.records).values()) == {1}
    assert moved >= 1  # the occurrences of shard 1's schedules placed in shard 0 came over
    for sid in ids:
        fired = _occurrences(log.records, sid)
        # the misfire grace covers the restart: one run a second, none twice, none lost
        assert all(b - a == 1_000 for a, b in pairwise(fired)), (sid, fired)
        assert fired[-1] >= restarted + 2_000, sid
        owner = shard_for(zlib.crc32(sid.encode()), 2)
        late = [
            r
            for r in log.records
            if r.job_id.startswith(sid + "@") and r.due_ms > restarted + 1_500
        ]
        assert {two.wheel.shard_of(r.timer_partition) for r in late} == {owner}, sid
