"""Misfire decisions: what to fire when an occurrence comes due late (pure core).

The emitter keeps one next occurrence of each schedule in the wheel. When it
fires occurrence ``due_ms`` at ``now_ms`` (late after downtime, or on time),
``misfire_plan`` says which occurrence instants to fire now and which
occurrence to place next. All instants are nominal occurrences (before
jitter), UTC epoch ms.

An occurrence ``o`` of ``[due_ms, now_ms]`` is *on time* when
``now_ms - o <= grace_ms`` and *missed* otherwise.

- On-time occurrences always fire, under every policy (``due_ms`` itself and,
  for schedules faster than the grace period, later ones already due).
- Missed occurrences follow the schedule's ``misfire`` policy:
  ``fire_all`` fires each of them, oldest first; ``fire_once`` fires one run
  for all of them, at ``due_ms`` (the first missed occurrence, the one the
  wheel held); ``skip`` fires none.
- At most ``max_catchup`` instants fire in one plan. On-time occurrences take
  the room first; missed ones fill what is left, oldest first; the rest never
  fire (``skipped`` says so). The cap bounds the burst after a long downtime
  (thundering herd); set it high for schedules where every run matters.
- ``next_ms`` is the first occurrence strictly after ``now_ms`` (None when the
  schedule has ended): the schedule is in its steady state after one plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow.cron_schedule import CronSchedule, MisfirePolicy, next_occurrence
from dueflow.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class MisfirePlan:
    """What to do now: fire ``fire`` (ascending), then place ``next_ms``."""

    fire: tuple[int, ...]
    next_ms: int | None
    late: bool  # due_ms itself was missed (more than grace_ms late)
    skipped: bool  # some occurrence in [due_ms, now_ms] will never fire


def _between(schedule: CronSchedule, *, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Occurrences of ``schedule`` in ``(after_ms, until_ms]``, at most ``limit``."""
    out: list[int] = []
    at = after_ms
    while len(out) < limit:
        nxt = next_occurrence(schedule, after_ms=at)
        if nxt is None or nxt > until_ms:
            break
        out.append(nxt)
        at = nxt
    return out


def misfire_plan(
    schedule: CronSchedule, *, due_ms: int, now_ms: int, grace_ms: int, max_catchup: int
) -> MisfirePlan:
    """Decide which occurrences of ``[due_ms, now_ms]`` fire now and what comes next."""
    if due_ms > now_ms:
        raise InvalidInput(
            "due_ms", due_ms, f"<= now_ms ({now_ms}): an occurrence never fires early"
        )
    if grace_ms < 0:
        raise InvalidInput("grace_ms", grace_ms, "an integer >= 0")
    if max_catchup < 1:
        raise InvalidInput("max_catchup", max_catchup, "an integer >= 1")
    cutoff = now_ms - grace_ms  # occurrences before this are missed
    late = due_ms < cutoff

    on_time = [] if late else [due_ms]
    on_time += _between(
        schedule,
        after_ms=max(due_ms, cutoff - 1),
        until_ms=now_ms,
        limit=max_catchup + 1 - len(on_time),
    )
    skipped = len(on_time) > max_catchup
    on_time = on_time[:max_catchup]
    room = max_catchup - len(on_time)

    missed: list[int] = []
    if late:
        if schedule.misfire is MisfirePolicy.FIRE_ALL:
            candidates = [
                due_ms,
                *_between(schedule, after_ms=due_ms, until_ms=cutoff - 1, limit=room),
            ]
            missed = candidates[:room]
            skipped = skipped or len(candidates) > room
        elif schedule.misfire is MisfirePolicy.FIRE_ONCE:
            missed = [due_ms][:room]
            more = _between(schedule, after_ms=due_ms, until_ms=cutoff - 1, limit=1)
            skipped = skipped or room == 0 or bool(more)
        else:
            skipped = True

    return MisfirePlan(
        fire=(*missed, *on_time),
        next_ms=next_occurrence(schedule, after_ms=now_ms),
        late=late,
        skipped=skipped,
    )


__all__ = ["MisfirePlan", "misfire_plan"]
