"""What the operator console's API reads and does through the status view
(:class:`~dueflow.streams.status.console_api.ConsoleSource`): job searches, dead
letters, the Watch tab, and the actions of the view's operator tools."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dueflow.config import Settings
from dueflow.errors import DueflowError
from dueflow.kafka.cluster_view import ClusterView
from dueflow.observability.logs import event
from dueflow.streams.status.job_finder import JobFinder
from dueflow.streams.status.job_search import Cursor, JobFilter, JobPage
from dueflow.streams.status.job_store import JobStore
from dueflow.streams.status.operator_tools import ConsoleOperations, OperatorTools
from dueflow.streams.status.queue_watch import QueueWatch, next_runs

log = logging.getLogger("dueflow.status")

SCHEDULES_REFRESH_S = 10.0  # the console's cron schedules are read this often at most


class StatusConsole:
    """The console's side of one status view: ``store`` and ``cluster`` read the
    view's job store and cluster view now, ``served_port`` the port its HTTP server
    listens on (None until it serves); ``tools`` None: the console takes no actions."""

    def __init__(
        self,
        settings: Settings,
        *,
        tools: OperatorTools | None,
        token: str,
        clock: Callable[[], int],
        watch: QueueWatch,
        store: Callable[[], JobStore],
        cluster: Callable[[], ClusterView | None],
        served_port: Callable[[], int | None],
    ) -> None:
        self.settings = settings
        self.tools = tools
        self._token = token
        self._clock = clock
        self.watch = watch
        self._store = store
        self._cluster = cluster
        self._served_port = served_port
        self._finder: JobFinder | None = None  # the console's searches, made on first use
        self._operations: ConsoleOperations | None = None  # its actions, made on first use
        self._schedules: tuple[float, list[dict[str, Any]]] | None = None

    async def find_jobs(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        """A page of the jobs ``flt`` finds, newest first (:mod:`.job_finder`)."""
        if self._finder is None:
            self._finder = JobFinder(self._store)
        return await self._finder.find(flt, before=before, limit=limit)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self._store().view(job_id)

    def queue_names(self) -> list[str]:
        return self.settings.queue_names

    def operations(self) -> ConsoleOperations | None:
        """The console's actions (:mod:`.operator_tools`), once the view serves."""
        port = self._served_port()
        if self._operations is None and port is not None and self.tools is not None:
            obs = self.settings.observability
            host = "127.0.0.1" if obs.status_bind in ("0.0.0.0", "", "::") else obs.status_bind
            host = f"[{host}]" if ":" in host else host
            # The view's own address, as status_base_url makes it (https with TLS: the
            # Scheduler then trusts exactly this view's certificate, ViewClient).
            own = replace(obs, status_url=None, status_bind=host, status_port=port)
            self._operations = self.tools.operations(
                replace(self.settings, observability=own), token=self._token
            )
        return self._operations

    async def watch_doc(self) -> dict[str, Any]:
        """The console's Watch tab: the last hour per queue with lag and DLQ depth,
        the emitter's leadership, the cron schedules with their next three runs."""
        now = self._clock()
        queues = self.watch.snapshot(now_ms=now, queues=self.queue_names())
        cluster = self._cluster()
        for q, row in queues.items():
            row["lag"] = None if cluster is None else cluster.lag_by_queue.get(q)
            row["dlq_depth"] = None if cluster is None else cluster.dlq_depth.get(q)
        emitter = None
        if cluster is not None:
            holder = cluster.active_emitter
            emitter = {
                "leader": None if holder is None else holder.client_id,
                "members": cluster.emitter_members,
                "group_state": cluster.emitter_group_state,
                "leaders_seen": list(self.watch.leaders),
            }
        return {
            "queues": queues,
            "emitter": emitter,
            "schedules": await self._cron_schedules(now),
            "window_min": 60,
            "updated_ms": now,
        }

    async def _cron_schedules(self, now_ms: int) -> list[dict[str, Any]] | None:
        """The cron schedules with their next runs (read every 10 s at most)."""
        cached = self._schedules
        if cached is not None and time.monotonic() - cached[0] < SCHEDULES_REFRESH_S:
            return cached[1]
        ops = self.operations()
        if ops is None:
            return None
        try:
            found = await asyncio.to_thread(ops.list_schedules)
        except DueflowError as exc:
            event(log, "console.schedules_read_failed", logging.WARNING, error=str(exc))
            return None if cached is None else cached[1]
        rows = [
            {
                "schedule_id": c.schedule_id,
                "cron": c.cron,
                "timezone": c.timezone,
                "queue": c.queue,
                "task": c.task,
                "paused": c.paused,
                "next_runs": [] if c.paused else next_runs(c, now_ms=now_ms),
            }
            for c in found
        ]
        self._schedules = (time.monotonic(), rows)
        return rows

    def payloads_for(self) -> str:
        """Which role may read payloads (``observability.status_payloads``)."""
        return self.settings.observability.status_payloads

    def trace_url(self, trace_id: str) -> str | None:
        """The tracing UI's page of ``trace_id`` (``observability.status_trace_url``)."""
        template = self.settings.observability.status_trace_url
        if template is None or not trace_id.isalnum():
            return None
        return template.replace("{trace_id}", trace_id)

    async def dead_letter(self, view: dict[str, Any]) -> dict[str, Any] | None:
        """The newest DLQ record of the job ``view`` shows, read from its queue's DLQ
        from a little before the job last changed (on a thread; None without tools)."""
        if self.tools is None:
            return None
        return await asyncio.to_thread(self.tools.find_dead_letter, self.settings, view)

    def close(self) -> None:
        if self._finder is not None:
            self._finder.close()
        if self._operations is not None:
            self._operations.close()
