"""Misfire plans after downtime: on time, fire_all, fire_once, skip, the cap."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.cron import CronSchedule, MisfirePolicy, misfire_plan, occurrences
from dueflow.errors import InvalidInput

H = 3_600_000
S = 1_000


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def hourly(policy: MisfirePolicy, **overrides: Any) -> CronSchedule:
    fields: dict[str, Any] = {
        "schedule_id": "hourly",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "queue": "q",
        "task": "t",
        "payload": b"{}",
        "misfire": policy,
        "version": 1,
        "created_ms": 0,
        "updated_ms": 0,
    }
    fields.update(overrides)
    return CronSchedule(**fields)


T10 = utc("2024-05-01T10:00")
GRACE = 60 * S


@pytest.mark.parametrize("policy", list(MisfirePolicy))
@pytest.mark.parametrize("lateness", [0, 5 * S, GRACE])
def test_on_time_fires_due_under_every_policy(policy: MisfirePolicy, lateness: int) -> None:
    plan = misfire_plan(
        hourly(policy), due_ms=T10, now_ms=T10 + lateness, grace_ms=GRACE, max_catchup=10
    )
    assert plan.fire == (T10,)
    assert plan.next_ms == T10 + H
    assert not plan.late
    assert not plan.skipped


# Down from before 10:00 until 14:00:10; grace 60 s: 10, 11, 12, 13 are missed,
# 14:00 is only 10 s late, so it is on time and fires under every policy.
NOW = T10 + 4 * H + 10 * S


@pytest.mark.parametrize(
    ("policy", "cap", "fire", "skipped"),
    [
        (MisfirePolicy.FIRE_ALL, 10, (T10, T10 + H, T10 + 2 * H, T10 + 3 * H, T10 + 4 * H), False),
        (MisfirePolicy.FIRE_ALL, 5, (T10, T10 + H, T10 + 2 * H, T10 + 3 * H, T10 + 4 * H), False),
        (MisfirePolicy.FIRE_ALL, 3, (T10, T10 + H, T10 + 4 * H), True),  # oldest first
        (MisfirePolicy.FIRE_ALL, 1, (T10 + 4 * H,), True),  # on time takes the room first
        (MisfirePolicy.FIRE_ONCE, 10, (T10, T10 + 4 * H), True),
        (MisfirePolicy.FIRE_ONCE, 1, (T10 + 4 * H,), True),
        (MisfirePolicy.SKIP, 10, (T10 + 4 * H,), True),
    ],
)
def test_after_downtime(
    policy: MisfirePolicy, cap: int, fire: tuple[int, ...], skipped: bool
) -> None:
    plan = misfire_plan(hourly(policy), due_ms=T10, now_ms=NOW, grace_ms=GRACE, max_catchup=cap)
    assert plan.fire == fire
    assert plan.next_ms == T10 + 5 * H  # strictly after now: steady state after one plan
    assert plan.late
    assert plan.skipped is skipped


@pytest.mark.parametrize(
    ("policy", "fire", "skipped"),
    [
        (MisfirePolicy.FIRE_ALL, (T10,), False),
        (MisfirePolicy.FIRE_ONCE, (T10,), False),  # one missed: nothing to coalesce
        (MisfirePolicy.SKIP, (), True),
    ],
)
def test_one_missed_occurrence(policy: MisfirePolicy, fire: tuple[int, ...], skipped: bool) -> None:
    plan = misfire_plan(
        hourly(policy), due_ms=T10, now_ms=T10 + 30 * 60 * S, grace_ms=GRACE, max_catchup=10
    )
    assert plan.fire == fire
    assert plan.next_ms == T10 + H
    assert plan.late
    assert plan.skipped is skipped


def test_just_beyond_grace_is_late() -> None:
    plan = misfire_plan(
        hourly(MisfirePolicy.SKIP),
        due_ms=T10,
        now_ms=T10 + GRACE + 1,
        grace_ms=GRACE,
        max_catchup=5,
    )
    assert plan.late
    assert plan.fire == ()


def test_fast_schedule_on_time_fires_everything_already_due() -> None:
    every_second = hourly(MisfirePolicy.SKIP, cron="* * * * * *")
    plan = misfire_plan(
        every_second, due_ms=T10, now_ms=T10 + 3 * S, grace_ms=5 * S, max_catchup=10
    )
    assert plan.fire == (T10, T10 + S, T10 + 2 * S, T10 + 3 * S)
    assert plan.next_ms == T10 + 4 * S
    assert not plan.skipped
    capped = misfire_plan(
        every_second, due_ms=T10, now_ms=T10 + 3 * S, grace_ms=5 * S, max_catchup=2
    )
    assert capped.fire == (T10, T10 + S)
    assert capped.skipped


def test_schedule_end_stops_catch_up() -> None:
    ending = hourly(MisfirePolicy.FIRE_ALL, end_ms=T10 + 2 * H)  # end is inclusive
    plan = misfire_plan(ending, due_ms=T10, now_ms=NOW, grace_ms=GRACE, max_catchup=10)
    assert plan.fire == (T10, T10 + H, T10 + 2 * H)
    assert plan.next_ms is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"due_ms": T10 + 1, "now_ms": T10, "grace_ms": 0, "max_catchup": 1}, "due_ms"),
        ({"due_ms": T10, "now_ms": T10, "grace_ms": -1, "max_catchup": 1}, "grace_ms"),
        ({"due_ms": T10, "now_ms": T10, "grace_ms": 0, "max_catchup": 0}, "max_catchup"),
    ],
)
def test_bad_arguments(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        misfire_plan(hourly(MisfirePolicy.FIRE_ALL), **kwargs)
    assert info.value.field == field


@settings(max_examples=200, deadline=None)
@given(
    cron=st.sampled_from(["*/10 * * * *", "0 * * * *", "*/7 * * * * *", "30 9 * * MON-FRI"]),
    policy=st.sampled_from(list(MisfirePolicy)),
    due_index=st.integers(0, 5),
    down_ms=st.integers(0, 3 * 86_400_000),
    grace_ms=st.integers(0, 2 * H),
    cap=st.integers(1, 400),
)
def test_plan_properties(
    cron: str, policy: MisfirePolicy, due_index: int, down_ms: int, grace_ms: int, cap: int
) -> None:
    sched = hourly(policy, cron=cron, timezone="Europe/London")
    start = utc("2024-10-25T00:00")
    due = occurrences(
        sched.expr,
        after_ms=start,
        until_ms=start + 30 * 86_400_000,
        tz=sched.tz,
        limit=due_index + 1,
    )[-1]
    now = due + down_ms
    plan = misfire_plan(sched, due_ms=due, now_ms=now, grace_ms=grace_ms, max_catchup=cap)

    due_now = [due, *occurrences(sched.expr, after_ms=due, until_ms=now, tz=sched.tz, limit=10**6)]
    on_time = [o for o in due_now if now - o <= grace_ms]
    missed = [o for o in due_now if now - o > grace_ms]

    assert list(plan.fire) == sorted(set(plan.fire))
    assert set(plan.fire) <= set(due_now)
    assert len(plan.fire) <= cap
    assert plan.next_ms is not None
    assert plan.next_ms > now
    assert (
        plan.next_ms
        == occurrences(
            sched.expr, after_ms=now, until_ms=now + 30 * 86_400_000, tz=sched.tz, limit=1
        )[0]
    )
    assert plan.late == (now - due > grace_ms)
    assert set(on_time[:cap]) <= set(plan.fire)  # on-time occurrences come first
    fired_missed = [o for o in plan.fire if o in missed]
    if policy is MisfirePolicy.SKIP:
        assert fired_missed == []
    elif policy is MisfirePolicy.FIRE_ONCE:
        assert fired_missed == ([due] if missed and len(on_time) < cap else [])
    else:
        assert fired_missed == missed[: max(0, cap - len(on_time))]
    assert plan.skipped == (len(plan.fire) < len(due_now))
