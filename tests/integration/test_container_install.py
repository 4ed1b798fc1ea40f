"""The image's install steps in a clean virtualenv: what `docker build` would run.

deploy/docker/install.sh is the Dockerfile's only install command; here it
runs the same two steps (the locked dependencies, wheels only and hashed;
then the wheel built from this tree) into a new virtualenv, which then holds
exactly the lock plus dueflow, passes ``pip check`` and runs ``dueflow``.
Needs PyPI (or pip's cache), not a broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.unit.test_container_image import LOCK, pins

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "deploy" / "docker" / "install.sh"


def _run(*argv: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False
    )
    assert res.returncode == 0, f"{argv}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.timeout(900)
def test_the_image_install_steps_give_a_working_dueflow(tmp_path: Path) -> None:
    venv = tmp_path / "opt-dueflow"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    _run("sh", str(INSTALL), "deps", str(venv), env=env)
    _run("sh", str(INSTALL), "app", str(venv), str(ROOT), env=env)

    listed = _run(str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json")
    installed: dict[str, str] = {
        str(canonicalize_name(d["name"])): d["version"] for d in json.loads(listed)
    }
    expected = {name: str(version) for name, (version, _) in pins(LOCK).items()}
    extra = set(installed) - set(expected) - {"dueflow", "pip", "setuptools", "wheel"}
    assert not extra, f"installed beyond the lock: {sorted(extra)}"
    for name, version in expected.items():
        assert installed.get(name) == version, (name, installed.get(name), version)
    assert installed["dueflow"]

    out = _run(str(venv / "bin" / "dueflow"), "--help")
    assert "emitter" in out
    assert "worker" in out
    assert "status-view" in out
    # Every long-running command and its listener import from the wheel alone.
    _run(
        str(venv / "bin" / "python"),
        "-c",
        "import dueflow.streams.emitter.process, dueflow.consumers.worker_process, "
        "dueflow.consumers.supervisor, dueflow.streams.status.app, "
        "dueflow.observability.endpoint; "
        "from importlib import resources; "
        "assert resources.files('dueflow.streams.status').joinpath('page.html').is_file(); "
        "assert resources.files('dueflow.schemas').joinpath('job.avsc').is_file(); "
        # built where gcc is: the wheel's decoder is compiled (setup.py, mypyc)
        "import dueflow.records.worker_decoder as d; assert d.__file__.endswith('.so'), d",
    )
