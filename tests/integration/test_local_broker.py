"""The `dueflow broker` commands on a broker of their own (not the session's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dueflow", "broker", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[list[str], LocalBroker]]:
    port = free_port_pair()
    args = ["--port", str(port), "--dir", str(tmp_path / "b"), "--heap", "384m"]
    broker = LocalBroker(port=port, state_dir=tmp_path / "b")
    try:
        yield args, broker
    finally:
        broker.stop()  # by pid, even if the test failed half way


def test_start_twice_status_stop_and_stop_again(
    own_broker: tuple[list[str], LocalBroker],
) -> None:
    args, broker = own_broker
    first = _cli("start", "--json", *args)
    assert first.returncode == 0, first.stderr
    started = json.loads(first.stdout)
    assert started["started"] is True
    pid = started["pid"]
    assert broker.is_ready()
    assert Path(broker.paths.pid_file).read_text().strip() == str(pid)
    assert broker.paths.log_file.exists()

    second = _cli("start", *args)
    assert second.returncode == 0
    assert f"already running: pid {pid}" in second.stdout

    status = _cli("status", "--json", *args)
    assert json.loads(status.stdout) == {"running": True, "pid": pid, "ready": True}

    stop = _cli("stop", *args)
    assert stop.returncode == 0
    assert f"broker stopped: pid {pid}" in stop.stdout
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not broker.paths.pid_file.exists()

    again = _cli("stop", *args)
    assert again.returncode == 0
    assert "no broker running" in again.stdout

    # warm start: storage already formatted, same data directory
    warm = _cli("start", "--json", *args)
    assert warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout)["started"] is True


def test_stale_pid_file_is_handled(own_broker: tuple[list[str], LocalBroker]) -> None:
    args, broker = own_broker
    broker.paths.root.mkdir(parents=True)
    broker.paths.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a broker
    status = _cli("status", *args)
    assert status.returncode == 3
    assert "not running" in status.stdout
    assert not broker.paths.pid_file.exists()
    stop = _cli("stop", *args)
    assert "no broker running" in stop.stdout
    os.kill(os.getpid(), 0)  # stop did not signal the pid from the stale file
