"""Misfire decisions: what to fire when an occurrence comes due late (pure core).

The emitter keeps one next occurrence of each schedule in the wheel. When it
fires occurrence ``due_ms`` at ``now_ms`` (late after downtime, or on time),
``misfire_plan`` says which occurrence instants to fire now and which
occurrence to place next. Instants are nominal occurrences (before jitter),
UTC epoch ms; lateness is judged against when each one was meant to fire.

- An occurrence ``o`` is *meant to fire* at ``o`` plus its deterministic
  jitter (:func:`~dueflow.rules.cron_schedule.fire_time_ms`, the time the wheel
  holds it for), but not before the occurrence before it: occurrences fire
  in order, so one whose jitter would put it before its predecessor is meant
  to fire with it (this matters only when the jitter exceeds the period).
- An occurrence is *due* once that time is ``<= now_ms``. The plan covers
  ``due_ms`` and the occurrences after it that are due; the first one that
  is not due yet is ``next_ms``, the one to place (the first occurrence after
  ``now_ms`` when all are due; None when the schedule has ended).
- A due occurrence is *on time* when ``now_ms - meant <= grace_ms`` and
  *missed* otherwise. A jitter larger than the grace period therefore never
  makes an occurrence fired at its jittered time late.
- On-time occurrences always fire, under every policy (``due_ms`` itself and,
  for schedules faster than the grace period, later ones already due).
- Missed occurrences follow the schedule's ``misfire`` policy:
  ``fire_all`` fires each of them, oldest first; ``fire_once`` fires one run
  for all of them, at the oldest (``due_ms``, the one the wheel held);
  ``skip`` fires none.
- At most ``max_catchup`` instants fire in one plan. On-time occurrences take
  the room first; missed ones fill what is left, oldest first; the rest never
  fire (``skipped`` says so). The cap bounds the burst after a long downtime
  (thundering herd); set it high for schedules where every run matters. A
  plan also looks at no more than :data:`MAX_STEPS` occurrences one by one (a
  schedule much faster than its jitter, after a long downtime): then the
  rest never fire and ``next_ms`` is the first occurrence after ``now_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow.errors import InvalidInput
from dueflow.rules.cron_schedule import CronSchedule, MisfirePolicy, fire_time_ms, next_occurrence


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


# Occurrences a plan looks at one by one (drawing their jitter), at most: about
# 16 us each, so a plan never holds the emitter for more than a fraction of a second.
MAX_STEPS = 10_000


def misfire_plan(
    schedule: CronSchedule, *, due_ms: int, now_ms: int, grace_ms: int, max_catchup: int
) -> MisfirePlan:
    """Decide which occurrences from ``due_ms`` fire at ``now_ms`` and what comes next."""
    if due_ms > now_ms:
        raise InvalidInput(
            "due_ms", due_ms, f"<= now_ms ({now_ms}): an occurrence never fires early"
        )
    if grace_ms < 0:
        raise InvalidInput("grace_ms", grace_ms, "an integer >= 0")
    if max_catchup < 1:
        raise InvalidInput("max_catchup", max_catchup, "an integer >= 1")
    window = schedule.jitter_ms
    cutoff = now_ms - grace_ms  # meant to fire before this: missed
    late = fire_time_ms(schedule, due_ms) < cutoff
    on_time: list[int] = [] if late else [due_ms]
    missed: list[int] = [due_ms] if late else []
    at = due_ms
    if late:
        # Meant before the cutoff whatever their jitter (o + window < cutoff): missed,
        # listed without drawing their jitter, one more than any policy fires.
        surely = cutoff - window - 1
        missed += _between(schedule, after_ms=due_ms, until_ms=surely, limit=max_catchup + 1)
        at = max(at, surely)
    # Later occurrences one by one, in order, up to the first one not due yet. Once
    # one is on time the rest are too (occurrences are meant to fire in order).
    next_ms: int | None = None
    full = False  # more on-time occurrences than the cap: the rest never fire
    steps = 0
    while True:
        o = next_occurrence(schedule, after_ms=at)
        if o is None:
            break
        if o > now_ms:
            next_ms = o
            break
        meant = fire_time_ms(schedule, o)
        if meant > now_ms:
            next_ms = o
            break
        at = o
        steps += 1
        if steps > MAX_STEPS:
            full = True
            next_ms = next_occurrence(schedule, after_ms=now_ms)
            break
        if full:
            continue
        if not on_time and meant < cutoff:
            if len(missed) <= max_catchup:
                missed.append(o)
        else:
            on_time.append(o)
            if len(on_time) > max_catchup:
                full = True
                at = max(at, now_ms - window)  # these are all due: skip to the unsure ones

    skipped = full
    on_time = on_time[:max_catchup]
    room = max_catchup - len(on_time)
    if schedule.misfire is MisfirePolicy.FIRE_ALL:
        fired_missed = missed[:room]
        skipped = skipped or len(missed) > room
    elif schedule.misfire is MisfirePolicy.FIRE_ONCE:
        fired_missed = missed[:1][:room]
        skipped = skipped or len(missed) > len(fired_missed)
    else:
        fired_missed = []
        skipped = skipped or bool(missed)

    return MisfirePlan(
        fire=(*fired_missed, *on_time),
        next_ms=next_ms,
        late=late,
        skipped=skipped,
    )


__all__ = ["MAX_STEPS", "MisfirePlan", "misfire_plan"]
