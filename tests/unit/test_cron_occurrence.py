"""Cron occurrences in the wheel: records, state and decisions; the keeper with fakes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Message

from dueflow import headers as hdr
from dueflow.config import load_settings
from dueflow.model import Job
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.cron_occurrence import (
    CronState,
    Verdict,
    occurrence_id,
    occurrence_job,
    occurrence_timer,
    occurrence_verdict,
    placement_needed,
)
from dueflow.rules.cron import CronSchedule, MisfirePolicy, OverlapPolicy, occurrence_jitter_ms
from dueflow.rules.wheel import WheelGeometry
from dueflow.streams.emitter.cron_keeper import CronKeeper

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
GEO = WheelGeometry().validate()


def _schedule(**fields: Any) -> CronSchedule:
    base: dict[str, Any] = {
        "schedule_id": "nightly",
        "cron": "0 3 * * *",
        "timezone": "Europe/London",
        "queue": "default",
        "task": "report",
        "payload": b"{}",
        "version": 2,
        "created_ms": 0,
        "updated_ms": 0,
    }
    base.update(fields)
    return CronSchedule(**base)


def test_occurrence_record_is_a_cron_timer_keyed_by_its_job_id() -> None:
    sch = _schedule(jitter_ms=60_000)
    occ = 1_800_068_400_000  # 2027-01-16T03:00:00Z
    rec = occurrence_timer(sch, occ, now_ms=NOW, geometry=GEO)
    jitter = occurrence_jitter_ms("nightly", occ, 60_000)
    assert rec.key == f"nightly@{occ}".encode() == occurrence_id("nightly", occ).encode()
    assert rec.due_ms == occ + jitter
    h = rec.headers
    assert hdr.header_int(h, hdr.DUE) == occ + jitter
    assert hdr.header_text(h, hdr.KIND) == hdr.KIND_CRON
    assert hdr.header_text(h, hdr.SCHEDULE) == "nightly"
    assert hdr.header_int(h, hdr.SCHEDULE_VERSION) == 2
    assert hdr.header_int(h, hdr.OCCURRENCE) == occ
    job = Job.from_record(codec.decode("job", rec.value))
    assert (job.job_id, job.idempotency_key, job.due_ms) == (rec.key.decode(),) * 2 + (rec.due_ms,)
    assert (job.schedule_id, job.schedule_version, job.task) == ("nightly", 2, "report")
    assert GEO.locate(rec.partition)[0] == 2  # 19 h ahead: level 2 of the default wheel


def test_catchup_runs_have_no_jitter() -> None:
    job = occurrence_job(_schedule(jitter_ms=60_000), 5_000, created_ms=NOW, jitter=False)
    assert (job.due_ms, job.jitter_ms) == (5_000, 0)


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        (None, {}, CronState(2, 1_800_068_400_000)),  # new: first occurrence after now
        (CronState(2, 123), {}, None),  # the wheel holds this version already
        (CronState(1, 123), {}, CronState(2, 1_800_068_400_000)),  # updated
        (CronState(5, 123), {}, CronState(2, 1_800_068_400_000)),  # deleted and made again
        (None, {"paused": True}, CronState(2, None)),  # paused: nothing placed
        (None, {"end_ms": NOW}, CronState(2, None)),  # ended
    ],
)
def test_placement_needed(
    state: CronState | None, fields: dict[str, Any], expected: CronState | None
) -> None:
    assert placement_needed(_schedule(**fields), state, now_ms=NOW) == expected


@pytest.mark.parametrize(
    ("schedule", "version", "verdict"),
    [
        (None, 1, Verdict.DELETED),
        (_schedule(), 1, Verdict.STALE),
        (_schedule(paused=True), 2, Verdict.PAUSED),
        (_schedule(), 2, Verdict.FIRE),
    ],
)
def test_occurrence_verdict(schedule: CronSchedule | None, version: int, verdict: Verdict) -> None:
    assert occurrence_verdict(schedule, version=version) is verdict


@pytest.mark.parametrize("raw", [None, b"", b"x", b'{"version": "2", "next_ms": null}', b"[]"])
def test_foreign_state_is_no_state(raw: bytes | None) -> None:
    assert CronState.decode(raw) is None


def test_state_round_trip() -> None:
    for st in (CronState(3, None), CronState(7, 1_800_000_000_000)):
        assert CronState.decode(st.encode()) == st


# ------------------------------------------------------------------ the keeper


class _Table:
    topic = "p.schedules"

    def __init__(self, *schedules: CronSchedule) -> None:
        self.by_id = {s.schedule_id: s for s in schedules}
        self.bad: list[Any] = []

    def get(self, sid: str) -> CronSchedule | None:
        return self.by_id.get(sid)

    def ids(self) -> list[str]:
        return list(self.by_id)


class _Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, Any, int]] = []

    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None:
        self.records.append((topic, value, key, headers, partition))

    def to(self, suffix: str) -> list[tuple[str, bytes | None, bytes | None, Any, int]]:
        return [r for r in self.records if r[0].endswith(suffix)]


def _keeper(*schedules: CronSchedule) -> tuple[CronKeeper, _Sent, list[tuple[Any, ...]]]:
    settings = load_settings(env={}, overrides={"topic_prefix": "p"})
    sent = _Sent()
    keeper = CronKeeper(settings, Metrics(), _Table(*schedules), sent)  # type: ignore[arg-type]
    return keeper, sent, []


def _occurrence_message(sch: CronSchedule, occ: int) -> tuple[Message, list[Any]]:
    rec = occurrence_timer(sch, occ, now_ms=occ - 10_000, geometry=GEO)
    m = Message(
        topic="p.timers", partition=1, offset=9, key=rec.key, value=rec.value, headers=rec.headers
    )
    return m, list(rec.headers)


def test_keeper_places_new_schedules_once() -> None:
    every = _schedule(cron="*/10 * * * *", timezone="UTC")
    keeper, sent, _ = _keeper(every)
    keeper.start(state={}, quarantined_to={}, now_ms=NOW)
    assert len(sent.to(".timers")) == 1
    assert CronState.decode(sent.to(".emitter.cron")[0][1]) == CronState(2, NOW + 600_000)
    keeper.reconcile("nightly", NOW)  # nothing changed: nothing placed again
    assert len(sent.to(".timers")) == 1


def test_keeper_fires_a_due_occurrence_and_places_the_next_in_one_go() -> None:
    every = _schedule(cron="*/10 * * * *", timezone="UTC")
    keeper, sent, _ = _keeper(every)
    m, headers = _occurrence_message(every, NOW)
    fired: list[Any] = []
    keeper.fire_occurrence(m, NOW, "p.exec.default", headers, NOW + 50, _collect(fired))
    assert [(t, k, d, p) for t, _v, k, _h, d, p in fired] == [
        ("p.exec.default", f"nightly@{NOW}".encode(), NOW, -1)  # the key's partition
    ]
    (placed,) = sent.to(".timers")
    assert placed[2] == f"nightly@{NOW + 600_000}".encode()
    assert CronState.decode(sent.to(".emitter.cron")[0][1]) == CronState(2, NOW + 600_000)


def test_keeper_drops_stale_paused_and_deleted_occurrences() -> None:
    old = _schedule(cron="*/10 * * * *", timezone="UTC", version=1)
    fired: list[Any] = []
    for table in ((_schedule(version=2),), (_schedule(version=1, paused=True),), ()):
        keeper, sent, _ = _keeper(*table)
        m, headers = _occurrence_message(old, NOW)
        keeper.fire_occurrence(m, NOW, "p.exec.default", headers, NOW, _collect(fired))
        assert sent.records == []
    assert fired == []


class _collect:  # noqa: N801 - an Emit that records its calls
    def __init__(self, into: list[Any]) -> None:
        self.into = into

    def __call__(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[Any],
        due: int,
        partition: int = -1,
    ) -> None:
        self.into.append((topic, value, key, headers, due, partition))


@pytest.mark.parametrize(
    ("policy", "runs"),
    [(MisfirePolicy.FIRE_ALL, 4), (MisfirePolicy.FIRE_ONCE, 2), (MisfirePolicy.SKIP, 1)],
)
def test_keeper_applies_the_misfire_policy(policy: MisfirePolicy, runs: int) -> None:
    sch = _schedule(cron="*/10 * * * *", timezone="UTC", misfire=policy)
    keeper, _sent, _ = _keeper(sch)
    m, headers = _occurrence_message(sch, NOW)
    calls: list[Any] = []
    later = NOW + 1_800_000 + 5_000  # down for 30 minutes: 3 missed, then one on time
    keeper.fire_occurrence(m, NOW, "p.exec.default", headers, later, _collect(calls))
    fired = [c[4] for c in calls]
    assert len(fired) == runs
    assert all(d <= later for d in fired)


@pytest.mark.parametrize("policy", [OverlapPolicy.SKIP, OverlapPolicy.BUFFER_ONE])
def test_occurrences_of_a_schedule_with_an_overlap_policy_go_to_its_partition(
    policy: OverlapPolicy,
) -> None:
    """Every occurrence (missed ones too) on the partition of the schedule id, with the
    policy in its headers: one worker sees them all."""
    from dueflow.rules.partitioning import partition_for_key

    sch = _schedule(cron="*/10 * * * *", timezone="UTC", misfire=MisfirePolicy.FIRE_ALL)
    sch = replace(sch, overlap=policy)
    keeper, _sent, _ = _keeper(sch)
    m, headers = _occurrence_message(sch, NOW)
    assert hdr.header(headers, hdr.OVERLAP) == policy.value.encode()
    calls: list[Any] = []
    keeper.fire_occurrence(m, NOW, "p.exec.default", headers, NOW + 1_800_000, _collect(calls))
    assert len(calls) > 1
    parts = load_settings(env={}, overrides={"topic_prefix": "p"}).queue("default").partitions
    assert {c[5] for c in calls} == {partition_for_key(b"nightly", parts)}
    assert all(hdr.header(c[3], hdr.OVERLAP) == policy.value.encode() for c in calls)
