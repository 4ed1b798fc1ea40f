"""Gates that must not silently turn into no-ops.

``make promtool`` fails loudly when it cannot install or run promtool (it hid
the download's output and its exit status, and the alert-rule test then
skipped), and no test skips for want of a tool ``make test`` installs. The
Makefile runs here against a temporary virtualenv dir with a stub ``apt-get``
first on PATH: no network, the project's ``.venv`` is not touched.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Skips that may stay: `docker compose` is not something `make test` installs.
ALLOWED_SKIPS = {"tests/unit/test_compose_file.py"}


def _make_promtool(tmp: Path, apt_get: str) -> subprocess.CompletedProcess[str]:
    """``make promtool`` with ``VENV=<tmp>/venv`` and ``apt-get`` replaced by a script."""
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed: the Makefile's gates cannot run")
    venv, stub = tmp / "venv", tmp / "stub"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    stub.mkdir()
    (stub / "apt-get").write_text("#!/bin/sh\n" + apt_get)
    (stub / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    stamp = venv / ".installed"  # -o: never remade (no pip install into the temp dir)
    return subprocess.run(
        [make, "-s", "-C", str(ROOT), "-o", str(stamp), "promtool", f"VENV={venv}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_promtool_target_fails_loudly_when_the_package_cannot_be_downloaded(
    tmp_path: Path,
) -> None:
    res = _make_promtool(tmp_path, 'echo "E: Unable to locate package prometheus" >&2\nexit 100\n')
    assert res.returncode != 0, res.stdout + res.stderr
    assert "E: Unable to locate package prometheus" in res.stderr  # apt's own words, shown
    assert "'apt-get download prometheus' failed" in res.stderr
    assert "apt-get update" in res.stderr
    assert not (tmp_path / "venv" / "bin" / "promtool").exists()


def test_promtool_target_fails_when_promtool_does_not_run(tmp_path: Path) -> None:
    broken = tmp_path / "venv" / "bin" / "promtool"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\necho 'exec format error' >&2\nexit 126\n")
    broken.chmod(0o755)
    res = _make_promtool(tmp_path, "exit 1\n")
    assert res.returncode != 0, res.stdout + res.stderr
    assert "does not run" in res.stderr
    assert "exec format error" in res.stderr


def test_promtool_target_takes_promtool_out_of_the_package(tmp_path: Path) -> None:
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        pytest.fail("dpkg-deb is not installed: `make promtool` needs it (Debian's dpkg)")
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: prometheus\nVersion: 0.0-test\nArchitecture: all\n"
        "Maintainer: tests <t@example.invalid>\nDescription: stub\n"
    )
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "usr" / "bin" / "promtool").write_text("#!/bin/sh\necho 'promtool, version 0.0-test'\n")
    (pkg / "usr" / "bin" / "promtool").chmod(0o755)
    deb = tmp_path / "prometheus_0.0-test_all.deb"
    subprocess.run([dpkg_deb, "--build", str(pkg), str(deb)], check=True, capture_output=True)
    # `apt-get download prometheus` writes the package into the current directory.
    stub = f'case " $* " in *" download "*" prometheus "*) cp "{deb}" . ;; *) exit 1 ;; esac\n'
    res = _make_promtool(tmp_path, stub)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "promtool, version 0.0-test"
    assert os.access(tmp_path / "venv" / "bin" / "promtool", os.X_OK)


def _skips(path: Path) -> list[int]:
    """Lines of ``path`` that skip a test: ``pytest.skip(...)``, ``importorskip``, and the
    ``skip``/``skipif``/``xfail`` marks."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in (
            "skip",
            "skipif",
            "importorskip",
            "xfail",
        ):
            lines.append(node.lineno)
    return lines


def test_no_test_skips_for_want_of_a_tool_make_test_installs() -> None:
    found = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if (lines := _skips(p))
    }
    assert set(found) == ALLOWED_SKIPS, found
