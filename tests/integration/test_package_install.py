"""The package as a user gets it: ``python -m build`` makes an sdist and, from it, a
wheel (no setuptools warning); the wheel installs into a clean virtualenv with the
Avro schemas (every released version) and the broker's pom; from that install
``dueflow --version`` runs, the README's quickstart files import, its first test
passes and its ``dueflow schedule`` finds the app in the working directory.

Offline and fast: the build uses this virtualenv's setuptools (``--no-isolation``),
the new virtualenv has no pip and gets dueflow with ``--no-deps``; its dependencies
come from this virtualenv's site-packages through a ``.pth`` line (which adds that
folder's modules, not its editable dueflow: .pth files there are not read).
No broker: the schedule command is pointed at a port that refuses."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.native import native_sources
from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILES = {
    f"{version}{name}.avsc"
    for version in ("", "v1/")
    for name in (
        "dead_letter",
        "idempotency_record",
        "job",
        "outcome",
        "quarantined",
        "queue",
        "schedule",
    )
} | {"v2/idempotency_record.avsc"}
# Warnings setuptools printed before: the license table, the schema folders.
BUILD_WARNINGS = ("Deprecat", "deprecat", "is absent from the `packages`", "SetuptoolsWarning")


def sh(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_the_wheel_installs_into_a_clean_virtualenv_and_runs_the_quickstart(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    log = sh(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT, cwd=ROOT)
    assert [w for w in BUILD_WARNINGS if w in log] == [], log
    (sdist,) = dist.glob("dueflow-*.tar.gz")
    # built from the sdist; with a C compiler here, its hot modules compiled (setup.py)
    (wheel,) = dist.glob("dueflow-*-cp311-cp311-*.whl")
    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {f"schemas/dueflow/schemas/{f}" for f in SCHEMA_FILES} <= in_sdist
    assert "broker/dueflow/broker/pom.xml" in in_sdist
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    assert {f"dueflow/schemas/{f}" for f in SCHEMA_FILES} <= in_wheel
    assert {"dueflow/broker/pom.xml", "dueflow/broker/log4j2.yaml"} <= in_wheel
    assert "dueflow/streams/status/page.html" in in_wheel
    compiled = {n for n in in_wheel if n.endswith(".so")}
    for source in native_sources():
        stem = str(source.relative_to(ROOT).with_suffix(""))
        assert any(n.startswith(stem + ".") for n in compiled), (stem, compiled)

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    sh(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=tmp_path,
    )
    site = Path(
        sh(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    project = tmp_path / "project"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.pop("PYTHONPATH", None)
    env.pop("PYTEST_ADDOPTS", None)  # the outer run's options (e.g. --basetemp) are not the user's
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    assert sh("dueflow", "--version", cwd=project, env=env).startswith("dueflow 0.2.0 ")
    where = sh(
        python,
        "-c",
        "import dueflow, dueflow.consumers, dueflow.schemas;"
        "from importlib.resources import files;"
        "from dueflow.broker.local import kafka_version;"
        "from dueflow.records import codec;"
        "print(dueflow.__file__); print(dueflow.consumers.__file__);"
        "print(sorted(p.name for p in files('dueflow.schemas').joinpath('v1').iterdir()));"
        "print(kafka_version()); print(codec.schema_json('outcome', 1)['name']);"
        "import dueflow.records.worker_decoder as d; print(d.__file__)",
        cwd=project,
        env=env,
    ).splitlines()
    assert where[0].startswith(str(site))  # the wheel's dueflow, not the checkout's
    assert where[1].startswith(str(site))
    assert "job.avsc" in where[2]
    assert where[3].startswith("4.")  # the broker version, from the packaged pom
    assert where[4] == "Outcome"
    assert where[5].startswith(str(site))
    assert where[5].endswith(".so")  # the compiled decoder, and its runtime library found

    files, _steps = quickstart()
    for name, text in files.items():
        (project / name).write_text(text)
    sh(
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "test_tasks.py",
        cwd=project,
        env=env,
    )
    refused = "127.0.0.1:1"
    args = ["schedule", "hello", "--payload", '{"name": "Ada"}', "--app", "tasks"]
    done = subprocess.run(
        ["dueflow", *args, "--bootstrap", refused],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr  # the app imported from ./tasks.py; no cluster
    args[1] = "helo"
    done = subprocess.run(
        ["dueflow", *args, "--bootstrap", refused],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "did you mean 'hello'?" in done.stderr
