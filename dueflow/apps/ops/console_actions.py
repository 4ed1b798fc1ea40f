"""What the status view's buttons do: the SDK's and the ops commands' own code (I/O
edge). :class:`ConsoleTools` is the view's
:class:`~dueflow.streams.status.operator_tools.OperatorTools` (``dueflow status-view``
hands it to the view).

Every action calls what the CLI calls, so there is one implementation:

=====================  ==============================================  =====================
action                 code                                            CLI
=====================  ==============================================  =====================
cancel                 ``Scheduler.cancel``                            ``dueflow cancel``
reschedule, run now    ``Scheduler.reschedule`` (run now: due now)     ``dueflow reschedule``
retry a dead job       ``Redriver.run`` of its DLQ record              ``dueflow dlq redrive``
redrive by filter      ``Redriver.run`` (``dry_run``: the preview)     ``dueflow dlq redrive``
purge dead letters     ``plan_purge`` then ``purge``                   ``dueflow dlq purge``
pause/resume a queue   ``write_queue_control``                         ``dueflow queue pause``
pause/resume a cron    ``Scheduler.pause_schedule``/``resume_schedule``  ``dueflow cron pause``
=====================  ==============================================  =====================

Each is blocking (the HTTP layer runs it on a thread) and safe to repeat: a
cancelled job is not cancelled again, a redriven record is not redriven
twice (:mod:`dueflow.apps.ops.redrive`), pausing a paused queue writes the
same state. The HTTP layer also answers a repeated request (same
``Idempotency-Key``, or same action, target and body from the same caller
within ``dueflow.streams.status.console_api.REPEAT_WINDOW_S``) with the first
answer, so a double click acts once.

The Scheduler asks this view itself for jobs (``status_url`` is the view's
own address), on its own thread.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from dueflow import headers as hdr
from dueflow.apps.ops.dlq import DlqFilter, read_dead_letters
from dueflow.apps.ops.purge import plan_purge, purge
from dueflow.apps.ops.redrive import Redriver
from dueflow.config import Settings
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.kafka.pausing import write_queue_control
from dueflow.kafka.reading import ops_consumer
from dueflow.producers.scheduler import Scheduler
from dueflow.producers.timer_finder import WantedTimer
from dueflow.records import codec
from dueflow.records.pause_command import QueueControl
from dueflow.rules.cron_schedule import CronSchedule
from dueflow.streams.status.job_search import parse_time_ms
from dueflow.wall_clock import wall_ms

REDRIVE_RATE = 50.0  # records per second of a console redrive (and the redrive button)
REDRIVE_MAX = 1000  # records one call redrives at most
DEAD_LETTER_SLACK_MS = 3_600_000  # read the DLQ from this long before the job's last change


def find_dead_letter(settings: Settings, view: Mapping[str, Any]) -> dict[str, Any] | None:
    """The details of the newest DLQ record of the job ``view`` shows (None: none)."""
    queue = str(view["queue"])
    since = view.get("finished_ms") or view.get("updated_ms")
    consumer = ops_consumer(settings)
    try:
        entries = read_dead_letters(
            settings,
            consumer,
            queue,
            where=DlqFilter(
                job_ids=frozenset({str(view["job_id"])}),
                since_ms=None if since is None else int(since) - DEAD_LETTER_SLACK_MS,
            ),
            timeout_s=30.0,
        )
    finally:
        consumer.close()
    if not entries:
        return None
    newest = max(entries, key=lambda e: (e.dead_ms, e.offset))
    return newest.details()


def redrive_filter(body: Mapping[str, Any]) -> DlqFilter:
    """A DLQ filter from a request body's ``filter`` (``task``, ``reason``,
    ``error_type``, ``job_id``: strings or lists; ``since``/``until``: epoch ms or
    ISO 8601)."""
    raw = body.get("filter") or {}
    if not isinstance(raw, Mapping):
        raise InvalidInput(
            "filter", raw, "an object of task, reason, error_type, job_id, since, until"
        )

    def values(name: str) -> frozenset[str]:
        v = raw.get(name)
        if v is None or v == "":
            return frozenset()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InvalidInput(f"filter.{name}", v, "a string or a list of strings")
        return frozenset(i for i in items if i)

    def instant(name: str) -> int | None:
        v = raw.get(name)
        if v is None or v == "":
            return None
        return parse_time_ms(f"filter.{name}", str(v))

    unknown = set(raw) - {"task", "reason", "error_type", "job_id", "since", "until"}
    if unknown:
        raise InvalidInput(
            "filter", sorted(unknown), "task, reason, error_type, job_id, since, until"
        )
    return DlqFilter(
        tasks=values("task"),
        reasons=values("reason"),
        error_types=values("error_type"),
        job_ids=values("job_id"),
        since_ms=instant("since"),
        until_ms=instant("until"),
    )


class Operations:
    """The console's actions over ``settings`` (a Scheduler made on first use, which
    asks the view at ``view_url``; None: ``settings``' ``status_base_url``)."""

    def __init__(self, settings: Settings, *, view_url: str | None, token: str) -> None:
        obs = dataclasses.replace(settings.observability, status_url=view_url, status_token=token)
        self.settings = dataclasses.replace(settings, observability=obs)
        self._scheduler: Scheduler | None = None
        self._lock = threading.Lock()

    def scheduler(self) -> Scheduler:
        with self._lock:
            if self._scheduler is None:
                self._scheduler = Scheduler(self.settings).start()
            return self._scheduler

    def list_schedules(self) -> list[CronSchedule]:
        """Every cron schedule of the cluster (the console's Watch tab)."""
        return self.scheduler().list_schedules()

    def close(self) -> None:
        with self._lock:
            if self._scheduler is not None:
                self._scheduler.close()
                self._scheduler = None

    # ------------------------------------------------------------------ jobs
    def pending_payload(self, view: Mapping[str, Any]) -> dict[str, Any] | None:
        """The payload of a job that has not finished, read from its timer record in
        the wheel (or its exec record once fired), as ``Scheduler.reschedule`` finds
        it; None when no record is found."""
        due = view.get("due_ms")
        if due is None:
            return None
        wanted = WantedTimer(
            job_id=str(view["job_id"]),
            key=str(view.get("idempotency_key") or view["job_id"]),
            queue=str(view["queue"]),
            due_ms=int(due),
        )
        found = self.scheduler().timers.find(wanted, now_ms=wall_ms())
        if found is None:
            return None
        schema = next((v for k, v in found.headers if k == hdr.SCHEMA), None)
        try:
            job = codec.decode_job_value(found.value, schema)
        except UndecodableRecord as exc:
            return {"payload": None, "problem": str(exc), "record": found.topic}
        return {
            "payload": job.get("payload"),
            "content_type": job.get("content_type"),
            "record": f"{found.topic}:{found.partition}:{found.offset}",
        }

    def cancel(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]:
        result = self.scheduler().cancel(job_id)
        return {"done": bool(result.cancelled), "message": result.message, **result.to_json()}

    def reschedule(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]:
        raw = body.get("run_at")
        if raw is None or raw == "":
            raise InvalidInput("run_at", raw, "epoch milliseconds or ISO 8601 with an offset")
        due = parse_time_ms("run_at", str(raw))
        result = self.scheduler().reschedule(job_id, delay=max(0.0, (due - wall_ms()) / 1000))
        return {"done": bool(result.rescheduled), "message": result.message, **result.to_json()}

    def run_now(self, job_id: str, body: Mapping[str, Any], by: str) -> dict[str, Any]:
        result = self.scheduler().reschedule(job_id, delay=0)
        return {"done": bool(result.rescheduled), "message": result.message, **result.to_json()}

    def retry(self, job_id: str, body: Mapping[str, Any], by: str, queue: str) -> dict[str, Any]:
        """Redrive the dead job's DLQ record(s) (the newest is the one redriven)."""
        report = Redriver(self.settings, by=by, rate_per_s=REDRIVE_RATE).run(
            queue, DlqFilter(job_ids=frozenset({job_id})), limit=1
        )
        out = report.to_json()
        out["done"] = report.redriven > 0
        out["message"] = (
            "redriven: the job runs again"
            if report.redriven
            else "; ".join(i.why for i in report.items) or "no dead letter of this job"
        )
        return out

    # ------------------------------------------------------------------- DLQ
    def redrive(self, queue: str, body: Mapping[str, Any], by: str) -> dict[str, Any]:
        """Redrive what ``body["filter"]`` selects; ``body["dry_run"]``: only count."""
        where = redrive_filter(body)
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidInput("dry_run", dry_run, "true or false")
        limit = body.get("limit", REDRIVE_MAX)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= REDRIVE_MAX:
            raise InvalidInput("limit", limit, f"an integer from 1 to {REDRIVE_MAX}")
        report = Redriver(self.settings, by=by, rate_per_s=REDRIVE_RATE).run(
            queue, where, dry_run=dry_run, limit=limit
        )
        out = report.to_json()
        out["items"] = out["items"][:50]
        out["done"] = dry_run or report.redriven > 0
        out["message"] = (
            f"{report.would_redrive} would be redriven, {len(report.items) - report.would_redrive}"
            " not"
            if dry_run
            else f"{report.redriven} redriven, {report.skipped} not redriven"
        )
        return out

    def purge(self, queue: str, body: Mapping[str, Any], by: str) -> dict[str, Any]:
        """Delete ``queue``'s dead letters written before ``body["before"]`` (or
        ``body["all"]``); ``body["dry_run"]``: only count. Kafka deletes a prefix of
        each partition, so a purge is by time, never by filter."""
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidInput("dry_run", dry_run, "true or false")
        everything = body.get("all", False) is True
        raw = body.get("before")
        before = None if raw in (None, "") else parse_time_ms("before", str(raw))
        if before is None and not everything:
            raise InvalidInput("before", raw, "a time (epoch ms or ISO 8601), or all: true")
        consumer = ops_consumer(self.settings)
        try:
            cuts = plan_purge(
                self.settings, consumer, queue, before_ms=before, everything=everything
            )
        finally:
            consumer.close()
        total = sum(c.records for c in cuts)
        if not dry_run:
            purge(self.settings, queue, cuts)
        return {
            "done": dry_run or bool(cuts),
            "dry_run": dry_run,
            "records": total,
            "partitions": [
                {"partition": c.partition, "from": c.low, "before": c.before} for c in cuts
            ],
            "message": (
                f"{total} dead letters would be deleted"
                if dry_run
                else f"{total} dead letters of {queue} deleted"
            ),
        }

    # ---------------------------------------------------------------- queues
    def pause_queue(
        self, queue: str, body: Mapping[str, Any], by: str, paused: bool
    ) -> dict[str, Any]:
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise InvalidInput("reason", reason, "a string")
        control = QueueControl(queue, paused=paused, by=by, at_ms=wall_ms(), reason=reason or "")
        write_queue_control(self.settings, control)
        state = "paused" if paused else "resumed"
        return {"done": True, "message": f"queue {queue} {state}", **control.to_json()}

    # ------------------------------------------------------------- schedules
    def pause_schedule(
        self, schedule_id: str, body: Mapping[str, Any], by: str, paused: bool
    ) -> dict[str, Any]:
        sched = self.scheduler()
        found = sched.get_schedule(schedule_id)
        if found is None:
            raise InvalidInput("schedule", schedule_id, "the id of an existing cron schedule")
        s = sched.pause_schedule(schedule_id) if paused else sched.resume_schedule(schedule_id)
        state = "paused" if paused else "resumed"
        return {"done": True, "message": f"schedule {schedule_id} {state}", "paused": s.paused}


def redrive_oldest(settings: Settings, queue: str, limit: int, by: str) -> dict[str, Any]:
    """The redrive button: at most ``limit`` dead letters of ``queue``, oldest first,
    at a bounded rate, idempotent (blocking; the HTTP layer runs it on a thread)."""
    report = Redriver(settings, by=by, rate_per_s=REDRIVE_RATE).run(queue, limit=limit)
    out = report.to_json()
    out["items"] = out["items"][:50]
    out["message"] = f"{report.redriven} redriven, {report.skipped} not redriven"
    if report.error:
        out["message"] += f"; stopped early: {report.error}"
    return out


class ConsoleTools:
    """The operator tools of the status view
    (:class:`~dueflow.streams.status.operator_tools.OperatorTools`)."""

    def operations(self, settings: Settings, *, token: str) -> Operations:
        return Operations(settings, view_url=None, token=token)

    def find_dead_letter(
        self, settings: Settings, view: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return find_dead_letter(settings, view)

    def redrive(self, settings: Settings, queue: str, limit: int, by: str) -> dict[str, Any]:
        return redrive_oldest(settings, queue, limit, by)
