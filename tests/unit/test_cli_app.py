"""``--app`` as a user gives it: from the project's folder, a misspelled task, an app
that does not import. Run through the installed ``dueflow`` script, whose own
``sys.path`` starts at its bin directory (not the working directory), against a
cluster that refuses every connection: each answer must come before connecting
(exit 2), or the command gets as far as the cluster (exit 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DUEFLOW = str(Path(sys.executable).parent / "dueflow")
UNREACHABLE = "127.0.0.1:1"

TASKS = """
from dueflow import task


@task("send-invoice")
def send_invoice(payload, ctx):
    print("invoice", payload)


@task("send-reminder")
def send_reminder(payload, ctx):
    print("reminder", payload)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder with its handlers in ``shop/tasks.py`` (not installed)."""
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(TASKS)
    (tmp_path / "shop" / "broken.py").write_text("import a_module_nobody_installed\n")
    return tmp_path


def dueflow(cwd: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [DUEFLOW, *args, "--bootstrap", UNREACHABLE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_app_modules_are_imported_from_the_working_directory(project: Path) -> None:
    done = dueflow(project, "schedule", "send-invoice", "--app", "shop.tasks")
    assert "No module named" not in done.stderr
    assert done.returncode == 3, done.stderr  # the app imported; then the cluster refused
    assert "cannot reach the Kafka cluster" in done.stderr


def test_a_task_the_app_does_not_declare_is_refused_with_a_suggestion(project: Path) -> None:
    done = dueflow(project, "schedule", "send-invoce", "--app", "shop.tasks")
    assert done.returncode == 2, done.stderr  # refused before connecting: nothing written
    assert "task: got 'send-invoce'" in done.stderr
    assert "did you mean 'send-invoice'?" in done.stderr


def test_without_an_app_the_name_is_not_checked_against_one(project: Path) -> None:
    done = dueflow(project, "schedule", "send-invoce")
    assert done.returncode == 3, done.stderr


def test_a_worker_whose_app_does_not_import_fails_at_once_with_the_import_error(
    project: Path,
) -> None:
    t0 = time.monotonic()
    done = dueflow(project, "worker", "--app", "shop.broken", "--connect-timeout", "60", timeout=50)
    elapsed = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    assert "app: got 'shop.broken'" in done.stderr
    assert "No module named 'a_module_nobody_installed'" in done.stderr
    assert elapsed < 20  # not after waiting for the cluster (--connect-timeout 60)
    assert "does not answer" not in done.stderr
