"""Every benchmark at sane sizes, one after the other, then the report (``make bench``).

    python -m benchmarks.suite [--only e2e-p2,worker-p1] [--results benchmarks/results]
                               [--page docs/benchmarks.md]

Each benchmark runs as its own process (``python -m benchmarks.<name> ...
--json <results>/<run>.json``), with its own local broker unless
``DUEFLOW_BOOTSTRAP`` is set. ``<results>/host.json`` records the machine
and, per run, the host's load average before and after, the seconds it took
and its exit code: the machine is shared, so the load belongs with every
number. A failing benchmark is recorded and the suite goes on. About 12-15
minutes on the 2-core machine. Then ``python -m benchmarks.report`` turns the
results into the benchmarks page of the docs (``docs/benchmarks.md``) and its
charts (``docs/img/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path("benchmarks/results")

# (run name, module, arguments): the run name is the JSON file's stem, and its
# first part (before "-") names the benchmark for the report.
RUNS: list[tuple[str, str, list[str]]] = [
    ("produce", "benchmarks.produce", ["--jobs", "100000", "--rounds", "3"]),
    (
        "scheduled_outcomes",
        "benchmarks.scheduled_outcomes",
        ["--jobs", "100000", "--rounds", "3"],
    ),
    ("emitter-drain", "benchmarks.emitter", ["--scenario", "drain", "--timers", "300000"]),
    (
        "emitter-steady",
        "benchmarks.emitter",
        ["--scenario", "steady", "--rate", "5000", "--duration", "20"],
    ),
    ("emitter-capacity", "benchmarks.emitter", ["--scenario", "capacity"]),
    ("emitter-failover", "benchmarks.emitter", ["--scenario", "failover", "--kills", "3"]),
    ("worker-p1", "benchmarks.worker", ["--jobs", "200000", "--processes", "1"]),
    ("worker-p2", "benchmarks.worker", ["--jobs", "200000", "--processes", "2"]),
    ("e2e-p1", "benchmarks.e2e", ["--jobs", "100000", "--processes", "1"]),
    ("e2e-p2", "benchmarks.e2e", ["--jobs", "100000", "--processes", "2"]),
    ("e2e-p2-200k", "benchmarks.e2e", ["--jobs", "200000", "--processes", "2"]),
    (
        "e2e-steady",
        "benchmarks.e2e",
        ["--mode", "steady", "--rate", "5000", "--duration", "20", "--processes", "2"],
    ),
    ("cron_next_fire", "benchmarks.cron_next_fire", ["--number", "2000"]),
]


def machine() -> dict[str, Any]:
    mem_kb = 0
    model = ""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "broker": "local single-node Kafka (KRaft) on the same machine"
        if not os.environ.get("DUEFLOW_BOOTSTRAP")
        else os.environ["DUEFLOW_BOOTSTRAP"],
    }


def run_one(name: str, module: str, args: list[str], results: Path) -> dict[str, Any]:
    out = results / f"{name}.json"
    tmp = results / f"{name}.json.tmp"
    cmd = [sys.executable, "-m", module, *args, "--json", str(tmp)]
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    code = subprocess.run(cmd, check=False).returncode
    seconds = time.monotonic() - t0
    if code == 0 and tmp.exists():
        tmp.replace(out)
    else:
        tmp.unlink(missing_ok=True)
    return {
        "command": " ".join(["python", *cmd[1:-2]]),
        "exit_code": code,
        "seconds": round(seconds, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__)
    p.add_argument("--only", help="comma-separated run names (default: all)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-report", action="store_true", help="do not run the report afterwards")
    p.add_argument("--page", help="the benchmarks page the report writes (docs/benchmarks.md)")
    args = p.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    args.results.mkdir(parents=True, exist_ok=True)
    host_path = args.results / "host.json"
    host = json.loads(host_path.read_text()) if host_path.exists() else {"runs": {}}
    host["machine"] = machine()
    failed = []
    for name, module, run_args in RUNS:
        if wanted is not None and name not in wanted:
            continue
        host["runs"][name] = run_one(name, module, run_args, args.results)
        host_path.write_text(json.dumps(host, indent=2) + "\n")
        if host["runs"][name]["exit_code"] != 0:
            failed.append(name)
    if not args.no_report:
        from benchmarks.report import main as report

        report(["--results", str(args.results), *(["--page", args.page] if args.page else [])])
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
