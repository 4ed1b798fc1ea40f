"""The systemd units of deploy/systemd/: commands the CLI accepts, stop timeouts that
outlast the drain, credentials only from an environment file.

(`systemd-analyze verify` on them, where systemd is, reports only that
/opt/dueflow/bin/dueflow does not exist on a machine without dueflow installed.)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dueflow.apps.cli.main import build_parser
from dueflow.config import load_settings

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def parse_unit(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> every value (systemd allows a key more than once)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line!r}"
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def env_of(unit: dict[str, list[str]]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in unit.get("Service.Environment", []))


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("dueflow-emitter.service", "emitter"),
        ("dueflow-worker@.service", "worker"),
        ("dueflow-status-view.service", "status-view"),
    ],
)
def test_each_unit_runs_a_dueflow_service_the_cli_accepts(name: str, command: str) -> None:
    unit = parse_unit(UNITS / name)
    (exec_start,) = unit["Service.ExecStart"]
    argv = shlex.split(exec_start.replace("%i", "billing").replace("${DUEFLOW_APP_MODULES}", "m"))
    assert argv[0] == "/opt/dueflow/bin/dueflow"
    assert argv[1] == command
    build_parser().parse_args(argv[1:])
    assert unit["Service.User"] == ["dueflow"]
    assert unit["Service.KillSignal"] == ["SIGTERM"]
    assert unit["Service.Restart"] == ["on-failure"]
    env = env_of(unit)
    assert env["DUEFLOW_CONFIG"] == "/etc/dueflow/dueflow.toml"
    assert not [k for k in env if "PASSWORD" in k or "TOKEN" in k], "credentials in the unit"
    assert "-/etc/dueflow/secrets.env" in unit["Service.EnvironmentFile"]
    load_settings(env={k: v for k, v in env.items() if k != "DUEFLOW_CONFIG"})


def test_the_worker_unit_waits_longer_than_it_drains_and_commits() -> None:
    unit = parse_unit(UNITS / "dueflow-worker@.service")
    settings = load_settings(env={k: v for k, v in env_of(unit).items() if k != "DUEFLOW_CONFIG"})
    ws = settings.worker
    commit_s = max(5.0, ws.transaction_timeout_ms / 1000) + 7.0
    (timeout,) = unit["Service.TimeoutStopSec"]
    assert int(timeout) >= ws.shutdown_grace_s + commit_s + ws.hook_timeout_s
    assert unit["Service.KillMode"] == ["mixed"]  # SIGTERM to the parent, SIGKILL to all
    example = dict(
        line.split("=", 1)
        for line in (UNITS / "worker-billing.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert float(example["DUEFLOW_WORKER_SHUTDOWN_GRACE_S"]) + commit_s + ws.hook_timeout_s <= int(
        timeout
    )
