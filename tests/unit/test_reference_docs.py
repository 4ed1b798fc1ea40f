"""The generated reference pages (configuration, command line) are what the code says:
a setting or a flag changed without `python -m tools.reference_docs` fails here."""

from __future__ import annotations

import dataclasses

import pytest

from dueflow import config
from dueflow.apps.cli.main import build_parser
from tools import reference_docs


def test_the_committed_reference_pages_are_up_to_date() -> None:
    stale = [str(p.relative_to(reference_docs.ROOT)) for p in reference_docs.stale()]
    assert stale == [], f"stale: {stale}; run `python -m tools.reference_docs`"


@pytest.mark.parametrize(
    "cls",
    [
        config.Settings,
        config.QueueSpec,
        config.EmitterSettings,
        config.WorkerSettings,
        config.ObservabilitySettings,
        config.ProducerSettings,
    ],
)
def test_every_setting_is_in_the_configuration_reference(cls: type) -> None:
    page = reference_docs.CONFIGURATION.read_text()
    for f in dataclasses.fields(cls):
        forms = (f"`{f.name}`", f".{f.name}`", f"`[{f.name}]`")
        assert any(form in page for form in forms), f"{cls.__name__}.{f.name}"


def test_every_command_is_in_the_cli_reference() -> None:
    page = reference_docs.CLI.read_text()
    for path, _parser, _help in reference_docs.commands(build_parser()):
        assert f"## dueflow {' '.join(path)}\n" in page


def test_a_setting_without_a_description_fails_the_generation() -> None:
    @dataclasses.dataclass(frozen=True)
    class Section:
        described: int = 1  # what it does
        bare: int = 2

    with pytest.raises(SystemExit, match=r"Section\.bare has no description"):
        list(reference_docs.settings_of(Section, "x"))
