"""What the status view asks of the operator tools (the ops commands' code: the
dead-letter redrive and purge, the SDK's cancel and reschedule), as Protocols.

The view is a component and the tools are an application (``dueflow/apps/ops``):
the application that runs the view hands it an :class:`OperatorTools`
(``dueflow status-view`` gives :class:`dueflow.apps.ops.console_actions.ConsoleTools`),
so the view imports none of them. A view given none takes no actions: its redrive
button and console actions answer 501.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dueflow.config import Settings
from dueflow.rules.cron_schedule import CronSchedule


class ConsoleOperations(Protocol):
    """The console's actions over one view's settings (blocking: the HTTP layer runs
    each on a thread). Each answers a JSON document with ``done`` and ``message``."""

    def pending_payload(self, view: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def cancel(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]: ...

    def reschedule(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]: ...

    def run_now(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]: ...

    def retry(
        self, job_id: str, body: Mapping[str, Any], by: str, queue: str
    ) -> dict[str, Any]: ...

    def redrive(self, queue: str, body: Mapping[str, Any], by: str) -> dict[str, Any]: ...

    def purge(self, queue: str, body: Mapping[str, Any], by: str) -> dict[str, Any]: ...

    def pause_queue(
        self, queue: str, body: Mapping[str, Any], by: str, paused: bool
    ) -> dict[str, Any]: ...

    def pause_schedule(
        self, schedule_id: str, body: Mapping[str, Any], by: str, paused: bool
    ) -> dict[str, Any]: ...

    def list_schedules(self) -> list[CronSchedule]: ...

    def close(self) -> None: ...


class OperatorTools(Protocol):
    """The operator tools the status view uses."""

    def operations(self, settings: Settings, *, token: str) -> ConsoleOperations:
        """The console's actions over ``settings`` (whose status view is this one),
        calling with ``token``."""
        ...

    def find_dead_letter(
        self, settings: Settings, view: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """The details of the newest DLQ record of the job ``view`` shows."""
        ...

    def redrive(self, settings: Settings, queue: str, limit: int, by: str) -> dict[str, Any]:
        """The redrive button: at most ``limit`` dead letters of ``queue``, oldest
        first, at a bounded rate, idempotent."""
        ...
