"""benchmarks.report: the newest result of each benchmark becomes a row of the docs'
benchmarks page, with its date, command, baseline and host load; the committed page is
what the committed results give; the charts are written when matplotlib is there."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.output import provenance
from benchmarks.report import main

PCT = {"p50": 10.0, "p95": 20.0, "p99": 30.0, "max": 40.0}
RESULTS = {
    "produce": {
        "jobs": 1000,
        "rounds": 3,
        "schedules_per_s": 50_000,
        "raw_per_s": 100_000,
        "ratio": 0.5,
    },
    "scheduled_outcomes": {
        "jobs": 1000,
        "rounds": 3,
        "raw_per_s": 100_000,
        "off_per_s": 50_000,
        "on_per_s": 35_000,
        "ratio_off": 0.5,
        "ratio_on": 0.35,
        "cpu_us_per_job": {"raw": 3.0, "off": 10.0, "on": 15.0},
    },
    "emitter-drain": {
        "scenario": "drain",
        "timers": 1000,
        "fires_per_s": 40_000,
        "raw_per_s": 80_000,
        "ratio": 0.5,
    },
    "emitter-steady": {
        "scenario": "steady",
        "rate_per_s": 5000,
        "timers": 100,
        "duplicates": 0,
        "early": 0,
        "lateness_ms": PCT,
        "baseline_lateness_ms": PCT,
        "batch_max_ms": 5,
    },
    "emitter-capacity": {
        "scenario": "capacity",
        "pending": [0, 100_000, 1_000_000],
        "emitter_rss_mb": [42.0, 43.0, 43.5],
        "rss_1m_over_100k": 1.01,
        "restart_at_1m_rss_mb": 60.0,
    },
    "emitter-failover": {
        "scenario": "failover",
        "kills": 3,
        "timers": 9000,
        "lost": 0,
        "duplicates": 0,
        "takeover_s": {"p50": 4.1, "max": 4.6},
        "session_timeout_s": 3.0,
    },
    "worker-p2": {
        "processes": 2,
        "jobs": 1000,
        "partitions": 6,
        "jobs_per_s": 30_000,
        "duplicates": 0,
        "raw_consume_per_s": 150_000,
        "ratio": 0.2,
    },
    "e2e-p2": {
        "mode": "burst",
        "processes": 2,
        "jobs": 100_000,
        "window_s": 1.0,
        "throughput_jobs_per_s": 12_345,
        "lost": 0,
        "duplicates": 0,
        "raw_roundtrip_msgs_per_s": 70_000,
        "ratio": 0.176,
        "cpu_us_per_job": {"total": 110.0},
        "host": {
            "load_before": [1.0, 1, 1],
            "load_after": [2.0, 1, 1],
            "date": "2030-01-02 03:04 UTC",
        },
    },
    "e2e-steady": {
        "mode": "steady",
        "processes": 2,
        "jobs": 1000,
        "rate_per_s": 5000,
        "duration_s": 20,
        "lateness_ms": PCT,
        "lateness_cdf_ms": list(range(101)),
        "raw_latency_ms": PCT,
        "lost": 0,
        "duplicates": 0,
    },
    "cron_next_fire": {"unit": "us_per_call", "rows": [{"next_fire_us": 6.0, "tz_lookup_us": 2.0}]},
}


def _results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    for name, doc in RESULTS.items():
        (results / f"{name}.json").write_text(json.dumps(doc))
    (results / "host.json").write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": 2,
                    "cpu_model": "X",
                    "memory_gib": 24,
                    "python": "3.11",
                    "broker": "local",
                },
                "runs": {
                    "produce": {
                        "command": "python -m benchmarks.produce --jobs 1000 --rounds 3",
                        "load_before": [3.5, 1, 1],
                        "load_after": [4.0, 1, 1],
                        "date": "2030-01-01 00:00 UTC",
                    }
                },
            }
        )
    )
    return results


def test_the_page_has_a_row_per_result_with_its_date_command_and_baseline(
    tmp_path: Path,
) -> None:
    results = _results(tmp_path)
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    img = tmp_path / "docs" / "img"
    assert main(["--results", str(results), "--img", str(img), "--page", str(page)]) == 0

    text = page.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    headers = [ln for ln in rows if ln.startswith("| benchmark |")]
    assert len(rows) - len(headers) == len(RESULTS)  # one row each
    assert "| 0.50 | 2030-01-01 00:00 UTC | 3.5 → 4.0 |" in text
    assert "- `python -m benchmarks.produce --jobs 1000 --rounds 3`: schedule (SDK" in text
    assert "| 3.5 → 4.0 |" in text  # host load from host.json
    assert "| 1.0 → 2.0 |" in text  # ... or from the result itself
    assert "2030-01-02 03:04 UTC" in text  # the result's own date
    assert "12,345 jobs/s; 0 lost, 0 dup; 110 µs CPU/job" in text
    assert "35,000 / 50,000 jobs/s; 15 / 10 µs CPU/job | raw produce 100,000/s | 0.35 / 0.50 |" in (
        text
    )
    assert "**Machine**: 2 cores (X), 24 GiB, Python 3.11; broker: local." in text
    if importlib.util.find_spec("matplotlib") is not None:
        for chart in ("throughput", "lateness", "rss"):
            assert (img / f"{chart}.png").stat().st_size > 10_000
            assert f"![{chart}](img/{chart}.png)" in text


def test_the_newest_result_of_a_benchmark_and_configuration_counts(tmp_path: Path) -> None:
    results = _results(tmp_path)
    e2e: dict[str, Any] = json.loads(json.dumps(RESULTS["e2e-p2"]))
    newer = {**e2e, "throughput_jobs_per_s": 54_321}
    newer["host"] = {**e2e["host"], "date": "2030-02-01 00:00 UTC"}
    (results / "e2e-p2-again.json").write_text(json.dumps(newer))
    other = {**e2e, "processes": 1, "throughput_jobs_per_s": 1_111, "host": {"date": "2029"}}
    (results / "e2e-p1.json").write_text(json.dumps(other))  # another configuration
    docs, host = report.load(results)
    kept = report.current(docs, host)
    assert "e2e-p2-again" in kept
    assert "e2e-p2" not in kept
    assert "e2e-p1" in kept
    page = report.page(kept, host)
    assert "54,321 jobs/s" in page
    assert "12,345 jobs/s" not in page


def test_the_committed_page_is_what_the_committed_results_give() -> None:
    docs, host = report.load(report.RESULTS)
    assert report.PAGE.read_text() == report.page(report.current(docs, host), host), (
        "docs/benchmarks.md is stale: run `python -m benchmarks.report`"
    )


def test_a_result_written_by_a_benchmark_says_when_and_how_it_was_measured() -> None:
    got = provenance(["/x/benchmarks/e2e.py", "--jobs", "10", "--json", "out.json", "--runs=2"])
    assert got["command"] == "python -m benchmarks.e2e --jobs 10 --runs=2"
    assert got["date"].endswith(" UTC")
    assert got["machine"]["cpus"] >= 1
