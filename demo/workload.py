"""What the demo schedules (pure: the random draws come from the ``rng`` passed in).

One-shot jobs are scheduled in waves, as traffic would arrive: every
``wave_ms`` a wave of jobs, each due ``min_lead_ms``-``max_lead_ms`` after it
is scheduled (some with jitter on top). The mix:

- ``email.send`` (queue ``emails``, async), most of the jobs, half of them
  with ``jitter``;
- ``report.build`` (queue ``reports``, a blocking handler on a thread);
- ``payment.charge``: a flaky job that fails its first one or two attempts
  and is retried through the retry tiers;
- one ``webhook.deliver`` whose every attempt fails: it ends in the DLQ;
- a few cron schedules (every 2 s in UTC, every 5 s in Europe/Paris, and a
  nightly one that does not come due during the demo).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dueflow.errors import InvalidInput
from dueflow.records.cron_occurrence import occurrence_id
from dueflow.records.job_request import JobRequest
from dueflow.rules.cron_schedule import CronSchedule, next_occurrence

POISON_ID = "demo-poison"


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """How much the demo schedules and over what time."""

    jobs: int = 30_000
    schedule_s: float = 36.0
    wave_ms: int = 250
    min_lead_ms: int = 500
    max_lead_ms: int = 8_000
    jitter_ms: int = 500
    flaky_share: float = 0.02
    report_share: float = 0.25

    @property
    def waves(self) -> int:
        return max(1, round(self.schedule_s * 1000 / self.wave_ms))

    @property
    def due_span_ms(self) -> int:
        """Latest due time of a one-shot job, after the workload's start."""
        return (self.waves - 1) * self.wave_ms + self.max_lead_ms + self.jitter_ms

    @property
    def kill_at_ms(self) -> int:
        """Half way through the due times: when the demo kills the active emitter."""
        return self.due_span_ms // 2


SHORT = WorkloadShape(jobs=3_000, schedule_s=8.0, max_lead_ms=4_000)


@dataclass(frozen=True, slots=True)
class Wave:
    """Jobs to schedule ``at_ms`` after the workload's start."""

    at_ms: int
    requests: tuple[JobRequest, ...]


def _job(i: int, shape: WorkloadShape, rng: random.Random) -> JobRequest:
    delay = timedelta(milliseconds=rng.randint(shape.min_lead_ms, shape.max_lead_ms))
    job_id = f"demo-{i:06d}"
    draw = rng.random()
    if draw < shape.flaky_share:
        return JobRequest(
            "payment.charge",
            {"order": i, "amount_cents": 100 + i % 9_900, "fail_times": rng.choice((1, 2))},
            delay=delay,
            queue="emails",
            job_id=job_id,
        )
    if draw < shape.flaky_share + shape.report_share:
        return JobRequest(
            "report.build",
            {"report": "usage", "account": i % 500},
            delay=delay,
            queue="reports",
            job_id=job_id,
        )
    return JobRequest(
        "email.send",
        {"to": f"user{i}@example.com", "template": "welcome"},
        delay=delay,
        queue="emails",
        job_id=job_id,
        jitter=timedelta(milliseconds=shape.jitter_ms) if i % 2 else None,
    )


def plan_waves(shape: WorkloadShape, *, rng: random.Random) -> list[Wave]:
    """The one-shot jobs in scheduling order; the first wave holds the DLQ-bound job."""
    poison = JobRequest(
        "webhook.deliver",
        {"url": "https://partner.invalid/hook", "always_fail": True},
        delay=timedelta(milliseconds=shape.min_lead_ms),
        queue="emails",
        job_id=POISON_ID,
    )
    per_wave, extra = divmod(shape.jobs - 1, shape.waves)
    waves: list[Wave] = []
    i = 0
    for w in range(shape.waves):
        count = per_wave + (1 if w < extra else 0)
        batch = [_job(i + k, shape, rng) for k in range(count)]
        i += count
        if w == 0:
            batch.insert(0, poison)
        waves.append(Wave(w * shape.wave_ms, tuple(batch)))
    return waves


def job_ids(waves: list[Wave]) -> Iterator[str]:
    for wave in waves:
        for req in wave.requests:
            assert req.job_id is not None
            yield req.job_id


@dataclass(frozen=True, slots=True)
class CronPlan:
    """A cron schedule the demo adds (``add_schedule`` keywords)."""

    schedule_id: str
    cron: str
    timezone: str
    task: str
    queue: str
    payload: dict[str, Any]
    # Whether it ends with the demo's window. One that does not fire in it ends
    # two days after its start instead (a cron that can never fire is refused).
    ends_with_window: bool = True


CRON_PLANS = (
    CronPlan("rollup-every-2s", "*/2 * * * * *", "UTC", "metrics.rollup", "reports", {"w": "2s"}),
    CronPlan(
        "digest-paris-5s", "*/5 * * * * *", "Europe/Paris", "digest.send", "emails", {"list": 7}
    ),
    CronPlan(
        "nightly-report",
        "0 3 * * *",
        "Europe/Paris",
        "report.build",
        "reports",
        {"n": 1},
        ends_with_window=False,
    ),
)


def cron_runs(
    schedule: CronSchedule, *, until_ms: int | None = None, limit: int = 10_000
) -> list[str]:
    """Job ids of every occurrence of a schedule with a start and an end (and at
    or before ``until_ms``: the demo's window, when the schedule lasts longer)."""
    if schedule.start_ms is None or schedule.end_ms is None:
        raise InvalidInput("schedule", schedule.schedule_id, "a schedule with a start and an end")
    out: list[str] = []
    at = schedule.start_ms - 1
    while len(out) < limit:
        nxt = next_occurrence(schedule, after_ms=at)
        if nxt is None or (until_ms is not None and nxt > until_ms):
            break
        out.append(occurrence_id(schedule.schedule_id, nxt))
        at = nxt
    return out
