"""What a chaos run proved (pure): lost, duplicated and early jobs, from the evidence.

Evidence: the jobs the broker acknowledged, the cron schedules and when they
were added and deleted, the handlers' ledger (runs and idempotent effects),
the committed outcomes and the dead letters.

- **lost**: a job that should have run and is neither in the ledger's
  effects nor in the DLQ (a cron occurrence counts from the first one that
  ran up to a little before its schedule was deleted);
- **duplicates**: a job Kafka saw finish more than once: two ``succeeded``
  outcomes, two dead letters without a redrive, or both; (effects applied
  twice are impossible by the ledger's construction and counted as
  ``effect_conflicts``: executions that found their effect already applied);
- **early**: a run that started before the job's due time or before its
  attempt's "not before" (``df-due`` of a retry);
- **reexecutions**: extra runs of the same attempt of the same job (handler
  effects are at least once: a process killed after running a job and before
  committing it runs it again elsewhere; informational).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dueflow.cron import occurrences, parse_cron
from tests.chaos.ledger import Run
from tests.chaos.workload import Accepted, CronRun

# Occurrences due this close to a schedule's deletion may or may not fire.
CRON_END_MARGIN_MS = 3_000
EXPECT_DLQ = frozenset({"doomed", "permanent"})


@dataclass(frozen=True, slots=True)
class Evidence:
    accepted: list[Accepted]
    cron: list[CronRun]
    runs: list[Run]
    effects: Mapping[str, int]  # key -> applied at
    effect_conflicts: int
    succeeded: Mapping[str, int]  # key -> committed succeeded outcomes
    dead_letters: Mapping[str, list[str]]  # key -> reasons of its DLQ records


def cron_expected(run: CronRun, seen: Iterable[int]) -> tuple[list[int], int | None]:
    """Occurrences of ``run`` that must have run, and the first one that did."""
    first = min(seen, default=None)
    expr = parse_cron(run.cron)
    end = (run.deleted_ms or 0) - CRON_END_MARGIN_MS
    start = first - 1 if first is not None else run.added_ms + 10_000
    if end <= start:
        return [], first
    return occurrences(expr, after_ms=start, until_ms=end, tz="UTC", limit=1_000_000), first


def percentile(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def judge(ev: Evidence) -> dict[str, Any]:
    """The run's numbers (JSON-ready)."""
    finished = set(ev.effects) | set(ev.dead_letters)
    lost: list[str] = []
    dlq_unexpected: list[str] = []
    dlq_expected = 0
    for job in ev.accepted:
        if job.key not in finished:
            lost.append(job.key)
        if job.key in ev.dead_letters:
            if job.kind in EXPECT_DLQ:
                dlq_expected += 1
            else:
                dlq_unexpected.append(job.key)
    cron_report: dict[str, Any] = {}
    cron_total = 0
    for run in ev.cron:
        prefix = run.schedule_id + "@"
        seen = {int(k[len(prefix) :]) for k in finished if k.startswith(prefix)}
        seen |= {int(r.key[len(prefix) :]) for r in ev.runs if r.key.startswith(prefix)}
        expected, first = cron_expected(run, seen)
        missing = [f"{prefix}{o}" for o in expected if f"{prefix}{o}" not in finished]
        lost.extend(missing)
        dlq_unexpected.extend(f"{prefix}{o}" for o in expected if f"{prefix}{o}" in ev.dead_letters)
        cron_total += len(expected)
        cron_report[run.schedule_id] = {
            "expected": len(expected),
            "ran": len(expected) - len(missing),
            "missing": missing[:10],
            "first_delay_ms": None if first is None else first - run.added_ms,
        }

    duplicates = sorted(
        {k for k, n in ev.succeeded.items() if n > 1}
        | {k for k, reasons in ev.dead_letters.items() if len(reasons) > 1}
        | {k for k in ev.dead_letters if k in ev.effects or ev.succeeded.get(k)}
    )
    early = [r for r in ev.runs if r.started_ms < r.due_ms or r.started_ms < r.not_before_ms]
    per_attempt = Counter((r.key, r.attempt) for r in ev.runs)
    reexecutions = sum(n - 1 for n in per_attempt.values())
    due_of = {j.key: j.due_ms for j in ev.accepted}
    lateness = [r.started_ms - due_of[r.key] for r in ev.runs if r.attempt == 1 and r.key in due_of]
    reasons = Counter(reason for rs in ev.dead_letters.values() for reason in rs)
    return {
        "jobs": len(ev.accepted) + cron_total,
        "one_shot_jobs": len(ev.accepted),
        "cron_occurrences": cron_total,
        "lost": len(lost),
        "duplicates": len(duplicates),
        "early": len(early),
        "dlq": sum(len(rs) for rs in ev.dead_letters.values()),
        "dlq_expected": dlq_expected,
        "dlq_expected_of": sum(1 for j in ev.accepted if j.kind in EXPECT_DLQ),
        "dlq_unexpected": len(dlq_unexpected),
        "dlq_reasons": dict(reasons),
        "reexecutions": reexecutions,
        "effect_conflicts": ev.effect_conflicts,
        "runs": len(ev.runs),
        "effects": len(ev.effects),
        "lateness_ms": {
            "p50": percentile(lateness, 0.5),
            "p99": percentile(lateness, 0.99),
            "max": max(lateness, default=None),
        },
        "cron": cron_report,
        "lost_keys": lost[:20],
        "duplicate_keys": duplicates[:20],
        "early_runs": [
            {
                "key": r.key,
                "attempt": r.attempt,
                "started_ms": r.started_ms,
                "due_ms": r.due_ms,
                "not_before_ms": r.not_before_ms,
            }
            for r in early[:20]
        ],
        "dlq_unexpected_keys": dlq_unexpected[:20],
    }
