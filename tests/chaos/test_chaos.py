"""The short chaos run of CI: every fault kind of ``tests/chaos/faults.py`` at least
once (kill -9 and SIGSTOP of the active emitter and of workers, rolling restarts,
skewed clocks, broker restarts and pauses, added and removed workers) for three
minutes, and lose, run twice or run early nothing, as Kafka committed it
(tests/chaos/verdict.py has the rules; a job fired twice is no failure: the
workers skip the copy); and jobs cancelled, moved or updated by command while
they wait never run cancelled, early or in their old version.

The driver is ``benchmarks/chaos.py`` (``python -m benchmarks.chaos --minutes M``
for longer runs); it starts its own broker and stops everything it started by
pid, also when this test fails. ``DUEFLOW_CHAOS_MINUTES`` changes the length,
``DUEFLOW_CHAOS_MIN_PER_KIND`` the minimum per kind (1 in three minutes: two of
each take about 150 s of faults alone; ``python -m benchmarks.chaos`` asks for 2 from
5 minutes on).
A missing libfaketime fails the run (``make faketime-deps`` installs it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.ci_run import ci_chaos_report, summary_of
from tests.chaos.verdict import MUST_BE_ZERO

MINUTES = float(os.environ.get("DUEFLOW_CHAOS_MINUTES", "3"))
MIN_PER_KIND = int(os.environ.get("DUEFLOW_CHAOS_MIN_PER_KIND", "1"))


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60) + 900)
def test_no_job_is_lost_doubled_or_early_under_faults(tmp_path: Path) -> None:
    report = ci_chaos_report(tmp_path, minutes=MINUTES, min_per_kind=MIN_PER_KIND)
    summary = summary_of(report, "lost_by_stage", *MUST_BE_ZERO)
    # every kind at least MIN_PER_KIND times (12 kinds): the fault count follows
    assert not report["kinds_short"], (summary, report["kinds_short"])
    assert report["faults"] >= 12 * MIN_PER_KIND, summary
    assert report["faults_ok"], (summary, report["faults_missing"])
    assert report["lost"] == 0, (summary, report["lost_keys"])
    assert report["unexcused"] == 0, (summary, report["unexcused_runs"])
    assert report["early"] == 0, (summary, report["early_runs"])
    assert report["duplicates"] == 0, (summary, report["duplicate_keys"])
    assert report["dlq_unexpected"] == 0, (summary, report["dlq_unexpected_keys"])
    assert report["dlq_expected"] == report["dlq_expected_of"], (summary, report["dlq_problems"])
    assert report["flaky_wrong_attempt"] == 0, (summary, report["flaky_wrong"])
    assert report["flaky_ok"] == report["flaky_jobs"], summary
    assert report["retry_early"] == 0, (summary, report["retry_early_runs"])
    # jobs steered by command while they waited: a cancel before the due time never
    # ran, a move's or an update's old version never ran, a moved job never early
    for rule in ("steer_cancel_ran", "steer_cancel_unconfirmed", "steer_ran_old"):
        assert report[rule] == 0, (summary, report["steer_problems"])
    # commands acknowledged before their job's due time: the rules had cases to judge
    binding = report["steered_binding"]
    assert sum(binding.values()) >= 10, (summary, report["steered"])
    assert binding.get("cancel", 0) >= 1, (summary, report["steered"])
    assert report["unexpected_exits"] == 0, report["unexpected_exit_log"]
    assert report["jobs"] > 1000, summary
