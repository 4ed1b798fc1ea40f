"""The fixtures ``dueflow.testing`` tells users about are the plugin's."""

from __future__ import annotations

import re
from pathlib import Path

import dueflow.testing
from dueflow.testing import pytest_plugin


def plugin_fixtures() -> set[str]:
    source = Path(pytest_plugin.__file__).read_text()
    return set(re.findall(r"@pytest\.fixture\s*\ndef (\w+)", source))


def test_every_fixture_the_package_docstring_names_exists() -> None:
    doc = dueflow.testing.__doc__ or ""
    named = set(re.findall(r"``(dueflow\w*)``", doc))
    assert named, "the docstring names the fixtures"
    assert named <= plugin_fixtures(), named - plugin_fixtures()
    assert {"dueflow_pipeline", "dueflow_eager"} <= named
