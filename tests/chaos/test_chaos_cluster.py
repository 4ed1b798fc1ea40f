"""The short chaos run of CI on a replicated 3-node cluster (``--cluster 3``): every
fault kind at least once, the broker kinds replaced by node faults (kill -9 and
SIGSTOP of the node leading an exec or timer partition, coordinating the active
emitter's transactions, or the worker, lease or emitter offsets group), and lose,
double or run early nothing, as Kafka committed it (tests/chaos/verdict.py).

The driver is ``benchmarks/chaos.py`` (``python -m benchmarks.chaos --cluster 3
--minutes M`` for longer runs); it starts its own cluster and stops everything it
started by pid, also when this test fails. ``DUEFLOW_CHAOS_CLUSTER_MINUTES``
changes the length (default 3: eleven kinds, a node restart alone takes 15-60 s
on the 2-core machine), ``DUEFLOW_CHAOS_MIN_PER_KIND`` the minimum per kind.
Measured end to end (cluster start, topics, processes, faults, waiting, judging,
stopping): 4 min 26 s to 4 min 57 s on the shared 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import verdict
from tests.chaos.ci_run import ci_chaos_report, summary_of
from tests.chaos.fault_plan import fault_weights

MINUTES = float(os.environ.get("DUEFLOW_CHAOS_CLUSTER_MINUTES", "3"))
MIN_PER_KIND = int(os.environ.get("DUEFLOW_CHAOS_MIN_PER_KIND", "1"))
NODES = 3
MUST_BE_ZERO = {**verdict.MUST_BE_ZERO, "unexpected_exits": "unexpected_exit_log"}


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60) + 900)
def test_no_job_is_lost_doubled_or_early_when_cluster_nodes_fail(tmp_path: Path) -> None:
    report = ci_chaos_report(
        tmp_path, minutes=MINUTES, min_per_kind=MIN_PER_KIND, cluster_nodes=NODES
    )
    summary = summary_of(report, "node_faults", "phases_s", *MUST_BE_ZERO)
    kinds = fault_weights(cluster_nodes=NODES)
    assert {"kill_leader", "pause_leader"} <= set(kinds)
    assert report["cluster_nodes"] == NODES
    assert not report["kinds_short"], (summary, report["kinds_short"])
    assert report["faults"] >= len(kinds) * MIN_PER_KIND, summary
    assert report["faults_ok"], (summary, report["faults_missing"])
    # every node fault hit a node that came back into every ISR and led again
    assert report["node_faults"], summary
    assert all(f["recovered_ms"] is not None for f in report["node_faults"]), summary
    for key, evidence in MUST_BE_ZERO.items():
        assert report[key] == 0, (key, summary, report[evidence])
    assert report["dlq_expected"] == report["dlq_expected_of"], (summary, report["dlq_problems"])
    assert report["flaky_ok"] == report["flaky_jobs"], summary
    # commands acknowledged before their job's due time: the rules had cases to judge
    binding = report["steered_binding"]
    assert sum(binding.values()) >= 10, (summary, report["steered"])
    assert binding.get("cancel", 0) >= 1, (summary, report["steered"])
    assert report["jobs"] > 1000, summary
