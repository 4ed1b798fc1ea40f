"""Alert rules and the Grafana dashboard query only metrics dueflow defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dueflow.observability.metrics import MetricFamily, Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dueflow.json"

_METRIC = re.compile(r"\b(dueflow_[a-z0-9_]+)\b")
_GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
_DURATION = re.compile(r"^\d+[smhd]$")
# Labels Prometheus itself attaches to every scraped series, and histogram buckets'.
_SCRAPE_LABELS = {"instance", "job", "le"}


def _families() -> dict[str, MetricFamily]:
    """Series name (``dueflow_fires_total``, ``..._bucket``) -> its family."""
    out = {}
    for fam in Metrics().families():
        for name in fam.sample_names():
            out[name] = fam
    return out


def check_expr(expr: str) -> list[str]:
    """Problems of one PromQL expression: unknown metrics or grouping labels."""
    families = _families()
    names = set(_METRIC.findall(expr))
    problems = [f"unknown metric {n}" for n in sorted(names) if n not in families]
    if not names:
        problems.append("uses no dueflow metric")
    known_labels = set(_SCRAPE_LABELS)
    for n in names & families.keys():
        known_labels.update(families[n].labels)
    for group in _GROUPING.findall(expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            if label not in known_labels:
                problems.append(f"label {label!r} is not a label of {sorted(names)}")
    return problems


def test_the_checker_finds_mistakes() -> None:
    assert check_expr("max by (queue) (dueflow_dlq_depth) > 0") == []
    assert check_expr("rate(dueflow_fires_total[1m])") == []
    assert check_expr("dueflow_nope > 1") == ["unknown metric dueflow_nope"]
    assert check_expr("dueflow_fires > 1") == ["unknown metric dueflow_fires"]  # no _total
    assert check_expr("sum by (tier) (dueflow_dlq_depth)") == [
        "label 'tier' is not a label of ['dueflow_dlq_depth']"
    ]
    assert check_expr("up == 0") == ["uses no dueflow metric"]


def _alerts() -> dict[str, Any]:
    doc = yaml.safe_load(ALERTS.read_text())
    assert isinstance(doc, dict)
    return doc


def test_alert_rules_have_the_required_shape() -> None:
    doc = _alerts()
    assert set(doc) == {"groups"}
    rules = []
    for group in doc["groups"]:
        assert isinstance(group["name"], str)
        assert group["rules"]
        rules.extend(group["rules"])
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.match(r"^[A-Z][A-Za-z0-9]+$", rule["alert"])
        assert isinstance(rule["expr"], str)
        assert _DURATION.match(rule["for"]), rule["for"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
    by_name = {r["alert"]: r["expr"] for r in rules}
    # the five alerts the observability issue asks for, and what each watches
    assert "dueflow_dlq_depth" in by_name["DueflowDeadLetters"]
    assert "> 0" in by_name["DueflowDeadLetters"]
    assert "dueflow_emitter_leader" in by_name["DueflowNoActiveEmitter"]
    assert "histogram_quantile(0.99" in by_name["DueflowFireLatenessHigh"]
    assert "dueflow_fire_lateness_seconds_bucket" in by_name["DueflowFireLatenessHigh"]
    assert "deriv(dueflow_consumer_lag" in by_name["DueflowConsumerLagGrowing"]
    assert "> 0.25" in by_name["DueflowClockOffsetHigh"]


def test_alert_expressions_use_only_defined_metrics_and_labels() -> None:
    for group in _alerts()["groups"]:
        for rule in group["rules"]:
            assert check_expr(rule["expr"]) == [], rule["alert"]


def _promtool() -> str | None:
    """promtool on PATH, or the one `make promtool` puts next to the venv's python."""
    beside = Path(sys.executable).parent / "promtool"
    return str(beside) if beside.exists() else shutil.which("promtool")


def test_promtool_accepts_the_rules() -> None:
    # A missing promtool fails (it skipped before, and the gate was silently off).
    promtool = _promtool()
    if promtool is None:
        pytest.fail(
            "promtool is not installed: `make promtool` extracts it from Debian's prometheus "
            "package into the virtualenv (`make test` and `make unit` run it first)"
        )
    res = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_panels_query_defined_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] == "dueflow"
    assert dash["uid"]
    panels = dash["panels"]
    assert len(panels) >= 12
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    used: set[str] = set()
    for panel in panels:
        assert panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert check_expr(target["expr"]) == [], (panel["title"], target["expr"])
            used.update(_METRIC.findall(target["expr"]))
    families = _families()
    shown = {families[n].name for n in used}
    for needed in (
        "dueflow_fires",
        "dueflow_fire_lateness_seconds",
        "dueflow_timers_pending",
        "dueflow_emitter_leader",
        "dueflow_jobs",
        "dueflow_job_duration_seconds",
        "dueflow_retries",
        "dueflow_dlq_depth",
        "dueflow_consumer_lag",
        "dueflow_clock_offset_seconds",
    ):
        assert needed in shown, f"the dashboard shows no {needed}"
