"""Misfire plans after downtime: on time, fire_all, fire_once, skip, the cap."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import InvalidInput
from dueflow.rules.cron import (
    CronSchedule,
    MisfirePolicy,
    fire_time_ms,
    misfire_plan,
    next_occurrence,
    occurrences,
)

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


# ------------------------------------------------------------------ jitter
# Each occurrence is meant to fire at itself plus its jitter (the time the wheel
# holds it for): lateness is judged against that, never against the nominal
# instant. Hourly, 10 min of jitter, 60 s of grace: the jitter is beyond the grace.

JITTER = 10 * 60 * S


def jittered(policy: MisfirePolicy) -> CronSchedule:
    return hourly(policy, jitter_ms=JITTER)


def meant(o: int) -> int:
    return fire_time_ms(jittered(MisfirePolicy.SKIP), o)


def test_the_jitters_of_the_table_are_beyond_the_grace() -> None:
    assert [(meant(T10 + h * H) - T10 - h * H) // S for h in range(6)] == [
        226,
        282,
        267,
        362,
        491,
        414,
    ]


ALL, ONCE, SKIP = MisfirePolicy.FIRE_ALL, MisfirePolicy.FIRE_ONCE, MisfirePolicy.SKIP
DOWN_UNTIL_14 = meant(T10 + 4 * H)  # the emitter is back when 14:00 is meant to fire


@pytest.mark.parametrize(
    ("policy", "now", "fire", "next_ms", "late", "skipped"),
    [
        # fired at its jittered time (226 s after 10:00, grace 60 s): on time everywhere
        *[(p, meant(T10), (T10,), T10 + H, False, False) for p in MisfirePolicy],
        # up to the grace after its jittered time: still on time
        *[(p, meant(T10) + GRACE, (T10,), T10 + H, False, False) for p in MisfirePolicy],
        # beyond it: late, and the policy decides
        (ALL, meant(T10) + GRACE + 1, (T10,), T10 + H, True, False),
        (ONCE, meant(T10) + GRACE + 1, (T10,), T10 + H, True, False),
        (SKIP, meant(T10) + GRACE + 1, (), T10 + H, True, True),
        # down until just before 14:00 is meant to fire: 10-13 missed, 14:00 not due
        # yet: it is the one placed next (at its own jittered time), not fired now
        (
            ALL,
            DOWN_UNTIL_14 - 1,
            (T10, T10 + H, T10 + 2 * H, T10 + 3 * H),
            T10 + 4 * H,
            True,
            False,
        ),
        (ONCE, DOWN_UNTIL_14 - 1, (T10,), T10 + 4 * H, True, True),
        (SKIP, DOWN_UNTIL_14 - 1, (), T10 + 4 * H, True, True),
        # down until 14:00's jittered time: 14:00 is on time under every policy
        (
            ALL,
            DOWN_UNTIL_14,
            (T10, T10 + H, T10 + 2 * H, T10 + 3 * H, T10 + 4 * H),
            T10 + 5 * H,
            True,
            False,
        ),
        (ONCE, DOWN_UNTIL_14, (T10, T10 + 4 * H), T10 + 5 * H, True, True),
        (SKIP, DOWN_UNTIL_14, (T10 + 4 * H,), T10 + 5 * H, True, True),
        # 13:00 (meant 13:06:02) is within the grace of a return at 13:07: on time
        (SKIP, meant(T10 + 3 * H) + GRACE, (T10 + 3 * H,), T10 + 4 * H, True, True),
        (
            ALL,
            meant(T10 + 3 * H) + GRACE,
            (T10, T10 + H, T10 + 2 * H, T10 + 3 * H),
            T10 + 4 * H,
            True,
            False,
        ),
    ],
)
def test_jitter_with_every_policy(
    policy: MisfirePolicy,
    now: int,
    fire: tuple[int, ...],
    next_ms: int,
    late: bool,
    skipped: bool,
) -> None:
    plan = misfire_plan(jittered(policy), due_ms=T10, now_ms=now, grace_ms=GRACE, max_catchup=10)
    assert plan.fire == fire
    assert plan.next_ms == next_ms
    assert (plan.late, plan.skipped) == (late, skipped)


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_jitter_beyond_the_period_fires_every_occurrence_in_order(policy: MisfirePolicy) -> None:
    # Every 10 s with 60 s of jitter and 1 s of grace: a later occurrence may be
    # meant before an earlier one; it fires with it, on time, never dropped.
    sched = hourly(policy, cron="*/10 * * * * *", jitter_ms=60 * S)
    fired = run_without_downtime(sched, first=T10, until=T10 + 2 * H, grace_ms=S)
    assert fired == occurrences(
        sched.expr, after_ms=T10 - 1, until_ms=T10 + 2 * H, tz=sched.tz, limit=10**6
    )


def run_without_downtime(
    sched: CronSchedule, *, first: int, until: int, grace_ms: int, cap: int = 100
) -> list[int]:
    """Occurrences fired when every plan runs exactly when the wheel fires the
    occurrence it holds (what an emitter that is never down does)."""
    fired: list[int] = []
    held: int | None = first
    while held is not None and held <= until:
        now = fire_time_ms(sched, held)  # the wheel fires the timer at its due time
        plan = misfire_plan(sched, due_ms=held, now_ms=now, grace_ms=grace_ms, max_catchup=cap)
        fired += [o for o in plan.fire if o <= until]
        assert not plan.skipped, (held, now, plan)
        assert plan.next_ms is None or fire_time_ms(sched, plan.next_ms) > now
        held = plan.next_ms
    return fired


@settings(max_examples=150, deadline=None)
@given(
    cron=st.sampled_from(["*/10 * * * * *", "*/7 * * * * *", "* * * * *", "0 * * * *"]),
    policy=st.sampled_from(list(MisfirePolicy)),
    jitter_ms=st.sampled_from([0, 1, 999, 5 * S, 30 * S, 70 * S, 10 * 60 * S]),
    grace_ms=st.sampled_from([0, 1, 500, 5 * S, 60 * S]),
)
def test_property_without_downtime_every_occurrence_fires_once_in_order(
    cron: str, policy: MisfirePolicy, jitter_ms: int, grace_ms: int
) -> None:
    sched = hourly(policy, cron=cron, jitter_ms=jitter_ms, schedule_id=f"p{jitter_ms}")
    first = occurrences(sched.expr, after_ms=T10 - 1, until_ms=T10 + 2 * H, tz=sched.tz, limit=1)[0]
    until = first + 30 * sched_period(cron)
    fired = run_without_downtime(sched, first=first, until=until, grace_ms=grace_ms)
    assert fired == occurrences(
        sched.expr, after_ms=first - 1, until_ms=until, tz=sched.tz, limit=10**6
    )


def sched_period(cron: str) -> int:
    return {"*/10 * * * * *": 10 * S, "*/7 * * * * *": 7 * S, "* * * * *": 60 * S}.get(cron, H)


def reference_plan(
    sched: CronSchedule, *, due: int, now: int, grace_ms: int, cap: int
) -> tuple[tuple[int, ...], int | None, bool, bool]:
    """The documented rules, by brute force over every occurrence."""
    covered: list[tuple[int, int]] = [(due, fire_time_ms(sched, due))]  # (occurrence, meant)
    at = due
    while True:
        o = next_occurrence(sched, after_ms=at)
        if o is None:
            next_ms = None
            break
        m = max(fire_time_ms(sched, o), covered[-1][1])  # in order: not before its predecessor
        if m > now:
            next_ms = o
            break
        covered.append((o, m))
        at = o
    on_time = [o for o, m in covered if now - m <= grace_ms]
    missed = [o for o, m in covered if now - m > grace_ms]
    room = max(0, cap - len(on_time))
    if sched.misfire is MisfirePolicy.FIRE_ALL:
        fired_missed = missed[:room]
    elif sched.misfire is MisfirePolicy.FIRE_ONCE:
        fired_missed = missed[:1][:room]
    else:
        fired_missed = []
    fire = (*fired_missed, *on_time[:cap])
    late = now - covered[0][1] > grace_ms
    return fire, next_ms, late, len(fire) < len(covered)


@settings(max_examples=300, deadline=None)
@given(
    cron=st.sampled_from(["*/10 * * * *", "0 * * * *", "*/7 * * * * *", "30 9 * * MON-FRI"]),
    policy=st.sampled_from(list(MisfirePolicy)),
    jitter_ms=st.one_of(st.just(0), st.integers(0, 2 * H)),
    due_index=st.integers(0, 5),
    down_ms=st.integers(0, 12 * H),
    grace_ms=st.integers(0, 2 * H),
    cap=st.integers(1, 400),
)
def test_property_jittered_plans_follow_the_documented_rules(
    cron: str,
    policy: MisfirePolicy,
    jitter_ms: int,
    due_index: int,
    down_ms: int,
    grace_ms: int,
    cap: int,
) -> None:
    sched = hourly(policy, cron=cron, timezone="Europe/London", jitter_ms=jitter_ms)
    start = utc("2024-10-25T00:00")
    due = occurrences(
        sched.expr, after_ms=start, until_ms=start + 30 * 86_400_000, tz=sched.tz, limit=6
    )[due_index]
    now = fire_time_ms(sched, due) + down_ms  # the wheel fires it at its jittered time or later
    plan = misfire_plan(sched, due_ms=due, now_ms=now, grace_ms=grace_ms, max_catchup=cap)
    fire, next_ms, late, skipped = reference_plan(
        sched, due=due, now=now, grace_ms=grace_ms, cap=cap
    )
    assert plan.fire == fire
    assert plan.next_ms == next_ms
    assert (plan.late, plan.skipped) == (late, skipped)
    assert next_ms is None or fire_time_ms(sched, next_ms) > now  # placed, never fired early
