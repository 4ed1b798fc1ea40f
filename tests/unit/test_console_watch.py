"""The console's Watch tab: the last hour per queue and cron runs in their zone (pure)."""

from __future__ import annotations

from dueflow.rules.cron_schedule import CronSchedule
from dueflow.streams.status.queue_watch import QueueWatch, next_runs

T0 = 1_800_000_000_000  # a minute boundary is not needed: buckets are by minute


def ended(state: str, at: int, *, due: int, duration: float, attempt: int = 1) -> dict[str, object]:
    return {
        "queue": "q",
        "state": state,
        "at_ms": at,
        "due_ms": due,
        "duration_ms": duration,
        "attempt": attempt,
    }


def test_the_last_hour_per_queue() -> None:
    w = QueueWatch()
    for i in range(100):  # started i ms late
        w.record(ended("succeeded", T0 + i, due=T0 - 10, duration=10.0))
    w.record(ended("retrying", T0, due=T0, duration=1.0, attempt=2))
    w.record(ended("dead", T0, due=0, duration=1.0, attempt=3))  # a late attempt: not sampled
    w.record({"queue": "q", "state": "scheduled", "at_ms": T0})  # not an attempt
    # A redriven job's first attempt: counted, not late by the hour it spent dead.
    w.record(ended("succeeded", T0, due=T0 - 3_600_000, duration=1.0), redriven=True)
    w.record(ended("succeeded", T0 - 2 * 3_600_000, due=0, duration=1.0))  # out of the window
    snap = w.snapshot(now_ms=T0 + 1000, queues=["q", "idle"])
    assert snap["q"]["ended"] == 103
    assert snap["q"]["retries"] == 1
    assert snap["q"]["dead"] == 1
    assert snap["q"]["start_late_p50_ms"] == 50.0
    assert snap["q"]["start_late_p99_ms"] == 99.0
    assert snap["idle"] == {
        "done_per_min": 0.0,
        "ended": 0,
        "start_late_p50_ms": None,
        "start_late_p99_ms": None,
        "retries": 0,
        "dead": 0,
    }
    assert w.snapshot(now_ms=T0 + 3 * 3_600_000, queues=["q"])["q"]["ended"] == 0


def test_leaders_seen_keep_changes_only() -> None:
    w = QueueWatch()
    for at, leader in ((1, "a"), (2, "a"), (3, None), (4, "b")):
        w.leader_seen(leader, at_ms=at)
    assert w.leaders == [
        {"leader": "a", "since_ms": 1},
        {"leader": None, "since_ms": 3},
        {"leader": "b", "since_ms": 4},
    ]


def test_next_three_runs_in_the_schedules_zone_across_a_dst_change() -> None:
    sched = CronSchedule(
        schedule_id="nightly",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        queue="q",
        task="t",
        payload=b"{}",
        version=1,
        created_ms=0,
        updated_ms=0,
    )
    # 2027-03-27 12:00 UTC: the next night has no 02:30 in Berlin (clocks jump to 03:00).
    runs = next_runs(sched, now_ms=1_806_148_800_000)
    assert len(runs) == 3
    assert all(r.endswith(("+01:00", "+02:00")) for r in runs)
    assert runs[1].startswith("2027-03-29T02:30:00+02:00")
