"""The README's "Chaining jobs from a handler" shows the files that run as tests here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _blocks() -> dict[str, list[str]]:
    section = (ROOT / "README.md").read_text().split("## Chaining jobs from a handler", 1)[1]
    section = section.split("\n## ", 1)[0]
    out = {}
    for chunk in section.split("```python\n")[1:]:
        lines = chunk.split("\n```", 1)[0].splitlines()
        if lines and lines[0].startswith("# ") and lines[0].endswith(".py"):
            out[lines[0][2:]] = lines[1:]
    return out


def _file(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    assert lines[0].startswith("# The README's")
    return lines[1:]


def test_the_readme_shows_the_handler_module() -> None:
    assert _blocks()["myapp/orders.py"] == _file("readme_orders.py")


def test_the_readme_shows_the_test_that_runs_here() -> None:
    here = [
        "from myapp import orders"
        if line.startswith("from tests.unit import readme_orders")
        else line
        for line in _file("test_readme_orders.py")
    ]
    assert _blocks()["tests/test_orders.py"] == here
