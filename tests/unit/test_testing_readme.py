"""docs/testing.md ("Testing your handlers") shows the files that run as tests here."""

from __future__ import annotations

from tests.support.readme import ROOT, as_in_readme, readme_files, unit_file

SECTION = "Testing your handlers"
PAGE = "docs/testing.md"


def test_the_docs_show_the_handler_module() -> None:
    assert readme_files(SECTION, PAGE)["myapp/billing.py"] == unit_file("readme_billing.py")


def test_the_docs_show_the_test_that_runs_here() -> None:
    here = as_in_readme("test_readme_billing.py", "readme_billing")
    assert readme_files(SECTION, PAGE)["tests/test_billing.py"] == here


def test_the_docs_enable_the_plugin_as_this_project_does() -> None:
    readme = (ROOT / PAGE).read_text()
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    line = 'pytest_plugins = ["dueflow.testing.pytest_plugin"]'
    assert line in readme
    assert line in conftest
