"""``dueflow broker``: what each action takes (no broker is started here)."""

from __future__ import annotations

import argparse

import pytest

from dueflow.apps.cli import broker_cmd
from dueflow.apps.cli.main import build_parser, main


def action(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (top,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    broker = top.choices["broker"]
    (sub,) = [a for a in broker._actions if isinstance(a, argparse._SubParsersAction)]
    chosen: argparse.ArgumentParser = sub.choices[name]
    return chosen


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def test_fetch_offers_only_what_it_uses() -> None:
    assert options(action("fetch")) == {"-h", "--help", "--cache", "--json"}
    assert "Maven" in (action("fetch").description or "")


@pytest.mark.parametrize("name", ["start", "stop", "status", "env"])
def test_the_broker_actions_name_their_state(name: str) -> None:
    assert {"--port", "--dir", "--nodes", "--security"} <= options(action(name))


def test_the_port_defaults_to_dueflow_broker_port(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []

    def env(args: argparse.Namespace) -> int:
        seen.append(args.port)
        return 0

    monkeypatch.setattr(broker_cmd, "_env", env)
    monkeypatch.setenv("DUEFLOW_BROKER_PORT", "19555")
    assert main(["broker", "env"]) == 0
    assert main(["broker", "env", "--port", "9300"]) == 0
    monkeypatch.delenv("DUEFLOW_BROKER_PORT")
    assert main(["broker", "env"]) == 0
    assert seen == [19555, 9300, 9092]
    monkeypatch.setenv("DUEFLOW_BROKER_PORT", "nine")
    assert main(["broker", "env"]) == 2
    assert "DUEFLOW_BROKER_PORT: got 'nine'" in capsys.readouterr().err
