"""The console's Watch tab: the last hour per queue, the emitter's leaders, cron runs (pure).

:class:`QueueWatch` counts, per queue and minute, the outcomes the status
view folds: attempts that ended (throughput), retries, dead letters, and the
start lateness of each attempt that ran (its start, the outcome's time less
its duration, minus the job's due time; a retry's or a redriven job's start
is measured against the job's first due time too, so only first attempts
are sampled). Memory is
bounded: 60 minutes per queue, at most :data:`SAMPLES_PER_MINUTE` lateness
samples a minute (the first ones). It holds what this view folded since it
started: after a restart the window fills again.

:func:`next_runs` gives a cron schedule's next occurrences in its own zone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from dueflow.rules.cron_schedule import CronSchedule, next_occurrence

WINDOW_MIN = 60
SAMPLES_PER_MINUTE = 2000
LEADERS_KEPT = 20


@dataclass(slots=True)
class Minute:
    ended: int = 0
    retries: int = 0
    dead: int = 0
    late_ms: list[float] = field(default_factory=list)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


ENDED = frozenset({"succeeded", "retrying", "dead"})  # the outcomes an attempt ends with


class QueueWatch:
    """Per queue, per minute, what the view folded (see the module doc)."""

    def __init__(self) -> None:
        self._minutes: dict[str, dict[int, Minute]] = {}
        self.leaders: list[dict[str, Any]] = []  # changes of the active emitter seen

    def record(self, outcome: Mapping[str, Any], *, redriven: bool = False) -> None:
        """One folded outcome (an ``outcome.avsc`` dict); ``redriven``: of a job run
        again from the DLQ (counted, not sampled for lateness)."""
        st = outcome.get("state")
        if st not in ENDED:
            return
        at = int(outcome["at_ms"])
        minute = at // 60_000
        per_queue = self._minutes.setdefault(str(outcome["queue"]), {})
        m = per_queue.get(minute)
        if m is None:
            m = per_queue[minute] = Minute()
            for old in [k for k in per_queue if k <= minute - WINDOW_MIN]:
                del per_queue[old]
        m.ended += 1
        if st == "retrying":
            m.retries += 1
        elif st == "dead":
            m.dead += 1
        due, duration = outcome.get("due_ms"), outcome.get("duration_ms")
        first = int(outcome.get("attempt") or 0) <= 1 and not redriven
        if (
            first
            and due is not None
            and duration is not None
            and len(m.late_ms) < SAMPLES_PER_MINUTE
        ):
            m.late_ms.append(max(0.0, at - float(duration) - int(due)))

    def leader_seen(self, client_id: str | None, *, at_ms: int) -> None:
        """The active emitter the cluster view read (a change is kept)."""
        if self.leaders and self.leaders[-1]["leader"] == client_id:
            return
        self.leaders.append({"leader": client_id, "since_ms": at_ms})
        del self.leaders[:-LEADERS_KEPT]

    def snapshot(self, *, now_ms: int, queues: list[str]) -> dict[str, dict[str, Any]]:
        """Per queue over the last hour: attempts ended per minute (mean), start
        lateness p50/p99 (first attempts), retries, dead letters."""
        low = now_ms // 60_000 - WINDOW_MIN
        out: dict[str, dict[str, Any]] = {}
        for q in sorted(set(queues) | set(self._minutes)):
            minutes = [m for k, m in self._minutes.get(q, {}).items() if k > low]
            late = [v for m in minutes for v in m.late_ms]
            out[q] = {
                "done_per_min": round(sum(m.ended for m in minutes) / WINDOW_MIN, 2),
                "ended": sum(m.ended for m in minutes),
                "start_late_p50_ms": pct(late, 0.5),
                "start_late_p99_ms": pct(late, 0.99),
                "retries": sum(m.retries for m in minutes),
                "dead": sum(m.dead for m in minutes),
            }
        return out


def next_runs(schedule: CronSchedule, *, now_ms: int, n: int = 3) -> list[str]:
    """The next ``n`` occurrences of ``schedule`` after ``now_ms``, as ISO 8601 in its
    zone (fewer when its window ends)."""
    zone = ZoneInfo(schedule.timezone)
    out: list[str] = []
    after = now_ms
    while len(out) < n:
        found = next_occurrence(schedule, after_ms=after)
        if found is None:
            break
        out.append(datetime.fromtimestamp(found / 1000, UTC).astimezone(zone).isoformat())
        after = found
    return out
