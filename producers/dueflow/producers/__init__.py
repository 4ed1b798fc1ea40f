"""Scheduling jobs from any service: the SDK clients.

``Scheduler`` (blocking) and ``AsyncScheduler`` (asyncio) schedule one-shot
jobs, many jobs at once, reschedules, cancellations and cron schedules, and
tell where a job is (``status``); see
docs/wire-format.md for what they write.
"""

from dueflow.producers.aio import AsyncScheduler
from dueflow.producers.results import BulkError, BulkResult, Cancelled, Rescheduled, Scheduled
from dueflow.producers.scheduler import Scheduler
from dueflow.records.job_request import JobRequest
from dueflow.rules.job_status import JobStatus

__all__ = [
    "AsyncScheduler",
    "BulkError",
    "BulkResult",
    "Cancelled",
    "JobRequest",
    "JobStatus",
    "Rescheduled",
    "Scheduled",
    "Scheduler",
]
