"""The status view acts only through the operator tools it is handed
(:mod:`dueflow.streams.status.operator_tools`): the console's operations are made by
them for the view's own address and token, dead letters are read by them, and a
view handed none takes no actions. ``dueflow status-view`` hands it ConsoleTools."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from dueflow.apps.ops.console_actions import ConsoleTools, Operations
from dueflow.config import ObservabilitySettings, Settings
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.app import StatusView
from dueflow.streams.status.console_source import StatusConsole
from dueflow.streams.status.job_store import JobStore
from dueflow.streams.status.operator_tools import ConsoleOperations, OperatorTools
from dueflow.streams.status.queue_watch import QueueWatch

TOKEN = "the-operator-token-0123456789"


class FakeOperations:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeTools:
    def __init__(self) -> None:
        self.made: list[tuple[Settings, str]] = []
        self.read: list[Mapping[str, Any]] = []
        self.ops = FakeOperations()

    def operations(self, settings: Settings, *, token: str) -> ConsoleOperations:
        self.made.append((settings, token))
        return cast(ConsoleOperations, self.ops)

    def find_dead_letter(
        self, settings: Settings, view: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        self.read.append(view)
        return {"job_id": view["job_id"]}

    def redrive(self, settings: Settings, queue: str, limit: int, by: str) -> dict[str, Any]:
        raise AssertionError("not called here")


def _console(tools: OperatorTools | None, port: int | None, bind: str = "0.0.0.0") -> StatusConsole:
    settings = Settings(observability=ObservabilitySettings(status_bind=bind, status_port=1))
    return StatusConsole(
        settings,
        tools=tools,
        token=TOKEN,
        clock=lambda: 0,
        watch=QueueWatch(),
        store=lambda: cast(JobStore, None),
        cluster=lambda: None,
        served_port=lambda: port,
    )


def test_the_console_s_operations_are_the_tools_own_for_the_view_s_address() -> None:
    tools = FakeTools()
    console = _console(tools, port=None)
    assert console.operations() is None, "not before the view serves"
    assert tools.made == []
    console = _console(tools, port=6123)
    made = cast(object, console.operations())
    assert made is tools.ops
    assert cast(object, console.operations()) is made, "made once"
    ((settings, token),) = tools.made
    assert token == TOKEN
    assert settings.observability.status_base_url == "http://127.0.0.1:6123"
    console.close()
    assert tools.ops.closed


def test_the_console_s_dead_letters_are_read_by_the_tools() -> None:
    tools = FakeTools()
    got = asyncio.run(_console(tools, port=None).dead_letter({"job_id": "j1", "queue": "q"}))
    assert got == {"job_id": "j1"}
    assert [v["job_id"] for v in tools.read] == ["j1"]


def test_a_view_without_tools_takes_no_actions() -> None:
    console = _console(None, port=6123)
    assert console.operations() is None
    assert asyncio.run(console.dead_letter({"job_id": "j1", "queue": "q"})) is None
    view = StatusView(Settings(), metrics=Metrics())
    assert view.tools is None
    assert view.console.operations() is None


def test_the_cli_s_tools_make_the_ops_commands_operations() -> None:
    tools: OperatorTools = ConsoleTools()
    ops = tools.operations(Settings(), token=TOKEN)
    assert isinstance(ops, Operations)
    assert ops.settings.observability.status_token == TOKEN
    assert ops.settings.observability.status_url is None
