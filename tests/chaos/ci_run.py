"""The short chaos run of CI, shared by the single-broker and the cluster test
(test_chaos.py, test_chaos_cluster.py): a fresh random seed, the report kept
beside the run, and the part of it a failed assertion shows."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.chaos import run_chaos

# What every failed assertion shows, besides the keys of the rule it checks.
SUMMARY_KEYS = (
    "seed",
    "jobs",
    "faults",
    "faults_by_kind",
    "dlq_expected",
    "dlq_expected_of",
    "flaky_ok",
    "flaky_jobs",
    "reexecutions",
    "excused_by_kind",
)


def ci_chaos_report(
    root: Path, *, minutes: float, min_per_kind: int, cluster_nodes: int = 1
) -> dict[str, Any]:
    """:func:`benchmarks.chaos.run_chaos` in ``root`` with a random seed; the report is
    also written to ``root/report.json``."""
    try:
        report = run_chaos(
            minutes=minutes,
            root=root,
            seed=int.from_bytes(os.urandom(4), "big"),
            min_per_kind=min_per_kind,
            cluster_nodes=cluster_nodes,
        )
    finally:
        # The run's clients (the workload's scheduler, admin clients) may be left in
        # reference cycles: destroyed now, not at some later collection, when their
        # cluster is gone and they would write "Connection refused" lines to this
        # process's stderr under a later test that reads it.
        gc.collect()
    (root / "report.json").write_text(json.dumps(report, indent=2))
    return report


def summary_of(report: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The :data:`SUMMARY_KEYS` of ``report`` and ``keys``."""
    return {k: report[k] for k in (*SUMMARY_KEYS, *keys)}
