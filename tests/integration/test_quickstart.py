"""The README's Quickstart, run as written: a broker of its own (on a free port, through
``DUEFLOW_BROKER_PORT`` and ``DUEFLOW_BOOTSTRAP``, the README's commands unchanged),
the topics, the emitter and the worker as processes, the job from the shell and one
from the SDK, ``dueflow job`` until it says the job succeeded, and the first test in
test mode. A docs example that no longer works fails here."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dueflow.broker.ports import free_port_pair
from tests.support.quickstart import Step, quickstart, same_line

BIN = Path(sys.executable).parent


def user_env(port: int) -> dict[str, str]:
    """A shell of a user who installed dueflow in this virtualenv: no DUEFLOW_* of the
    test session, no PYTHONPATH; the broker's port chosen for this test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.pop("PYTHONPATH", None)
    env.pop("PYTEST_ADDOPTS", None)  # the outer run's options (e.g. --basetemp) are not the user's
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["DUEFLOW_BROKER_PORT"] = str(port)
    env["DUEFLOW_BOOTSTRAP"] = f"127.0.0.1:{port}"
    return env


def run(step: Step, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(step.argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as the README says; a kill if it does not end."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.timeout(300)
def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    files, steps = quickstart()
    assert set(files) == {"tasks.py", "schedule.py", "test_tasks.py"}
    assert [s.argv[:2] for s in steps][:2] == [["dueflow", "broker"], ["dueflow", "topics"]]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    port = free_port_pair()
    env = user_env(port)
    services: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "logs"
    logs.mkdir()
    files_open = contextlib.ExitStack()
    try:
        for step in steps:
            if step.service:
                name = step.argv[1]
                services[name] = subprocess.Popen(
                    step.argv,
                    cwd=tmp_path,
                    env=env,
                    stdout=files_open.enter_context((logs / f"{name}.out").open("wb")),
                    stderr=files_open.enter_context((logs / f"{name}.err").open("wb")),
                )
                continue
            if step.argv[:2] == ["dueflow", "job"]:
                # as the README says: ask again until the job ran
                deadline = time.monotonic() + 120
                done = run(step, tmp_path, env)
                while "state         succeeded" not in done.stdout:
                    assert time.monotonic() < deadline, (done.stdout, done.stderr, _tails(logs))
                    time.sleep(1)
                    done = run(step, tmp_path, env)
                lines = dict(
                    ln.split(None, 1) for ln in done.stdout.splitlines() if ln[:1].isalpha()
                )
                assert lines["fired"].strip() != "-"
                assert lines["started"].strip() != "-"
                continue
            done = run(step, tmp_path, env)
            assert done.returncode == 0, (step.line, done.stdout, done.stderr, _tails(logs))
            shown = step.output
            if shown:
                got = done.stdout.splitlines()
                assert len(got) >= len(shown), (step.line, done.stdout)
                for want, have in zip(shown, got, strict=False):
                    assert same_line(want, have), (step.line, want, have)

        def printed(text: str) -> bool:
            return text in (logs / "worker.out").read_text()

        deadline = time.monotonic() + 60
        while not printed("Hello, Grace!"):  # the SDK's job, due 2 s after it was made
            assert time.monotonic() < deadline, _tails(logs)
            time.sleep(0.5)
        assert printed("Hello, Ada! (job hello-1, attempt 1)")
        out = (logs / "worker.out").read_text()
        assert out.count("Hello, Ada!") == 1
        assert out.count("Hello, Grace!") == 1
    finally:
        for process in services.values():
            stop(process)
        files_open.close()
        subprocess.run(
            ["dueflow", "broker", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=60
        )
        pid_file = tmp_path / ".dueflow" / f"broker-{port}" / "broker.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)  # not stopped: kill it


def _tails(logs: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        for p in sorted(logs.iterdir())
    )
