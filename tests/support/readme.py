"""The docs' example files that also run as tests: a ``python`` block whose first
line is ``# <path>.py`` in a section of a docs page, and the copy of it in
tests/unit whose first line says where it is shown ("# The README's ..." or
"# docs/<page>'s ...")."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"


def readme_files(section: str, page: str = "README.md") -> dict[str, list[str]]:
    """The named python blocks of ``## section`` of ``page`` (a path from the
    repository's root): path -> lines."""
    text = (ROOT / page).read_text().split(f"# {section}\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    out = {}
    for chunk in text.split("```python\n")[1:]:
        lines = chunk.split("\n```", 1)[0].splitlines()
        if lines and lines[0].startswith("# ") and lines[0].endswith(".py"):
            out[lines[0][2:]] = lines[1:]
    return out


def unit_file(name: str) -> list[str]:
    """The lines of ``tests/unit/<name>`` after its "# The README's ..." or
    "# docs/<page>'s ..." line."""
    lines = (UNIT / name).read_text().splitlines()
    assert lines[0].startswith(("# The README's", "# docs/")), name
    return lines[1:]


def as_in_readme(name: str, module: str, package: str = "myapp") -> list[str]:
    """:func:`unit_file` with its import of ``tests.unit.<module>`` written as the
    README's ``from <package> import <readme name>``."""
    short = module.removeprefix("readme_").removeprefix("docs_")
    return [
        f"from {package} import {short}"
        if line.startswith(f"from tests.unit import {module}")
        else line
        for line in unit_file(name)
    ]
