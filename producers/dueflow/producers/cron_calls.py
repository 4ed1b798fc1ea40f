"""Cron schedules from the scheduling client: :class:`CronCalls` (the schedules
topic itself: :mod:`dueflow.producers.schedule_client`)."""

from __future__ import annotations

from typing import Unpack

from dueflow.producers.call_options import CronChanges, CronDefinition
from dueflow.producers.scheduler_base import SchedulerBase
from dueflow.rules.cron import CronSchedule


class CronCalls(SchedulerBase):
    """Add, change, pause, delete and list cron schedules (part of :class:`~dueflow.Scheduler`)."""

    def add_schedule(self, schedule_id: str, **definition: Unpack[CronDefinition]) -> CronSchedule:
        """Run ``task(payload)`` at every occurrence of ``cron`` read in ``timezone``.

        The keywords: ``cron``, ``timezone``, ``task`` (required), ``payload``,
        ``queue``, ``misfire``, ``jitter``, ``start``, ``end``, ``max_attempts``,
        ``backoff``, ``timeout``, ``labels``, ``paused``, ``overlap``
        (:class:`~dueflow.producers.call_options.CronDefinition`).

        ``queue`` defaults to the task's route (see :mod:`dueflow.producers.scheduler`).
        ``misfire`` says what happens to occurrences missed during downtime
        (``fire_once``, ``fire_all``, ``skip``); ``overlap`` what an occurrence
        does while the previous one still runs (``allow``, ``skip``,
        ``buffer_one``: :mod:`dueflow.rules.cron_overlap`); ``jitter`` spreads each
        occurrence over ``[0, jitter]``; ``start``/``end`` bound the window. A
        schedule that can never fire is refused.
        The expression, zone, queue and policy are checked before anything is
        written. Adding the same definition again is a no-op; another one
        under the same id is a :class:`ConflictError` (use :meth:`update_schedule`).
        """
        return self.schedules.add(schedule_id, **definition)

    def update_schedule(self, schedule_id: str, **changes: Unpack[CronChanges]) -> CronSchedule:
        """Change fields of a schedule (the keywords of :meth:`add_schedule` but
        ``paused``; omitted or ``None`` ones are kept). Writes a new version."""
        return self.schedules.update(schedule_id, **changes)

    def pause_schedule(self, schedule_id: str) -> CronSchedule:
        """Stop firing ``schedule_id`` until it is resumed."""
        return self.schedules.pause(schedule_id)

    def resume_schedule(self, schedule_id: str) -> CronSchedule:
        """Fire ``schedule_id`` again from its next occurrence."""
        return self.schedules.resume(schedule_id)

    def delete_schedule(self, schedule_id: str) -> bool:
        """Delete ``schedule_id``; False when it did not exist."""
        return self.schedules.delete(schedule_id)

    def get_schedule(self, schedule_id: str) -> CronSchedule | None:
        """The schedule ``schedule_id``, or None."""
        return self.schedules.get(schedule_id)

    def list_schedules(self, *, include_paused: bool = True) -> list[CronSchedule]:
        """Every schedule of the cluster, by id (reads the schedules topic to its end)."""
        return self.schedules.list_all(include_paused=include_paused)
