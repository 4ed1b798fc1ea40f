"""docs/workers.md's "Results and progress" shows the files that run as tests here."""

from __future__ import annotations

from tests.support.readme import as_in_readme, readme_files, unit_file

SECTION = "Results and progress"
PAGE = "docs/workers.md"


def test_the_docs_show_the_handler_module() -> None:
    assert readme_files(SECTION, PAGE)["myapp/reports.py"] == unit_file("docs_reports.py")


def test_the_docs_show_the_test_that_runs_here() -> None:
    here = as_in_readme("test_docs_reports.py", "docs_reports")
    assert readme_files(SECTION, PAGE)["tests/test_reports.py"] == here
