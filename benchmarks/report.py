"""The benchmarks page of the user docs, and its charts, from the committed results.

    python -m benchmarks.report [--results benchmarks/results] [--img docs/img]
                                [--page docs/benchmarks.md]

Reads ``<results>/*.json``: one result per file, the run name's first part
(before ``-``) naming the benchmark (``produce``, ``scheduled_outcomes``,
``emitter-<scenario>``, ``worker-*``, ``e2e-*``, ``cron_next_fire``,
``shards``, ``chaos-*``). Results of the same benchmark and configuration
(:func:`config_key`) are the same figure measured again: the newest one
counts. ``host.json`` holds the machine and, per run of
:mod:`benchmarks.suite`, its date, command and host load; a result written by
:func:`benchmarks.output.show` carries its own (``measured``). Experiments
(other settings, probes) live in ``<results>/log/`` and are not read.

Writes the page (``docs/benchmarks.md``): per benchmark its configuration,
result, the baseline measured in the same run with plain confluent-kafka,
the date, the command and the host load, and the machine; and the charts
(needs matplotlib: ``pip install -e '.[bench]'``, done by ``make bench``):

- ``<img>/throughput.png``: jobs per second of each stage and of the whole
  pipeline by worker processes, next to the plain-Kafka baseline of the
  same run;
- ``<img>/lateness.png``: the distribution of lateness (handler start - due,
  every job) at a steady rate, with the emitter's (seen by a consumer - due)
  and the baselines' percentiles;
- ``<img>/rss.png``: emitter memory against pending timers.

``tests/unit/test_bench_report.py`` checks that the committed page is what
this writes from the committed results.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"
PAGE = ROOT / "docs" / "benchmarks.md"

Results = dict[str, dict[str, Any]]


def load(results: Path) -> tuple[Results, dict[str, Any]]:
    docs: Results = {}
    for path in sorted(results.glob("*.json")):
        if path.name != "host.json":
            docs[path.stem] = json.loads(path.read_text())
    host_path = results / "host.json"
    host = json.loads(host_path.read_text()) if host_path.exists() else {"runs": {}}
    return docs, host


def kind(name: str) -> str:
    return name.split("-", 1)[0]


def _n(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.2f}" if abs(x) < 10 else f"{x:,.0f}"
    return f"{int(x):,}"


def _pct(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    return f"p50 {_n(p['p50'])} / p99 {_n(p['p99'])} / max {_n(p['max'])} ms"


def _load(name: str, doc: dict[str, Any], host: dict[str, Any]) -> str:
    run = host.get("runs", {}).get(name)
    if run and "load_before" in run:
        return f"{run['load_before'][0]:.1f} → {run['load_after'][0]:.1f}"
    h = doc.get("host")
    if isinstance(h, dict) and "load_before" in h and "load_after" in h:
        return f"{h['load_before'][0]:.1f} → {h['load_after'][0]:.1f}"
    return "-"


def row(name: str, doc: dict[str, Any]) -> tuple[str, str, str, str, str] | None:
    """(benchmark, configuration, result, baseline in the same run, ratio)."""
    k = kind(name)
    if k == "produce":
        return (
            "schedule (SDK `schedule_many`)",
            f"{_n(doc['jobs'])} jobs x {doc['rounds']} rounds",
            f"{_n(doc['schedules_per_s'])} jobs/s",
            f"raw produce {_n(doc['raw_per_s'])}/s",
            _n(doc["ratio"]),
        )
    if k == "scheduled_outcomes":
        cpu = doc["cpu_us_per_job"]
        return (
            "schedule: cost of the `scheduled` outcomes (on by default)",
            f"{_n(doc['jobs'])} jobs x {doc['rounds']} rounds, `schedule_many` on / off",
            f"{_n(doc['on_per_s'])} / {_n(doc['off_per_s'])} jobs/s; "
            f"{_n(cpu['on'])} / {_n(cpu['off'])} µs CPU/job",
            f"raw produce {_n(doc['raw_per_s'])}/s"
            + (
                f"; the timers and then the outcomes {_n(doc['raw_both_per_s'])}/s"
                if doc.get("raw_both_per_s")
                else ""
            ),
            f"{_n(doc['ratio_on'])} / {_n(doc['ratio_off'])}"
            + (
                f"; on against the timers and the outcomes {_n(doc['ratio_on_both'])}"
                if doc.get("ratio_on_both")
                else ""
            ),
        )
    if k == "emitter":
        sc = doc.get("scenario")
        if sc == "drain":
            return (
                "emitter: drain a backlog",
                f"{_n(doc['timers'])} overdue timers",
                f"{_n(doc['fires_per_s'])} fires/s",
                f"consume + transactional produce {_n(doc['raw_per_s'])}/s",
                _n(doc["ratio"]),
            )
        if sc == "steady":
            seen, stamp = emitter_lateness(doc)
            return (
                "emitter: lateness at a steady rate",
                f"{_n(doc['rate_per_s'])} timers/s, {_n(doc['timers'])} timers" + _runs(doc),
                f"seen by a read_committed consumer - due, every job {_pct(seen)}"
                + _spread(doc, "lateness_p99_spread_ms")
                + (f" (produce stamp - due: {_pct(stamp)})" if stamp else "")
                + f"; {doc['duplicates']} dup, {doc['early']} early",
                f"txn producer, seen - due: {_pct(doc['baseline_lateness_ms'])}"
                + _spread(doc, "baseline_p99_spread_ms"),
                "-",
            )
        if sc == "capacity":
            rss = doc["emitter_rss_mb"]
            pend = doc["pending"]
            return (
                "emitter: memory vs pending timers",
                " / ".join(_n(p) for p in pend) + " pending",
                " / ".join(f"{r:.0f}" for r in rss) + " MB RSS",
                f"0 pending: {rss[0]:.0f} MB",
                _n(doc["rss_1m_over_100k"]),
            )
        if sc == "failover":
            t = doc["takeover_s"]
            return (
                "emitter: kill -9 of the active one",
                f"{doc['kills']} kills, {_n(doc['timers'])} timers, "
                f"session {doc['session_timeout_s']} s",
                f"{doc['lost']} lost, {doc['duplicates']} dup; firing again after "
                f"p50 {t['p50']} s, max {t['max']} s",
                f"session timeout {doc['session_timeout_s']} s",
                "-",
            )
    if k == "worker":
        return (
            f"workers ({doc['processes']} process{'es' if doc['processes'] > 1 else ''})",
            f"{_n(doc['jobs'])} jobs, {doc['partitions']} partitions, exactly-once",
            f"{_n(doc['jobs_per_s'])} jobs/s; {doc['duplicates']} dup",
            f"raw consume {_n(doc['raw_consume_per_s'])}/s",
            _n(doc["ratio"]),
        )
    if k == "e2e" and doc.get("mode") == "steady":
        settle = doc.get("settle_s")
        every, settled = e2e_lateness(doc)
        return (
            "end to end: lateness at a steady rate",
            f"{_n(doc['rate_per_s'])} jobs/s for {_n(doc['duration_s'])} s"
            + (f" after {_n(settle)} s of settling" if settle else "")
            + f", {doc['processes']} worker processes"
            + _runs(doc),
            f"start - due, every job {_pct(every)}"
            + _spread(doc, "lateness_p99_spread_ms")
            + (f" (settled, after {_n(settle)} s: {_pct(settled)})" if settled else "")
            + f"; {doc['lost']} lost, {doc['duplicates']} dup",
            f"raw produce → consume at that rate {_pct(doc.get('raw_latency_ms'))}"
            + _spread(doc, "raw_latency_p99_spread_ms"),
            "-",
        )
    if k == "e2e":
        cpu = doc.get("cpu_us_per_job", {})
        runs = int(doc.get("runs") or 1)
        spread = doc.get("throughput_spread_jobs_per_s")
        per_run = (
            f" x {runs} runs (min / median / max {_n(spread['min'])} / "
            f"{_n(spread['median'])} / {_n(spread['max'])} jobs/s)"
            if runs > 1 and spread
            else ""
        )
        ahead = doc.get("ahead_s") or 0
        timed = (
            f", written {_n(ahead)} s before, timed from the first due time"
            if ahead
            else ", timed from the first schedule"
        )
        return (
            f"end to end ({doc['processes']} worker process{'es' if doc['processes'] > 1 else ''})",
            f"{_n(doc['jobs'] // runs)} jobs due within {doc.get('window_s', '-')} s"
            f"{' x ' + str(runs) + ' runs' if runs > 1 else ''}{timed}, exactly-once",
            f"{_n(doc['throughput_jobs_per_s'])} jobs/s{per_run}; {doc['lost']} lost, "
            f"{doc['duplicates']} dup; {_n(cpu.get('total'))} µs CPU/job",
            f"raw produce + consume {_n(doc['raw_roundtrip_msgs_per_s'])}/s",
            _n(doc["ratio"]),
        )
    if k == "job_lookup" and doc.get("mode") == "view":
        return (
            "`Scheduler.status` through the status view (SQLite job file)",
            f"{_n(doc['pending'])} pending + {_n(doc['finished'])} finished jobs, "
            f"{_n(doc['outcomes'])} outcomes",
            f"p50 {_n(doc['status_1_p50_ms'])} / p99 {_n(doc['status_1_p99_ms'])} ms "
            f"(8 threads: p99 {_n(doc['status_8_p99_ms'])} ms); view RSS "
            f"{_n(doc['sqlite_after_lookups_rss_mib'])} MiB, file "
            f"{_n(doc['job_file_mib_per_million'])} MiB per million jobs; restart "
            f"{_n(doc['restart_with_file_s'])} s, rebuild {_n(doc['rebuild_without_file_s'])} s; "
            f"fold {_n(doc['sqlite_fold_outcomes_per_s'])} outcomes/s"
            + (
                f" (memory store {_n(doc['memory_fold_outcomes_per_s'])}/s)"
                if "memory_fold_outcomes_per_s" in doc
                else ""
            ),
            f"scan of 200,000 outcome records {_n(doc['scan_200k_ms_median'])} ms",
            _n(doc["scan_over_status_p50"]),
        )
    if k == "job_search":
        rows = doc["searches"]
        base = rows["baseline: primary-key lookup"]
        worst = max(
            (r for n, r in rows.items() if not n.startswith("baseline")),
            key=lambda r: r["p99_ms"],
        )
        worst_kind = next(n for n, r in rows.items() if r is worst)
        return (
            "console: find jobs in the status view's job file",
            f"{_n(doc['jobs'])} jobs, {len(rows) - 1} filter kinds, page of {doc['page']}",
            f"worst p99 {_n(worst['p99_ms'])} ms ({worst_kind}); write "
            f"{_n(doc['rows_per_s_with_search_indexes'])} rows/s with the search indexes, "
            f"{_n(doc['rows_per_s_without'])} without"
            + (
                f"; building them over an older file {_n(doc['index_build_s_per_million'])} s "
                "per million jobs"
                if "index_build_s_per_million" in doc
                else ""
            ),
            f"primary-key lookup p99 {_n(base['p99_ms'])} ms",
            "-",
        )
    if k == "cron_next_fire":
        rows = doc["rows"]
        fire = sorted(r["next_fire_us"] for r in rows)[len(rows) // 2]
        look = sorted(r["tz_lookup_us"] for r in rows)[len(rows) // 2]
        return (
            "cron: next fire time",
            f"{len(rows)} expressions and zones (median)",
            f"{fire:.1f} µs/call",
            f"one tz lookup {look:.2f} µs",
            f"{fire / look:.1f}",
        )
    return None


def emitter_lateness(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(seen by a consumer - due, produce stamp - due) of an emitter steady result;
    results from before issue 18 had the produce stamp as ``lateness_ms``."""
    if "seen_lateness_ms" in doc:
        return doc["seen_lateness_ms"], doc["lateness_ms"]
    return doc["lateness_ms"], doc.get("emit_stamp_lateness_ms")


