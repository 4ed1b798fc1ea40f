"""docs/handlers.md ("Chaining jobs from a handler") shows the files that run as tests
here."""

from __future__ import annotations

from tests.support.readme import as_in_readme, readme_files, unit_file

SECTION = "Chaining jobs from a handler"
PAGE = "docs/handlers.md"


def test_the_docs_show_the_handler_module() -> None:
    assert readme_files(SECTION, PAGE)["myapp/orders.py"] == unit_file("readme_orders.py")


def test_the_docs_show_the_test_that_runs_here() -> None:
    here = as_in_readme("test_readme_orders.py", "readme_orders")
    assert readme_files(SECTION, PAGE)["tests/test_orders.py"] == here
