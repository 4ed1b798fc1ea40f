"""Cron schedules of dueflow: the public face of the pure cron core.

Nothing here does I/O, reads the clock or draws random numbers: instants
(UTC epoch milliseconds) are arguments and results.

- Expression language (``dueflow.rules.cron_expr``): 5 fields (minute hour
  day-of-month month day-of-week) or 6 with seconds first; ``*``, lists,
  ranges, steps, month and weekday names, 0 and 7 = Sunday, ``@yearly`` ...
  ``@hourly``; Vixie day rule (day-of-month OR day-of-week when both are
  restricted). ``parse_cron`` raises ``InvalidInput("cron", ...)`` naming the
  field and what is wrong.
- Time zones and DST (``dueflow.rules.cron_time``): an expression matches wall-clock
  times of an IANA zone (``zone`` validates the name). A wall time in a DST
  gap fires at the instant it would have had with the offset before the
  transition (PEP 495 fold=0: London 01:30 on the spring-forward day fires at
  02:30 BST). A repeated wall time fires once, at its first occurrence, unless
  the hour field allows every hour; then each real instant fires, so hourly
  and every-N-minutes schedules keep their period. Equal instants coalesce;
  occurrences strictly increase. ``next_fire`` skips by fields, it never
  walks minute by minute.
- Schedules (``dueflow.rules.cron_schedule``): ``CronSchedule`` (the record of the
  schedules topic), ``MisfirePolicy``, ``next_occurrence`` within the
  inclusive window ``[start_ms, end_ms]``; ``first_occurrence`` refuses a
  schedule that can never fire (``0 0 30 2 *``, an end before its first
  occurrence), as adding one does.
- Misfires (``dueflow.rules.misfire``): ``misfire_plan`` after downtime.
- Overlap (``dueflow.rules.cron_overlap``): ``OverlapPolicy`` (``allow``, ``skip``,
  ``buffer_one``) for an occurrence that comes while the previous one runs.
- Jitter (``dueflow.rules.jitter``): ``deterministic_jitter_ms`` from a seed.

The full rules with worked examples are in docs/cron.md.
"""

from __future__ import annotations

from dueflow.rules.cron_expr import MACROS, CronExpr, parse_cron
from dueflow.rules.cron_overlap import OverlapPolicy
from dueflow.rules.cron_schedule import (
    CronSchedule,
    MisfirePolicy,
    fire_time_ms,
    first_occurrence,
    next_occurrence,
)
from dueflow.rules.cron_time import next_fire, occurrences, zone
from dueflow.rules.jitter import deterministic_jitter_ms, occurrence_jitter_ms
from dueflow.rules.misfire import MisfirePlan, misfire_plan

__all__ = [
    "MACROS",
    "CronExpr",
    "CronSchedule",
    "MisfirePlan",
    "MisfirePolicy",
    "OverlapPolicy",
    "deterministic_jitter_ms",
    "fire_time_ms",
    "first_occurrence",
    "misfire_plan",
    "next_fire",
    "next_occurrence",
    "occurrence_jitter_ms",
    "occurrences",
    "parse_cron",
    "zone",
]
