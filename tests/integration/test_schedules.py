"""Cron schedules through the scheduling client, against the real broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import ConflictError, InvalidInput
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.model import Backoff, BackoffKind
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from dueflow.rules.cron import MisfirePolicy
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, high_watermarks, read_all

WHEEL = {
    "levels": "10x1000,10x5000",
    "near_partitions": 2,
    "near_window_ms": 1500,
    "lookahead_ms": 200,
}


class StepClock:
    """Moves 1 ms per reading, from a fixed start: versions become predictable."""

    def __init__(self, start: int) -> None:
        self.now_ms = start

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, wheel=WHEEL, queues="default:3,reports:2")
    assert TopicAdmin(make_admin(s), replication_factor=1).ensure(topic_layout(s)).ok
    return s


@pytest.fixture
def clock() -> StepClock:
    return StepClock(1_800_000_000_000)


@pytest.fixture
def scheduler(settings: Settings, clock: StepClock) -> Iterator[Scheduler]:
    with Scheduler(settings, clock=clock) as s:
        yield s


def test_add_get_list_update_pause_resume_delete(
    settings: Settings, scheduler: Scheduler, clock: StepClock
) -> None:
    added = scheduler.add_schedule(
        "nightly-report",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        task="build_report",
        payload={"kind": "daily"},
        queue="reports",
        misfire="skip",
        jitter="1m",
        start="2027-01-01T00:00:00+01:00",
        max_attempts=2,
        backoff="fixed:1s:10s",
        timeout="10m",
        labels={"team": "data"},
    )
    assert added.version > 1_800_000_000_000
    assert (added.misfire, added.jitter_ms, added.timeout_ms) == (
        MisfirePolicy.SKIP,
        60_000,
        600_000,
    )
    assert added.backoff == Backoff(BackoffKind.FIXED, 1_000, 10_000)
    assert added.payload == b'{"kind":"daily"}'
    assert added.start_ms == 1_798_758_000_000
    scheduler.add_schedule("hourly", cron="@hourly", timezone="UTC", task="ping")
    assert scheduler.get_schedule("nightly-report") == added
    assert [s.schedule_id for s in scheduler.list_schedules()] == ["hourly", "nightly-report"]

    updated = scheduler.update_schedule("nightly-report", cron="30 4 * * 1-5", payload={"k": 2})
    assert updated.version > added.version
    assert (updated.cron, updated.payload, updated.task) == (
        "30 4 * * 1-5",
        b'{"k":2}',
        "build_report",
    )
    assert (updated.jitter_ms, updated.start_ms, updated.labels) == (
        60_000,
        added.start_ms,
        {"team": "data"},
    )
    assert updated.created_ms == added.created_ms
    assert updated.updated_ms > added.updated_ms

    paused = scheduler.pause_schedule("nightly-report")
    assert paused.paused
    assert paused.version > updated.version
    assert [s.schedule_id for s in scheduler.list_schedules(include_paused=False)] == ["hourly"]
    resumed = scheduler.resume_schedule("nightly-report")
    assert not resumed.paused
    assert resumed.version > paused.version
    assert scheduler.get_schedule("nightly-report") == resumed

    assert scheduler.delete_schedule("nightly-report") is True
    assert scheduler.delete_schedule("nightly-report") is False
    assert scheduler.get_schedule("nightly-report") is None
    assert [s.schedule_id for s in scheduler.list_schedules()] == ["hourly"]

    # Added again under the same id: versions keep growing past the deletion,
    # even when this client's clock is behind (here: set back an hour).
    clock.now_ms -= 3_600_000
    again = scheduler.add_schedule("nightly-report", cron="0 5 * * *", timezone="UTC", task="t")
    assert again.version > resumed.version + 1

    records = read_all(settings, names(settings).schedules)
    nightly = [m for m in records if m.key() == b"nightly-report"]
    assert len(nightly) == 6  # add, update, pause, resume, tombstone, add
    assert nightly[4].value() is None  # the tombstone
    assert hdr.header_int(headers_of(nightly[4]), hdr.SCHEDULE_VERSION) == resumed.version + 1
    versions = [hdr.header_int(headers_of(m), hdr.SCHEDULE_VERSION) or 0 for m in nightly]
    assert versions == sorted(versions)
    assert len({m.partition() for m in nightly}) == 1  # keyed by id: one partition
    # no overlap policy: written as version 1, which emitters of the previous release read
    assert hdr.header(headers_of(nightly[3]), hdr.SCHEMA) == b"dueflow.Schedule/1"
    value = codec.decode("schedule", nightly[3].value() or b"", writer_version=1)
    assert (value["version"], value["paused"]) == (resumed.version, False)
    scheduler.add_schedule("careful", cron="* * * * *", timezone="UTC", task="t", overlap="skip")
    (careful,) = [m for m in read_all(settings, names(settings).schedules) if m.key() == b"careful"]
    assert hdr.header(headers_of(careful), hdr.SCHEMA) == b"dueflow.Schedule/2"
    assert codec.decode("schedule", careful.value() or b"", writer_version=2)["overlap"] == "skip"
    assert scheduler.get_schedule("careful").overlap == "skip"  # type: ignore[union-attr]


def test_adding_the_same_definition_is_idempotent_another_is_a_conflict(
    settings: Settings, scheduler: Scheduler
) -> None:
    first = scheduler.add_schedule("s", cron="*/5 * * * *", timezone="UTC", task="t", payload=1)
    again = scheduler.add_schedule("s", cron="*/5 * * * *", timezone="UTC", task="t", payload=1)
    assert again == first
    with pytest.raises(ConflictError, match="schedule_id 's' already exists"):
        scheduler.add_schedule("s", cron="*/10 * * * *", timezone="UTC", task="t", payload=1)
    assert sum(high_watermarks(settings, [names(settings).schedules]).values()) == 1
    paused = scheduler.pause_schedule("s")
    # the same definition again leaves a paused schedule paused
    assert (
        scheduler.add_schedule("s", cron="*/5 * * * *", timezone="UTC", task="t", payload=1)
        == paused
    )
    assert sum(high_watermarks(settings, [names(settings).schedules]).values()) == 2


def bad_schedules() -> list[tuple[dict[str, Any], str]]:
    ok: dict[str, Any] = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "task": "t"}
    return [
        ({**ok, "cron": "61 * * * *"}, "cron"),
        ({**ok, "cron": "every day"}, "cron"),
        ({**ok, "timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({**ok, "timezone": "UTC+2"}, "timezone"),
        ({**ok, "queue": "nope"}, "queue"),
        ({**ok, "misfire": "sometimes"}, "misfire"),
        ({**ok, "start": "2030-01-01T00:00:00"}, "start"),
        ({**ok, "jitter": "-1m"}, "jitter"),
        ({**ok, "max_attempts": 0}, "max_attempts"),
        ({**ok, "backoff": "linear"}, "backoff"),
        ({**ok, "task": ""}, "task"),
        ({**ok, "payload": object()}, "payload"),
        # schedules that can never fire (the clock is at 2027-01-15)
        ({**ok, "cron": "0 0 30 2 *"}, "cron"),
        ({**ok, "end": "2026-01-01T00:00:00+00:00"}, "end"),
        (
            {
                **ok,
                "cron": "0 0 29 2 *",
                "start": "2029-03-01T00:00:00+00:00",
                "end": "2031-12-31T00:00:00+00:00",
            },
            "end",
        ),
    ]


@pytest.mark.parametrize("case", range(len(bad_schedules())))
def test_bad_schedule_is_refused_and_nothing_is_written(
    settings: Settings, scheduler: Scheduler, case: int
) -> None:
    kwargs, field = bad_schedules()[case]
    topic = names(settings).schedules
    before = high_watermarks(settings, [topic])
    with pytest.raises(InvalidInput) as info:
        scheduler.add_schedule("s1", **kwargs)
    assert info.value.field == field
    assert info.value.accepted
    assert high_watermarks(settings, [topic]) == before


def test_changing_a_missing_schedule_names_the_id(scheduler: Scheduler) -> None:
    for call in (scheduler.pause_schedule, scheduler.resume_schedule):
        with pytest.raises(InvalidInput) as info:
            call("ghost")
        assert info.value.field == "schedule_id"
    with pytest.raises(InvalidInput):
        scheduler.update_schedule("ghost", cron="* * * * *")
    scheduler.add_schedule("real", cron="* * * * *", timezone="UTC", task="t")
    with pytest.raises(InvalidInput) as info:
        scheduler.update_schedule("real", timezone="Nowhere/Land")
    assert info.value.field == "timezone"