def e2e_lateness(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(every job, settled jobs) of an e2e steady result; results from before issue 18
    had the settled figure as ``lateness_ms`` and every job as
    ``lateness_incl_settle_ms``."""
    if "lateness_incl_settle_ms" in doc:
        return doc["lateness_incl_settle_ms"], doc["lateness_ms"]
    return doc["lateness_ms"], doc.get("lateness_settled_ms")


def _runs(doc: dict[str, Any]) -> str:
    n = doc.get("runs", 1)
    return f", {n} runs" if n > 1 else ""


def _spread(doc: dict[str, Any], key: str) -> str:
    s = doc.get(key)
    if doc.get("runs", 1) <= 1 or not s:
        return ""
    return f", p99 over the runs {_n(s['min'])} / {_n(s['median'])} / {_n(s['max'])} ms"


ORDER = (
    "produce",
    "scheduled_outcomes",
    "emitter",
    "shards",
    "worker",
    "e2e",
    "cron_next_fire",
    "job_lookup",
    "job_search",
    "chaos",
)
SECTIONS = {
    "produce": "Scheduling",
    "scheduled_outcomes": "Scheduling",
    "emitter": "The emitter",
    "shards": "Emitter shards",
    "worker": "Workers",
    "e2e": "End to end",
    "cron_next_fire": "Cron",
    "job_lookup": "Status by id",
    "job_search": "Finding jobs (console)",
    "chaos": "The guarantees under faults (chaos suite)",
}


def _order(name: str) -> tuple[int, str]:
    return (ORDER.index(kind(name)) if kind(name) in ORDER else len(ORDER), name)


def config_key(name: str, doc: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two results the same figure measured twice (the newer one counts)."""
    k = kind(name)
    if k == "emitter":
        return (k, doc.get("scenario"))
    if k == "worker":
        return (k, doc.get("processes"), doc.get("jobs"))
    if k == "e2e" and doc.get("mode") == "steady":
        return (k, "steady", doc.get("rate_per_s"), doc.get("duration_s"), doc.get("processes"))
    if k == "e2e":
        return (k, "burst", doc.get("processes"), doc.get("jobs"), bool(doc.get("ahead_s")))
    if k == "chaos":
        return (k, doc.get("cluster_nodes"), doc.get("minutes"))
    return (k,)


@dataclass(frozen=True)
class Measured:
    """Where a result comes from: when, with what command, on how loaded a host."""

    date: str  # "YYYY-MM-DD HH:MM UTC", or "" when the result does not say
    command: str
    load: str


def measured(name: str, doc: dict[str, Any], host: dict[str, Any]) -> Measured:
    own: dict[str, Any] = doc["measured"] if isinstance(doc.get("measured"), dict) else {}
    run: dict[str, Any] = host.get("runs", {}).get(name) or {}
    doc_host: dict[str, Any] = doc["host"] if isinstance(doc.get("host"), dict) else {}
    date = own.get("date") or doc_host.get("date") or run.get("date") or ""
    command = own.get("command") or run.get("command") or ""
    return Measured(date, command, _load(name, doc, host))


def current(docs: Results, host: dict[str, Any]) -> Results:
    """The newest result of each benchmark and configuration (:func:`config_key`)."""
    newest: dict[tuple[Any, ...], tuple[str, str]] = {}
    for name in sorted(docs):
        if row(name, docs[name]) is None and not extra_rows(name, docs[name]):
            continue
        key = config_key(name, docs[name])
        date = measured(name, docs[name], host).date
        if key not in newest or date >= newest[key][0]:
            newest[key] = (date, name)
    return {name: docs[name] for _, name in newest.values()}


def extra_rows(name: str, doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows of the results that make more than one: emitter shards, a chaos run."""
    k = kind(name)
    if k == "shards":
        base = doc["baseline"]
        f = doc["failover"]
        transactional = bool(f.get("transactional", True))
        base_kind = (
            "consume + transactional produce"
            if transactional
            else "consume + idempotent produce, offsets committed once acked"
        )
        out = []
        for d in doc["drain"]:
            seen_rate = (
                f"; seen by a consumer {_n(d['drain_per_s'])}/s" if "drain_per_s" in d else ""
            )
            out.append(
                (
                    f"emitter shards: drain, {d['shards']} shard(s) over "
                    f"{d['processes']} process(es)",
                    f"{_n(d['timers'])} overdue timers",
                    f"{_n(d['fires_per_s'])} fires/s{seen_rate}; emitter "
                    f"{d['emitter_us_per_fire']} µs, broker {d['broker_us_per_fire']} µs "
                    f"CPU/fire; first fire seen {d['first_fire_after_commit_s']} s after the "
                    f"backlog; {d['duplicates']} dup",
                    f"{base_kind} {_n(base['records_per_s'])}/s",
                    _n(d["ratio"]),
                )
            )
        seen = f["shard0_seen_lateness_ms"]
        fire = f["shard0_fire_lateness_ms"]["during"]
        copies = (
            f"{f['duplicates']} dup"
            if "duplicates" in f
            else f"{f.get('copies', 0)} copies (skipped by the workers)"
        )
        held = " (held by the dead owner's open transaction)" if transactional else ""
        out.append(
            (
                f"emitter shards: kill -9 of one shard's owner ({f['config']})",
                f"{_n(f['rate_per_s'])} timers/s, {_n(f['timers'])} timers, "
                f"session {f['session_timeout_s']} s",
                f"{f['lost']} lost, {copies}, {f['early']} early; takeover "
                f"{f['takeover_s']} s; the other shard fired p99 {_n(fire['p99'])} ms late, "
                f"seen p99 {_n(seen['during']['p99'])} ms during the takeover{held}"
                + (f", {_n(seen['before']['p99'])} ms before" if "before" in seen else ""),
                f"session timeout {f['session_timeout_s']} s",
                "-",
            )
        )
        return out
    if k == "chaos":
        faults = doc["faults_by_kind"]
        take = doc.get("takeover_ms", {}).get("kill_active_emitter") or {}
        broken = [
            key
            for key in (
                "lost",
                "unexcused",
                "early",
                "duplicates",
                "dlq_unexpected",
                "retry_early",
                "flaky_wrong_attempt",
            )
            if doc.get(key)
        ]
        where = (
            f"{doc['cluster_nodes']}-node cluster"
            if doc.get("cluster_nodes", 1) > 1
            else "one broker"
        )
        return [
            (
                f"chaos suite, {where}",
                f"{_n(doc['minutes'])} minutes, seed {doc['seed']}: {_n(doc['jobs'])} jobs, "
                f"{doc['faults']} faults of {len(faults)} kinds",
                (
                    "lost, unexcused re-runs, early, duplicates, double fires: all 0"
                    if not broken
                    else "BROKEN: " + ", ".join(broken)
                )
                + f"; flaky jobs ok {doc['flaky_ok']}/{doc['flaky_jobs']}, dead letters as "
                f"planned {doc['dlq_expected']}/{doc['dlq_expected_of']}; "
                f"{doc['excused']} excused re-runs; emitter takeover after kill -9 "
                f"p50 {_n(take.get('p50'))} / max {_n(take.get('max'))} ms",
                f"takeover bound {_n(doc.get('takeover_bound_ms'))} ms",
                "-",
            )
        ]
    return []


def rows_of(name: str, doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    one = row(name, doc)
    return [one] if one is not None else extra_rows(name, doc)


def machine_text(host: dict[str, Any]) -> str:
    m = host.get("machine") or {}
    if not m:
        return "not recorded"
    return (
        f"{m.get('cpus')} cores ({m.get('cpu_model', '?')}), {m.get('memory_gib')} GiB, "
        f"Python {m.get('python')}; broker: {m.get('broker')}"
    )


def tables(docs: Results, host: dict[str, Any]) -> list[str]:
    """One table per section (the benchmark, its configuration, the result, the
    baseline of the same run, the ratio, when, the host load), and under it the
    command of each row."""
    lines: list[str] = []
    by_section: dict[str, list[str]] = {}
    for name in sorted(docs, key=_order):
        by_section.setdefault(SECTIONS.get(kind(name), "Other"), []).append(name)
    for title, names in by_section.items():
        lines += [
            "",
            f"## {title}",
            "",
            "| benchmark | configuration | result | baseline, same run | ratio | measured "
            "| host load |",
            "|---|---|---|---|---|---|---|",
        ]
        commands: dict[str, list[str]] = {}
        for name in names:
            doc = docs[name]
            meta = measured(name, doc, host)
            for r in rows_of(name, doc):
                cells = [*r, meta.date or "-", meta.load]
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
                commands.setdefault(meta.command or "(not recorded)", []).append(f"{r[0]}, {r[1]}")
        lines += ["", "Commands:", ""]
        for command, what in commands.items():
            shown = f"`{command}`" if not command.startswith("(") else command
            rows = "every row above" if len(commands) == 1 else "; ".join(dict.fromkeys(what))
            lines.append(f"- {shown}: {rows}")
    return lines


def chart_names(docs: Results) -> list[str]:
    """The charts :func:`charts` draws from these results."""
    names = []
    if any(
        kind(n) in ("produce", "worker")
        or (kind(n) == "emitter" and d.get("scenario") == "drain")
        or (kind(n) == "e2e" and d.get("mode") == "burst")
        for n, d in docs.items()
    ):
        names.append("throughput")
    if any(
        (kind(n) == "e2e" and d.get("mode") == "steady")
        or (kind(n) == "emitter" and d.get("scenario") == "steady")
        for n, d in docs.items()
    ):
        names.append("lateness")
    if any(kind(n) == "emitter" and d.get("scenario") == "capacity" for n, d in docs.items()):
        names.append("rss")
    return names


def page(docs: Results, host: dict[str, Any]) -> str:
    """The benchmarks page (markdown) of the current results."""
    lines = [
        "<!-- Generated by `python -m benchmarks.report` from benchmarks/results/: do not edit "
        "here. -->",
        "",
        "# Benchmarks",
        "",
        "Each figure is the newest measurement of its benchmark, with the date it was "
        "measured, the command that measures it and a **baseline measured in the same run** "
        "on the same broker: plain confluent-kafka doing the same Kafka work (producing, "
        "consuming, or consuming and producing transactionally) without dueflow. Compare a "
        "figure with its own baseline, not with another row: the runs are minutes or days "
        "apart on a machine other work shares.",
        "",
        f"**Machine**: {machine_text(host)}. The broker, the benchmark and every dueflow "
        "process share the same cores, so these are a floor, not a ceiling: on separate "
        "machines each part has cores of its own. **Host load** is the 1-minute load "
        "average before → after the run (above the core count, other work competed for "
        "the cores).",
        "",
        "`make bench` runs every benchmark of the suite (`python -m benchmarks.suite`, "
        "about 15 minutes, each with a broker of its own) and then this report "
        "(`python -m benchmarks.report`), which rewrites this page and its charts from "
        "`benchmarks/results/`. One benchmark: its command below, with `--json PATH`.",
    ]
    lines += tables(docs, host)
    charts_ = chart_names(docs)
    if charts_:
        lines += ["", "## Charts", ""]
        lines += [f"![{c}](img/{c}.png)" for c in charts_]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- charts


def charts(docs: Results, img: Path) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    # 1. throughput: each stage and the pipeline, against its raw baseline
    bars: list[tuple[str, float, float]] = []
    for name in sorted(docs, key=lambda n: (ORDER.index(kind(n)) if kind(n) in ORDER else 9, n)):
        d = docs[name]
        k = kind(name)
        if k == "produce":
            bars.append(("schedule_many", d["schedules_per_s"], d["raw_per_s"]))
        elif k == "emitter" and d.get("scenario") == "drain":
            bars.append(("emitter drain", d["fires_per_s"], d["raw_per_s"]))
        elif k == "worker":
            bars.append((f"workers x{d['processes']}", d["jobs_per_s"], d["raw_consume_per_s"]))
        elif k == "e2e" and d.get("mode") == "burst":
            label = f"end to end, {d['processes']} worker proc., {d['jobs'] // 1000}k"
            if d.get("ahead_s"):
                label += ", from due"
            bars.append((label, d["throughput_jobs_per_s"], d["raw_roundtrip_msgs_per_s"]))
    if bars:
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(bars) + 1.5))
        ys = range(len(bars))
        ax.barh([y + 0.2 for y in ys], [b[2] for b in bars], 0.4, label="plain Kafka, same run")
        ax.barh([y - 0.2 for y in ys], [b[1] for b in bars], 0.4, label="dueflow")
        for y, (_, v, raw) in zip(ys, bars, strict=True):
            ax.text(v, y - 0.2, f" {v:,.0f}", va="center", fontsize=8)
            ax.text(raw, y + 0.2, f" {raw:,.0f}", va="center", fontsize=8, color="gray")
        ax.set_yticks(list(ys), [b[0] for b in bars])
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.set_xlim(0, max(max(b[1], b[2]) for b in bars) * 1.15)
        ax.set_xlabel("jobs (or records) per second")
        ax.set_title("Throughput, exactly-once on, against plain confluent-kafka", pad=28)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
        fig.tight_layout()
        written.append(_save(fig, img / "throughput.png"))
        plt.close(fig)

    # 2. lateness at a steady rate
    steady = [d for n, d in docs.items() if kind(n) == "e2e" and d.get("mode") == "steady"]
    em = [d for n, d in docs.items() if kind(n) == "emitter" and d.get("scenario") == "steady"]
    if steady or em:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for d in steady:
            cdf = d.get("lateness_cdf_ms") or []
            if cdf:
                ax.plot(
                    [max(v, 0.5) for v in cdf],
                    range(len(cdf)),
                    label=f"end to end, handler start - due ({d['rate_per_s']:,}/s)"
                    + ("" if "lateness_incl_settle_ms" in d else ", every job"),
                )
            raw_latency = d.get("raw_latency_ms")
            if raw_latency:
                _points(ax, raw_latency, "plain produce → consume latency, same rate", "s")
        for d in em:
            seen, stamp = emitter_lateness(d)
            _points(ax, seen, "emitter only: fired, seen by a consumer", "o")
            if stamp:
                _points(ax, stamp, "emitter only: produce stamp (not committed yet)", "v")
            _points(ax, d["baseline_lateness_ms"], "txn producer baseline", "^")
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds late (log scale)")
        ax.set_ylabel("percentile of jobs")
        ax.set_ylim(0, 100.5)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title("Lateness at a steady rate")
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        written.append(_save(fig, img / "lateness.png"))
        plt.close(fig)

    # 3. emitter memory against pending timers
    cap = [d for n, d in docs.items() if kind(n) == "emitter" and d.get("scenario") == "capacity"]
    if cap:
        d = cap[0]
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [max(p, 1) for p in d["pending"]]
        ax.plot(xs, d["emitter_rss_mb"], "o-", label="emitter RSS while running")
        ax.plot([xs[-1]], [d["restart_at_1m_rss_mb"]], "s", label="after a restart at that size")
        ax.set_xscale("log")
        ax.set_ylim(0, max([*d["emitter_rss_mb"], d["restart_at_1m_rss_mb"]]) * 1.3)
        ax.set_xlabel("timers pending in the wheel (log scale; 0 drawn at 1)")
        ax.set_ylabel("MB resident")
        ax.set_title("Emitter memory does not follow the pending timers")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, img / "rss.png"))
        plt.close(fig)
    return written


def _points(ax: Any, p: dict[str, float | None], label: str, marker: str) -> None:
    xs = [max(p[k] or 0.0, 0.5) for k in ("p50", "p95", "p99", "max")]
    ax.plot(xs, [50, 95, 99, 100], marker, label=label)


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--img", type=Path, default=IMG)
    p.add_argument("--page", type=Path, default=PAGE, help="the page to write")
    p.add_argument("--no-charts", action="store_true", help="write the page only")
    args = p.parse_args(argv)
    docs, host = load(args.results)
    if not docs:
        print(f"no results in {args.results}")
        return 1
    docs = current(docs, host)
    images: list[Path] = []
    if not args.no_charts:
        try:
            images = charts(docs, args.img)
        except ImportError:
            print("matplotlib is not installed (pip install -e '.[bench]'): charts not redrawn")
    args.page.write_text(page(docs, host))
    print(f"wrote {args.page}")
    for path in images:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
