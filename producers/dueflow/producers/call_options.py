"""The keyword sets of the scheduling calls, each declared once.

Every scheduling surface takes its keywords as ``**options: Unpack[...]`` of
one of these ``TypedDict`` s, so IDEs complete them and mypy checks their
names and types at the call, while the set itself is written in one place:

- :class:`~dueflow.records.job_options.JobOptions` (``ctx.schedule``) and
  :class:`~dueflow.records.job_options.RequestOptions` (the fields of a
  :class:`~dueflow.records.job_request.JobRequest`): a job;
- :class:`UniqueKeywords`: a job's unique key (``schedule(unique_key=...)``);
- :class:`ScheduleOptions`: ``Scheduler.schedule`` and ``AsyncScheduler.schedule``
  (the two above);
- :class:`CronDefinition` (``add_schedule``) and :class:`CronChanges`
  (``update_schedule``): a cron schedule, after its id.

At run time a keyword outside the set raises
:class:`~dueflow.records.job_options.UnknownKeyword` (an ``InvalidInput`` and
a ``TypeError``) naming it, before anything is checked or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NamedTuple, NotRequired, TypedDict

from dueflow.producers.unique_calls import DEFAULT_ADMISSION_WAIT_S, UniqueOptions, unique_options
from dueflow.records.job_options import (
    REQUEST_KEYWORDS,
    RequestOptions,
    check_keywords,
    keywords_of,
)
from dueflow.records.job_request import BackoffSpec, Duration, Instant, JobRequest
from dueflow.rules.cron import MisfirePolicy, OverlapPolicy


class UniqueKeywords(TypedDict, total=False):
    """At most one job holds ``unique_key`` at a time (see ``Scheduler.schedule``):
    how long (``unique_for``, ``unique_until``), what a duplicate does
    (``on_duplicate``), a ``debounce``, and how long the call waits for the
    verdict (``admission_wait``, seconds)."""

    unique_key: str | None
    unique_for: Duration | None
    unique_until: str | None
    on_duplicate: str | None
    debounce: Duration | None
    admission_wait: float


class ScheduleOptions(RequestOptions, UniqueKeywords, total=False):
    """The keywords of ``Scheduler.schedule`` after ``task`` and ``payload``."""


SCHEDULE_KEYWORDS = keywords_of(ScheduleOptions)


class ScheduleCall(NamedTuple):
    """A ``schedule(...)`` call's keywords, checked: the job and its unique key."""

    request: JobRequest
    unique: UniqueOptions | None
    admission_wait: float


def schedule_call(call: str, task: str, payload: Any, options: Mapping[str, Any]) -> ScheduleCall:
    """Split the keywords of ``schedule(task, payload, **options)`` into the job
    request and its unique key (checked: :func:`unique_options`); :class:`UnknownKeyword`
    for a keyword ``schedule`` does not take. A debounce without ``run_at``/``delay``
    makes the job due after the debounce."""
    check_keywords(call, options, SCHEDULE_KEYWORDS)
    fields = {k: v for k, v in options.items() if k in REQUEST_KEYWORDS}
    unique = unique_options(
        unique_key=options.get("unique_key"),
        unique_for=options.get("unique_for"),
        unique_until=options.get("unique_until"),
        on_duplicate=options.get("on_duplicate"),
        debounce=options.get("debounce"),
        timed=fields.get("run_at") is not None or fields.get("delay") is not None,
    )
    if unique is not None and unique.delay_ms is not None:
        fields["delay"] = timedelta(milliseconds=unique.delay_ms)
    wait = options.get("admission_wait", DEFAULT_ADMISSION_WAIT_S)
    return ScheduleCall(JobRequest(task, payload, **fields), unique, wait)


class CronOptions(TypedDict, total=False):
    """What a cron schedule runs and how, besides when (see ``Scheduler.add_schedule``)."""

    payload: Any
    queue: str | None
    misfire: MisfirePolicy | str
    jitter: Duration | None
    start: Instant | None
    end: Instant | None
    max_attempts: int | None
    backoff: BackoffSpec | None
    timeout: Duration | None
    labels: Mapping[str, str] | None
    overlap: OverlapPolicy | str


class CronDefinition(CronOptions):
    """The keywords of ``add_schedule`` after the schedule id: ``cron``, ``timezone``
    and ``task`` are required."""

    cron: str
    timezone: str
    task: str
    paused: NotRequired[bool]


class CronChanges(CronOptions, total=False):
    """The keywords of ``update_schedule`` after the schedule id: any field of
    :class:`CronDefinition` but ``paused`` (``pause_schedule``); one omitted (or
    ``None``) is kept."""

    cron: str
    timezone: str
    task: str


CRON_DEFINITION_KEYWORDS = keywords_of(CronDefinition)
CRON_CHANGE_KEYWORDS = keywords_of(CronChanges)


def cron_definition(call: str, definition: Mapping[str, Any]) -> CronDefinition:
    """``definition`` checked for unknown keywords (:class:`UnknownKeyword`) and the
    required ones (``cron``, ``timezone``, ``task``: a ``TypeError`` naming the
    first missing, as Python gives for a required keyword)."""
    check_keywords(call, definition, CRON_DEFINITION_KEYWORDS)
    for name in ("cron", "timezone", "task"):
        if name not in definition:
            raise TypeError(f"{call}() missing required keyword argument: {name!r}")
    return definition  # type: ignore[return-value]
