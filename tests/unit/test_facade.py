"""The public names of ``import dueflow`` resolve lazily to the real objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dueflow
from dueflow.consumers import task
from dueflow.producers import Scheduler


def test_public_names_resolve() -> None:
    assert dueflow.Scheduler is Scheduler
    assert dueflow.task is task
    for name in dueflow.__all__:
        assert getattr(dueflow, name) is not None


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = dueflow.nope  # type: ignore[attr-defined]


def test_import_dueflow_is_cheap_and_side_effect_free() -> None:
    code = "import sys, dueflow; print(sorted(m for m in sys.modules if 'kafka' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["dueflow", "dueflow.testing"])
def test_type_checkers_see_every_public_name(package: str) -> None:
    """The lazy names are imported under TYPE_CHECKING too (``from dueflow import task``
    is typed for mypy --strict users)."""
    import ast
    import importlib
    from pathlib import Path

    module = importlib.import_module(package)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    seen = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert seen == set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_mypy_sees_the_real_classes_not_any(tmp_path: Path) -> None:
    """Through the lazy facade a user's mypy sees the real classes and functions,
    and a name the package does not export is an error, not ``Any``."""
    from mypy import api

    use = tmp_path / "use.py"
    use.write_text(
        "import dueflow\n"
        "import dueflow.testing\n"
        "def f(s: dueflow.Scheduler, r: dueflow.JobRequest,"
        " p: dueflow.testing.InMemoryPipeline) -> None:\n"
        "    reveal_type(s)\n"
        "    reveal_type(r)\n"
        "    reveal_type(p)\n"
        "reveal_type(dueflow.task)\n"
        "dueflow.Schedulr\n"
    )
    out, err, _status = api.run(
        ["--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"), str(use)]
    )
    lines = out.splitlines()
    assert f'{use}:4: note: Revealed type is "dueflow.producers.scheduler.Scheduler"' in lines
    assert f'{use}:5: note: Revealed type is "dueflow.records.job_request.JobRequest"' in lines
    assert f'{use}:6: note: Revealed type is "dueflow.testing.pipeline.InMemoryPipeline"' in lines
    assert any(
        line.startswith(f"{use}:7: note: Revealed type is") and "Overload(" in line
        for line in lines
    ), out
    assert any(
        line.startswith(f"{use}:8: error:") and 'no attribute "Schedulr"' in line for line in lines
    ), out
    assert err == ""


def test_the_lazy_names_match_all() -> None:
    assert sorted(dueflow._EXPORTS) == sorted(dueflow.__all__)
    assert dueflow.__all__ == sorted(dueflow.__all__)
