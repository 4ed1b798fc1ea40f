"""The operator commands' command lines: the examples of docs/operations.md parse, bad input
is refused before anything connects."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dueflow.apps.cli.main import build_parser, main

OPS_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _examples(text: str) -> list[str]:
    """Every ``dueflow ...`` line of the fenced blocks (comments stripped)."""
    out = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        stripped = line.split("#", 1)[0].strip() if "# " in line else line.strip()
        if inside and stripped.startswith("dueflow "):
            out.append(stripped)
    return out


def _operations_examples() -> list[str]:
    return _examples(OPS_DOC.read_text())


def test_the_documented_examples_exist() -> None:
    commands = {shlex.split(e)[1] for e in _operations_examples()}
    assert {"replay", "dlq", "queue", "cancel"} <= commands


@pytest.mark.parametrize("line", _operations_examples())
def test_every_documented_example_parses(line: str) -> None:
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert callable(args.func)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cancel"], "JOB_ID or --schedule"),
        (["cancel", "job-1", "--schedule", "s"], "JOB_ID or --schedule"),
        (["cancel", "job-1", "--delete"], "only with --schedule"),
        (["dlq", "redrive", "--queue", "default"], "a filter"),
        (["dlq", "list", "--reason", "bored"], "bored"),
        (["dlq", "list", "--since", "yesterday"], "since"),
        (["dlq", "show", "3-1"], "PARTITION:OFFSET"),
        (["replay", "--topic", "t", "--from", "whenever"], "from"),
        # (Whether a queue exists is known after reading the queue registry, so an
        # unknown one is refused once connected: tests/integration/test_queue_registry.py.)
    ],
)
def test_bad_input_exits_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # An unreachable bootstrap: the check must come before any connection.
    assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 2
    assert message in capsys.readouterr().err
