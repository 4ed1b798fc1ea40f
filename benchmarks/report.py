"""Charts and a markdown table from the benchmarks' JSON results.

    python -m benchmarks.report [--results benchmarks/results] [--img docs/img]
                                [--readme README.md]

Reads ``<results>/<run>.json`` (layout: the run name's first part before
``-`` is the benchmark: ``produce``, ``scheduled_outcomes``,
``emitter-<scenario>``, ``worker-*``, ``e2e-*``, ``cron_next_fire``;
``host.json`` holds the machine and each run's host load, see
:mod:`benchmarks.suite`). Writes:

- ``<img>/throughput.png``: jobs per second of each stage and of the whole
  pipeline by worker processes, next to the plain-Kafka baseline of the
  same run;
- ``<img>/lateness.png``: the distribution of lateness (handler start - due,
  every job) at a steady rate, with the emitter's (seen by a consumer - due)
  and the baselines' percentiles;
- ``<img>/rss.png``: emitter memory against pending timers;
- ``<results>/summary.md``: the table, with the machine and the host load
  of each run; with ``--readme`` also the README's text between
  ``<!-- bench:begin -->`` and ``<!-- bench:end -->``.

Charts need matplotlib (``pip install -e '.[bench]'``, done by ``make bench``);
without it only the table is written.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path("benchmarks/results")
IMG = Path("docs/img")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

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
    if run:
        return f"{run['load_before'][0]:.1f} → {run['load_after'][0]:.1f}"
    if isinstance(doc.get("host"), dict):
        h = doc["host"]
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
            f"raw produce {_n(doc['raw_per_s'])}/s",
            f"{_n(doc['ratio_on'])} / {_n(doc['ratio_off'])}",
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
        return (
            f"end to end ({doc['processes']} worker process{'es' if doc['processes'] > 1 else ''})",
            f"{_n(doc['jobs'])} jobs due within {doc.get('window_s', '-')} s, exactly-once",
            f"{_n(doc['throughput_jobs_per_s'])} jobs/s; {doc['lost']} lost, "
            f"{doc['duplicates']} dup; {_n(cpu.get('total'))} µs CPU/job",
            f"raw produce + consume {_n(doc['raw_roundtrip_msgs_per_s'])}/s",
            _n(doc["ratio"]),
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


ORDER = ("produce", "scheduled_outcomes", "emitter", "worker", "e2e", "cron_next_fire")


def table(docs: Results, host: dict[str, Any]) -> str:
    lines = [
        "| benchmark | configuration | result | baseline (same run) | ratio | host load |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(docs, key=lambda n: (ORDER.index(kind(n)) if kind(n) in ORDER else 9, n)):
        r = row(name, docs[name])
        if r is not None:
            lines.append("| " + " | ".join([*r, _load(name, docs[name], host)]) + " |")
    return "\n".join(lines)


def machine_line(host: dict[str, Any], docs: Results) -> str:
    m = host.get("machine") or {}
    dates = [r["date"] for r in host.get("runs", {}).values() if "date" in r]
    dates += [d["host"]["date"] for d in docs.values() if isinstance(d.get("host"), dict)]
    when = f"{min(dates)[:10]}" if dates else "unknown date"
    if not m:
        return f"Measured {when}."
    return (
        f"Measured {when} on {m.get('cpus')} cores ({m.get('cpu_model', '?')}), "
        f"{m.get('memory_gib')} GiB, Python {m.get('python')}, broker: {m.get('broker')}; "
        "the broker, the benchmark and every dueflow process share the same cores. "
        "Host load is the 1-minute load average before → after each run "
        "(the machine is shared: above 2 means other work competed for the cores)."
    )


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


def section(docs: Results, host: dict[str, Any], images: list[Path], readme: Path | None) -> str:
    base = readme.parent if readme else Path()
    lines = [machine_line(host, docs), "", table(docs, host), ""]
    for path in images:
        try:
            rel = path.resolve().relative_to(base.resolve())
        except ValueError:
            rel = path
        lines.append(f"![{path.stem}]({rel.as_posix()})")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--img", type=Path, default=IMG)
    p.add_argument("--readme", type=Path, help="replace the README's benchmark section")
    args = p.parse_args(argv)
    docs, host = load(args.results)
    if not docs:
        print(f"no results in {args.results}")
        return 1
    try:
        images = charts(docs, args.img)
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no charts")
        images = []
    text = section(docs, host, images, args.readme)
    (args.results / "summary.md").write_text(text)
    print(text)
    if args.readme:
        readme = args.readme.read_text()
        if BEGIN not in readme or END not in readme:
            print(f"{args.readme} has no {BEGIN} ... {END} section: not changed")
            return 1
        new = re.sub(
            re.escape(BEGIN) + r".*?" + re.escape(END),
            lambda _m: f"{BEGIN}\n{text}{END}",
            readme,
            flags=re.S,
        )
        args.readme.write_text(new)
        print(f"updated {args.readme}")
    for path in images:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
