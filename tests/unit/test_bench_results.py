"""The JSON of the steady benchmarks: headlines over every job (of every run), the
settled figure only beside it, the spread of the runs' p99, CPU per job by process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.e2e_result import (
    Measured,
    Run,
    combine,
    host_cpu_share,
    per_second,
    run_figures,
)
from benchmarks.emitter import SteadyRun, combine_steady, first_sightings

START_S = 1_000.0
START_MS = int(START_S * 1000)


def measured(late_ms: list[int], *, settled_from: int = 3, **over: Any) -> Measured:
    """Jobs due one a millisecond from START; job i runs late_ms[i] after its due time.
    Jobs due from ``settled_from`` ms on are the settled ones."""
    runs: list[Run] = [
        (f"k{i}", START_MS + i, START_MS + i + late, START_MS + i + 1)
        for i, late in enumerate(late_ms)
    ]
    fields: dict[str, Any] = {
        "jobs": len(late_ms),
        "runs": runs,
        "started_s": START_S,
        "done_s": START_S + 2.0,
        "schedule_s": 1.0,
        "load_s": 23.0,
        "settled_from_ms": START_MS + settled_from,
        "raw_msgs_per_s": 100_000.0,
        "raw_seconds": 0.5,
        "raw_latencies": [5.0] * len(late_ms),
        "raw_cpu_s": {"producer": 0.001, "consumer": 0.002},
        "cpu_s": {
            "load_producer": 0.01,
            "emitter": 0.02,
            "worker_1": 0.03,
            "worker_2": 0.03,
            "broker": None,
        },
        "watcher_cpu_s": 0.005,
        "broker_jit_cpu_s": None,
        "emitter_commit_ms": {"count": 3},
        "broker_state": "warmed",
        "broker_load_before_s": 40.0,
    }
    fields.update(over)
    return Measured(**fields)


def test_the_headline_is_over_every_job_and_the_settled_figure_beside_it() -> None:
    # the first jobs (the settling time) are slow: the headline keeps them
    m = measured([300, 250, 200, *([10] * 97)])
    out = combine([m], steady=True)
    assert out["lateness_ms"] == {"p50": 10.0, "p95": 10.0, "p99": 300.0, "max": 300.0}
    assert out["lateness_settled_ms"]["max"] == 10.0
    assert out["settled_jobs"] == 97
    assert out["executed"] == 100
    assert out["lost"] == 0
    assert "handler start - due" in out["lateness_measure"]
    assert "lateness_incl_settle_ms" not in out


def test_a_duplicate_counts_once_and_a_missing_job_as_lost() -> None:
    m = measured([10, 20, 30])
    runs = [*m.runs, ("k0", START_MS, START_MS + 900, START_MS + 1)]  # run again, later
    m2 = measured([10, 20, 30], runs=runs, jobs=4)
    out = run_figures(m2, steady=True)
    assert out["duplicates"] == 1
    assert out["lost"] == 1
    assert out["lateness_ms"]["max"] == 30.0  # the first run of k0, not the later one


def test_runs_are_pooled_for_the_headline_and_spread_by_their_p99() -> None:
    runs = [measured([10] * 99 + [p99]) for p99 in (50, 282, 69)]
    out = combine(runs, steady=True)
    assert out["runs"] == 3
    assert out["jobs"] == 300
    assert [r["lateness_ms"]["p99"] for r in out["per_run"]] == [50.0, 282.0, 69.0]
    assert out["lateness_p99_spread_ms"] == {"min": 50.0, "median": 69.0, "max": 282.0}
    assert out["lateness_ms"]["max"] == 282.0
    assert out["raw_latency_p99_spread_ms"] == {"min": 5.0, "median": 5.0, "max": 5.0}
    for r in out["per_run"]:
        assert r["broker_state"] == "warmed"
        assert r["load_s"] == 23.0
    json.dumps(out, allow_nan=False)  # plain JSON: no NaN anywhere


def test_cpu_per_job_is_by_process_and_the_total_leaves_the_watcher_out() -> None:
    out = combine([measured([10] * 100), measured([10] * 100)], steady=True)
    cpu = out["cpu_us_per_job"]
    # 2 runs x 0.03 s over 200 jobs = 300 us per job
    assert cpu == {
        "load_producer": 100.0,
        "emitter": 200.0,
        "worker_1": 300.0,
        "worker_2": 300.0,
        "total": 900.0,
    }
    assert out["raw_cpu_us_per_record"] == {"producer": 10.0, "consumer": 20.0, "total": 30.0}
    assert out["per_run"][0]["watcher_cpu_us_per_job"] == 50.0


def test_a_burst_reports_throughput_against_the_raw_roundtrip() -> None:
    out = combine([measured([10] * 100)], steady=False)
    assert out["throughput_jobs_per_s"] == 50  # 100 jobs in 2 s
    assert out["raw_roundtrip_msgs_per_s"] == 200  # 100 records in 0.5 s
    assert out["ratio"] == 0.25
    assert "lateness_settled_ms" not in out


def test_per_second_groups_first_runs_by_their_due_second_and_splits_the_path() -> None:
    # second 0: two jobs on time; second 2: one job 300 ms late, 250 of it after
    # the emitter's stamp; a re-run of a job counts once (its first run)
    runs: list[Run] = [
        ("a", START_MS + 10, START_MS + 15, START_MS + 11),
        ("b", START_MS + 900, START_MS + 910, START_MS + 902),
        ("c", START_MS + 2_100, START_MS + 2_400, START_MS + 2_150),
        ("c", START_MS + 2_100, START_MS + 9_000, START_MS + 2_150),
    ]
    rows = per_second(runs)
    assert [(r["second"], r["jobs"]) for r in rows] == [(0, 2), (2, 1)]
    assert rows[0]["lateness_p99_ms"] == 10.0
    assert rows[1]["lateness_p99_ms"] == 300.0
    assert rows[1]["fired_lateness_p99_ms"] == 50.0
    assert rows[1]["fired_to_start_p99_ms"] == 250.0
    assert per_second([]) == []


def test_per_second_of_runs_without_a_stamp_has_no_stamp_figures() -> None:
    rows = per_second([("a", START_MS, START_MS + 7, -1)])
    assert rows[0]["lateness_p99_ms"] == 7.0
    assert rows[0]["fired_lateness_p99_ms"] is None
    assert rows[0]["fired_to_start_p99_ms"] is None


def test_host_cpu_share_counts_idle_and_iowait_as_not_busy_and_steal_apart() -> None:
    before = [100, 0, 50, 800, 50, 0, 0, 0]
    after = [400, 0, 150, 900, 50, 0, 0, 100]  # 400 busy, 100 idle, 100 of it stolen
    assert host_cpu_share(before, after) == {"busy": 0.833, "steal": 0.167}
    assert host_cpu_share(before, before) == {"busy": None, "steal": None}


def test_no_runs_is_refused() -> None:
    with pytest.raises(ValueError, match="no runs"):
        combine([], steady=True)


# ----------------------------------------------------------------------------- emitter


def steady_run(
    seen_late: list[int], *, stamp_late: int = 1, timers: int | None = None
) -> SteadyRun:
    due = 5_000
    records = [
        (f"s{i}", due, due + stamp_late, due + late, due + stamp_late)
        for i, late in enumerate(seen_late)
    ]
    return SteadyRun(
        timers=len(seen_late) if timers is None else timers,
        written_s=10.0,
        records=records,
        baseline=[20.0] * len(seen_late),
        emitter_cpu_s=2.5,
        transactions=10,
        histogram={"0.01": 0.9},
        load_s=10.0,
        broker_state="cold",
        broker_load_before_s=0.0,
    )


def test_the_emitter_headline_is_what_a_consumer_saw_not_the_produce_stamp() -> None:
    out = combine_steady([steady_run([10] * 99 + [69])])
    assert out["lateness_ms"]["p99"] == 69.0
    assert out["emit_stamp_lateness_ms"]["p99"] == 1.0
    assert "read_committed" in out["lateness_measure"]
    assert "not committed" in out["emit_stamp_measure"]
    assert "seen_lateness_ms" not in out


def test_the_emitter_spread_and_its_lost_and_duplicate_jobs() -> None:
    a = steady_run([10] * 99 + [50])
    b = steady_run([10] * 99 + [90], timers=101)
    dup = SteadyRun(**{**b.__dict__, "records": [*b.records, ("s0", 5_000, 5_001, 5_500, 5_001)]})
    out = combine_steady([a, dup])
    assert out["runs"] == 2
    assert out["lost"] == 1
    assert out["duplicates"] == 1
    assert out["lateness_p99_spread_ms"] == {"min": 50.0, "median": 70.0, "max": 90.0}
    assert out["baseline_p99_spread_ms"]["median"] == 20.0
    assert [r["broker_state"] for r in out["per_run"]] == ["cold", "cold"]
    assert out["rate_per_s"] == 10  # 201 timers over 20 s
    json.dumps(out, allow_nan=False)


def test_first_sightings_keep_the_earliest_record_of_each_job() -> None:
    records = [("a", 0, 0, 30, 0), ("b", 0, 0, 10, 0), ("a", 0, 0, 20, 0)]
    assert first_sightings(records) == [("b", 0, 0, 10, 0), ("a", 0, 0, 20, 0)]


def test_the_report_rows_lead_with_every_job_and_show_the_spread() -> None:
    from benchmarks.report import row

    e2e = {**combine([measured([10] * 99 + [p]) for p in (50, 282, 69)], steady=True)}
    e2e.update(mode="steady", rate_per_s=5000, duration_s=20, settle_s=3, processes=2)
    r = row("e2e-steady", e2e)
    assert r is not None
    assert r[1].endswith(", 3 runs")
    # pooled: 3 slow jobs of 300 are the p99.x, not the p99
    assert r[2].startswith("start - due, every job p50 10 / p99 50 / max 282 ms")
    assert "p99 over the runs 50 / 69 / 282 ms" in r[2]
    assert "(settled, after 3 s:" in r[2]
    em = {**combine_steady([steady_run([10] * 99 + [69])]), "runs": 1}
    r = row("emitter-steady", em)
    assert r is not None
    assert r[2].startswith("seen by a read_committed consumer - due, every job p50 10 / p99 69")
    assert "(produce stamp - due: p50 1 / p99 1 / max 1 ms)" in r[2]
    assert "over the runs" not in r[2]
