"""``make demo``'s short variant runs green, as on a fresh clone: its own broker, real
processes, a kill -9 of the active emitter, nothing lost or duplicated, and nothing
left running afterwards; Ctrl-C stops everything too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of ours would still answer; /proc tells.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _env() -> dict[str, str]:
    # No DUEFLOW_BOOTSTRAP: the demo starts (and stops) a broker of its own.
    return {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_short_demo_loses_and_duplicates_nothing_and_stops_everything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo",
            "--short",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path / "demo"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    assert doc["lost"] == 0
    assert doc["duplicates"] == 0
    assert doc["scheduled"] == doc["shape"]["jobs"] == 3_000
    assert doc["executed"] == 2_999
    assert doc["dead"] == 1
    assert doc["dead_is_the_poison_job"] is True
    assert doc["retried"] >= 1
    assert doc["cron_expected"] > 0
    assert doc["cron_ran"] == doc["cron_expected"]
    assert doc["schedule_failures"] == 0
    # The active emitter was killed and the standby took over.
    assert doc["failover"]["takeover_s"] is not None
    assert doc["exit_codes"]["workers"] == 0
    killed = doc["failover"]["killed"].split(" ")[0]
    assert doc["exit_codes"][killed] == -9
    survivor = next(n for n in ("emitter-a", "emitter-b") if n != killed)
    assert doc["exit_codes"][survivor] == 0
    assert "verdict" in proc.stdout
    assert "nothing lost, nothing duplicated" in proc.stdout
    # Everything it started is gone: children and its broker.
    assert "broker" in doc["pids"]
    for name, pid in doc["pids"].items():
        assert _gone(pid), f"{name} (pid {pid}) is still running"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo", "--short", "--workdir", str(workdir)],
        cwd=ROOT,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 120
        while "workers" not in pids:  # the broker and every child process have started
            assert proc.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the demo did not start its processes"
            with contextlib.suppress(OSError, ValueError):
                pids = json.loads((workdir / "pids.json").read_text())
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    output = (tmp_path / "demo.log").read_text()
    assert "interrupted: everything the demo started has been stopped" in output
    assert set(pids) >= {"broker", "emitter-a", "emitter-b", "workers", "status-view"}
    for name, pid in pids.items():
        assert _gone(pid), f"{name} (pid {pid}) is still running"
