"""The demo's pure parts: the workload plan, the ledger, the tally and the summary."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from demo.ledger import Attempt, LedgerReader, LedgerView, LedgerWriter
from demo.observer import Tally
from demo.summary import Failover, percentiles, summarize
from demo.workload import (
    CRON_PLANS,
    POISON_ID,
    SHORT,
    CronPlan,
    WorkloadShape,
    cron_runs,
    job_ids,
    plan_waves,
)
from dueflow.config import load_settings
from dueflow.errors import InvalidInput
from dueflow.records.job_request import JobRules, prepare_job
from dueflow.rules.cron import first_occurrence
from dueflow.rules.cron_schedule import CronSchedule

SETTINGS = load_settings(env={}, overrides={"queues": "emails:6,reports:3"})


def test_the_plan_holds_every_job_once_in_waves_with_the_poison_job_first() -> None:
    shape = WorkloadShape(jobs=1_000, schedule_s=5.0, wave_ms=250)
    waves = plan_waves(shape, rng=random.Random(1))
    ids = list(job_ids(waves))
    assert len(ids) == len(set(ids)) == 1_000
    assert len(waves) == 20
    assert [w.at_ms for w in waves] == list(range(0, 5_000, 250))
    assert waves[0].requests[0].job_id == POISON_ID
    sizes = [len(w.requests) for w in waves]
    assert max(sizes) - min(sizes) <= 2  # spread evenly (the first wave has the poison job)


def test_the_mix_has_flaky_reports_and_emails_and_every_request_is_valid() -> None:
    waves = plan_waves(WorkloadShape(jobs=5_000), rng=random.Random(3))
    reqs = [r for w in waves for r in w.requests]
    tasks = Counter(r.task for r in reqs)
    assert tasks["webhook.deliver"] == 1
    assert 50 <= tasks["payment.charge"] <= 150  # 2 %
    assert 1_000 <= tasks["report.build"] <= 1_500  # 25 %
    assert tasks["email.send"] == 5_000 - sum(v for k, v in tasks.items() if k != "email.send")
    rules = JobRules.from_settings(SETTINGS)
    for r in reqs[:500]:
        prepared = prepare_job(r, rules=rules, now_ms=1_000_000, new_job_id=lambda _ms: "x")
        assert 500 <= prepared.due_ms - 1_000_000 <= 8_000 + 500
    flaky = [r.payload["fail_times"] for r in reqs if r.task == "payment.charge"]
    assert set(flaky) <= {1, 2}


def test_the_plan_is_reproducible_from_its_seed() -> None:
    a = plan_waves(SHORT, rng=random.Random(7))
    b = plan_waves(SHORT, rng=random.Random(7))
    assert a == b
    assert a != plan_waves(SHORT, rng=random.Random(8))


def test_kill_happens_half_way_through_the_due_times() -> None:
    shape = WorkloadShape(schedule_s=10.0, wave_ms=500, max_lead_ms=4_000, jitter_ms=0)
    assert shape.due_span_ms == 9_500 + 4_000
    assert shape.kill_at_ms == 6_750


def _schedule(cron: str, start_ms: int, end_ms: int, tz: str = "UTC") -> CronSchedule:
    return CronSchedule(
        schedule_id="s",
        cron=cron,
        timezone=tz,
        queue="emails",
        task="t",
        payload=b"{}",
        start_ms=start_ms,
        end_ms=end_ms,
        version=1,
        created_ms=0,
        updated_ms=0,
    )


@pytest.mark.parametrize(
    ("cron", "start", "end", "expected"),
    [
        ("*/2 * * * * *", 1_000, 9_000, ["s@2000", "s@4000", "s@6000", "s@8000"]),
        ("*/2 * * * * *", 2_000, 8_000, ["s@2000", "s@4000", "s@6000", "s@8000"]),  # inclusive
        ("*/5 * * * * *", 0, 4_999, ["s@0"]),
        ("0 3 * * *", 0, 60_000, []),
    ],
)
def test_cron_runs_are_the_occurrences_within_the_window(
    cron: str, start: int, end: int, expected: list[str]
) -> None:
    assert cron_runs(_schedule(cron, start, end)) == expected


def test_cron_runs_stop_at_the_demos_window() -> None:
    s = _schedule("*/2 * * * * *", 0, 86_400_000)
    assert cron_runs(s, until_ms=4_000) == ["s@0", "s@2000", "s@4000"]


@pytest.mark.parametrize("plan", CRON_PLANS, ids=lambda p: p.schedule_id)
def test_every_demo_schedule_can_fire(plan: CronPlan) -> None:
    # add_schedule refuses a cron that can never fire: one that does not come due
    # in the demo's window must outlast it (the nightly one: two days).
    start = 1_796_187_000_000  # a morning in Paris: the nightly run is hours away
    end = start + (20_000 if plan.ends_with_window else 2 * 86_400_000)
    s = dataclasses.replace(
        _schedule(plan.cron, start, end, plan.timezone), schedule_id=plan.schedule_id
    )
    first_occurrence(s, now_ms=start)  # raises InvalidInput for one that never fires
    in_window = cron_runs(s, until_ms=start + 20_000)
    assert bool(in_window) is plan.ends_with_window  # the nightly one is not due in it


def test_cron_runs_needs_a_window() -> None:
    s = dataclasses.replace(_schedule("* * * * * *", 0, 1_000), end_ms=None)
    with pytest.raises(InvalidInput, match="schedule"):
        cron_runs(s)


def test_the_ledger_counts_effects_per_key_across_process_files(tmp_path: Path) -> None:
    a = LedgerWriter(tmp_path)
    a.record(key="k1", task="t", attempt=1, due_ms=10, started_ms=15, ok=False)
    a.record(key="k1", task="t", attempt=2, due_ms=10, started_ms=520, ok=True)
    a.record(key="k2", task="t", attempt=1, due_ms=20, started_ms=22, ok=True)
    # Another process (a file of its own) applies k2 again: a duplicate effect.
    code = (
        "from pathlib import Path; from demo.ledger import LedgerWriter; "
        f"LedgerWriter(Path({str(tmp_path)!r})).record("
        "key='k2', task='t', attempt=1, due_ms=20, started_ms=30, ok=True)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(list(tmp_path.glob("ledger-*.db"))) == 2
    reader = LedgerReader(tmp_path)
    view = reader.read()
    assert view.effects == Counter({"k1": 1, "k2": 2})
    assert reader.effect_count() == 3
    assert view.retried() == {"k1"}
    assert view.first_starts() == {"k1": (10, 15), "k2": (20, 22)}


def test_the_tally_counts_first_fires_outcomes_and_dead_letters() -> None:
    t = Tally()
    t.on_exec("a", due_ms=100, fired_ms=130)
    t.on_exec("a", due_ms=100, fired_ms=900)  # a second exec record: counted, not timed
    t.on_exec("b", due_ms=None, fired_ms=None)
    t.on_outcome("a", "retrying")
    t.on_outcome("a", "retrying")
    t.on_outcome("a", "succeeded")
    t.on_outcome("c", "fired")
    t.on_dead_letter("d")
    assert t.fired == {"a": 2, "b": 1}
    assert t.fire_lateness_ms == [30]
    assert t.succeeded == {"a"}
    assert t.retrying == {"a"}
    assert t.retries == 2
    assert t.dead == {"d"}


def _view(effects: dict[str, int], attempts: list[Attempt] | None = None) -> LedgerView:
    return LedgerView(Counter(effects), attempts or [])


def test_summary_of_a_clean_run() -> None:
    attempts = [
        Attempt("j1", "t", 1, 1_000, 1_010, True),
        Attempt("j2", "t", 1, 2_000, 2_050, False),
        Attempt("j2", "t", 2, 2_000, 2_600, True),
        Attempt("j3", "t", 1, 3_000, 3_020, False),
    ]
    s = summarize(
        scheduled=["j1", "j2", "j3"],
        cron_expected=["c@1", "c@2"],
        ledger=_view({"j1": 1, "j2": 1, "c@1": 1, "c@2": 1}, attempts),
        dead={"j3"},
        fire_lateness_ms=[5.0, 7.0],
        failover=None,
        elapsed_s=1.0,
    )
    assert (s.scheduled, s.executed, s.retried, s.dead, s.duplicates, s.lost) == (3, 2, 1, 1, 0, 0)
    assert (s.cron_expected, s.cron_ran, s.cron_lost) == (2, 2, 0)
    assert s.start_lateness_ms["p50"] == 20.0
    assert s.start_lateness_ms["max"] == 50.0
    assert s.ok
    assert s.to_json()["ok"] is True


def test_summary_counts_lost_and_duplicated_jobs_and_fails() -> None:
    s = summarize(
        scheduled=["j1", "j2", "j3"],
        cron_expected=["c@1"],
        ledger=_view({"j1": 2}),
        dead={"j3"},
        fire_lateness_ms=[],
        failover=None,
        elapsed_s=1.0,
    )
    assert (s.executed, s.dead, s.duplicates, s.lost, s.cron_lost) == (1, 1, 1, 1, 1)
    assert s.lost_keys == ("j2",)
    assert s.duplicate_keys == ("j1",)
    assert not s.ok
    assert dict(s.rows())["lost"] == "1"


def test_lateness_outside_the_takeover_leaves_out_jobs_due_around_it() -> None:
    attempts = [
        Attempt("early", "t", 1, 1_000, 1_010, True),
        Attempt("during", "t", 1, 5_500, 8_500, True),
        Attempt("late", "t", 1, 20_000, 20_030, True),
    ]
    fo = Failover("emitter-a (pid 1)", killed_ms=5_000, lease_moved_ms=7_000, firing_again_ms=8_000)
    s = summarize(
        scheduled=["early", "during", "late"],
        cron_expected=[],
        ledger=_view({"early": 1, "during": 1, "late": 1}, attempts),
        dead=set(),
        fire_lateness_ms=[],
        failover=fo,
        elapsed_s=1.0,
    )
    assert s.start_lateness_ms["max"] == 3_000.0
    assert s.start_lateness_outside_takeover_ms["max"] == 30.0
    assert fo.takeover_s == 3.0
    assert fo.lease_moved_s == 2.0
    assert s.to_json()["failover"]["takeover_s"] == 3.0


def test_percentiles_use_nearest_rank() -> None:
    assert percentiles(range(1, 101)) == {"p50": 51.0, "p95": 96.0, "p99": 100.0, "max": 100.0}
    assert percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}


def test_the_reader_skips_a_file_whose_writer_has_not_created_its_tables(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "ledger-1.db").close()  # created, not set up yet
    LedgerWriter(tmp_path).record(key="k", task="t", attempt=1, due_ms=1, started_ms=2, ok=True)
    reader = LedgerReader(tmp_path)
    assert reader.effect_count() == 1
    assert reader.read().effects == Counter({"k": 1})
