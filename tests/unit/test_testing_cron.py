"""dueflow.testing: cron occurrences in their time zone, misfires, schedule changes.

The emitter's cron keeper runs in memory: occurrence ``n`` fires and places
``n + 1``; a paused, changed or deleted schedule drops what it had placed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from dueflow import ConflictError, InvalidInput, task
from dueflow.rules.cron import occurrence_jitter_ms
from dueflow.testing import InMemoryPipeline
from dueflow.timeutil import format_utc, to_utc_ms


def runs_at(p: InMemoryPipeline) -> list[str]:
    return [format_utc(r.at_ms) for r in p.runs()]


@task("report")
def report(payload: Any, ctx: Any) -> None:
    """Does nothing: what ran, and when, is in the pipeline."""


@pytest.mark.parametrize(
    ("cron", "zone", "start", "days", "expected"),
    [
        # London, spring forward on 2030-03-31 (01:00 GMT -> 02:00 BST): 01:30 does not
        # exist that day and fires at 02:30 BST (01:30 UTC)
        (
            "30 1 * * *",
            "Europe/London",
            "2030-03-30T00:00:00Z",
            3,
            ["2030-03-30T01:30:00.000Z", "2030-03-31T01:30:00.000Z", "2030-04-01T00:30:00.000Z"],
        ),
        # London, fall back on 2030-10-27 (02:00 BST -> 01:00 GMT): 01:30 happens twice
        # and fires once, at its first instant (01:30 BST)
        (
            "30 1 * * *",
            "Europe/London",
            "2030-10-26T00:00:00Z",
            3,
            ["2030-10-26T00:30:00.000Z", "2030-10-27T00:30:00.000Z", "2030-10-28T01:30:00.000Z"],
        ),
        # New York, weekdays at 9:00 local: EDT (-4) then EST (-5) after 2030-11-03
        (
            "0 9 * * 1-5",
            "America/New_York",
            "2030-11-01T00:00:00Z",
            5,
            ["2030-11-01T13:00:00.000Z", "2030-11-04T14:00:00.000Z", "2030-11-05T14:00:00.000Z"],
        ),
    ],
    ids=["london-gap", "london-repeat", "new-york-weekdays"],
)
def test_occurrences_fire_at_their_instants_in_the_schedules_zone(
    cron: str, zone: str, start: str, days: int, expected: list[str]
) -> None:
    with InMemoryPipeline([report], start=start) as p:
        p.scheduler.add_schedule("s", cron=cron, timezone=zone, task="report")
        p.advance(days=days)
        assert runs_at(p) == expected


def test_every_real_instant_fires_when_the_hour_field_is_every_hour() -> None:
    """Fall back in London: */30 keeps its period through the repeated hour."""
    with InMemoryPipeline([report], start="2030-10-26T23:45:00Z") as p:
        p.scheduler.add_schedule("s", cron="*/30 * * * *", timezone="Europe/London", task="report")
        p.run_until("2030-10-27T02:00:00Z")
        assert runs_at(p) == [
            "2030-10-27T00:00:00.000Z",  # 01:00 BST
            "2030-10-27T00:30:00.000Z",  # 01:30 BST
            "2030-10-27T01:00:00.000Z",  # 01:00 GMT
            "2030-10-27T01:30:00.000Z",  # 01:30 GMT
            "2030-10-27T02:00:00.000Z",
        ]


@pytest.mark.parametrize(
    ("policy", "late_runs"),
    [("fire_all", 5), ("fire_once", 1), ("skip", 0)],
)
def test_after_downtime_the_misfire_policy_decides(policy: str, late_runs: int) -> None:
    with InMemoryPipeline([report], start="2030-01-01T00:30:00Z") as p:
        p.scheduler.add_schedule(
            "hourly", cron="0 * * * *", timezone="UTC", task="report", misfire=policy
        )
        p.advance(minutes=30)  # 01:00 runs on time
        assert len(p.runs()) == 1
        p.clock.set("2030-01-01T06:30:00Z")  # down from 01:00 to 06:30: 02:00..06:00 missed
        late = p.run_due()
        assert len(late) == late_runs
        assert all(r.at_ms == p.clock() for r in late)
        if policy == "fire_once":  # one run for all of them: the first missed occurrence
            assert late[0].job_id == f"hourly@{to_utc_ms('2030-01-01T02:00:00Z', field='t')}"
        p.advance(minutes=30)  # back in step: 07:00 runs on time, under every policy
        assert runs_at(p)[-1] == "2030-01-01T07:00:00.000Z"
        assert len(p.runs()) == 1 + late_runs + 1


def test_an_occurrence_late_by_less_than_the_grace_period_is_on_time() -> None:
    with InMemoryPipeline([report], start="2030-01-01T00:00:00Z") as p:
        p.scheduler.add_schedule(
            "s", cron="0 * * * *", timezone="UTC", task="report", misfire="skip"
        )
        p.clock.set("2030-01-01T01:00:30Z")  # 30 s late: within emitter.misfire_grace_ms
        (run,) = p.run_due()
        assert run.at_ms - to_utc_ms("2030-01-01T01:00:00Z", field="t") == 30_000


def test_pause_resume_update_delete() -> None:
    with InMemoryPipeline([report], start="2030-01-01T00:30:00Z") as p:
        s = p.scheduler
        s.add_schedule("s", cron="0 * * * *", timezone="UTC", task="report")
        p.advance(hours=1)
        assert runs_at(p) == ["2030-01-01T01:00:00.000Z"]

        s.pause_schedule("s")
        p.advance(hours=2)  # 02:00 and 03:00 do not fire
        assert len(p.runs()) == 1
        assert s.get_schedule("s").paused  # type: ignore[union-attr]

        s.resume_schedule("s")  # from the next occurrence on
        p.advance(hours=1)
        assert runs_at(p)[-1] == "2030-01-01T04:00:00.000Z"

        s.update_schedule("s", cron="15 * * * *")  # the 05:00 already placed is dropped
        p.advance(hours=1)
        assert runs_at(p)[-1] == "2030-01-01T05:15:00.000Z"
        assert len(p.runs()) == 3

        assert s.delete_schedule("s")
        assert not s.delete_schedule("s")
        p.advance(hours=3)
        assert len(p.runs()) == 3
        assert s.list_schedules() == []


def test_adding_a_schedule_again_is_a_no_op_another_definition_conflicts() -> None:
    with InMemoryPipeline([report]) as p:
        first = p.scheduler.add_schedule("s", cron="0 3 * * *", timezone="UTC", task="report")
        again = p.scheduler.add_schedule("s", cron="0 3 * * *", timezone="UTC", task="report")
        assert again == first
        with pytest.raises(ConflictError):
            p.scheduler.add_schedule("s", cron="0 4 * * *", timezone="UTC", task="report")
        assert [x.schedule_id for x in p.scheduler.list_schedules()] == ["s"]
        p.advance(days=2)
        assert len(p.runs()) == 2  # one occurrence a day, not one per add


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"timezone": "Europe/Berln"}, "timezone"),
        ({"queue": "nope"}, "queue"),
        ({"misfire": "sometimes"}, "misfire"),
    ],
)
def test_a_bad_schedule_is_refused(kwargs: dict[str, str], field: str) -> None:
    definition = {"cron": "0 3 * * *", "timezone": "UTC", "task": "report", **kwargs}
    with InMemoryPipeline([report]) as p:
        with pytest.raises(InvalidInput) as info:
            p.scheduler.add_schedule("s", **definition)  # type: ignore[arg-type]
        assert info.value.field == field
        assert p.pending() == []


def test_cron_jitter_is_the_occurrences_own() -> None:
    with InMemoryPipeline([report], start="2030-01-01T00:00:00Z") as p:
        p.scheduler.add_schedule(
            "spread", cron="0 3 * * *", timezone="UTC", task="report", jitter="10m"
        )
        p.advance(days=1)
        (run,) = p.runs()
        occurrence = to_utc_ms("2030-01-01T03:00:00Z", field="t")
        assert run.at_ms == occurrence + occurrence_jitter_ms("spread", occurrence, 600_000)
        assert run.job_id == run.idempotency_key == f"spread@{occurrence}"
        assert run.schedule_id == "spread"


def test_a_failing_occurrence_is_retried_and_the_schedule_goes_on() -> None:
    attempts: list[tuple[str, int]] = []

    @task("flaky-report", max_attempts=2)
    def flaky(payload: Any, ctx: Any) -> None:
        attempts.append((ctx.job_id, ctx.attempt))
        raise ConnectionError("down")

    with InMemoryPipeline([flaky], start="2030-01-01T00:00:00Z") as p:
        p.scheduler.add_schedule("s", cron="0 * * * *", timezone="UTC", task="flaky-report")
        p.advance(hours=2, seconds=5)  # each retry comes 1 s after its occurrence
        assert [a for _, a in attempts] == [1, 2, 1, 2]
        assert {d.reason for d in p.dead_letters()} == {"exhausted"}
        assert len(p.dead_letters()) == 2


def test_run_until_idle_is_not_kept_going_by_cron_alone() -> None:
    with InMemoryPipeline([report], start=datetime.fromisoformat("2030-01-01T00:00:00+00:00")) as p:
        p.scheduler.add_schedule("s", cron="* * * * *", timezone="UTC", task="report")
        assert p.run_until_idle() == []
        p.scheduler.schedule("report", delay="3m")
        p.run_until_idle()  # the job at 00:03; the occurrences on the way run too
        assert runs_at(p) == [
            "2030-01-01T00:01:00.000Z",
            "2030-01-01T00:02:00.000Z",
            "2030-01-01T00:03:00.000Z",
            "2030-01-01T00:03:00.000Z",
        ]
        (pending,) = p.pending()
        assert (pending.cron, pending.schedule_id) == (True, "s")
