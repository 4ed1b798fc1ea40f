"""Scheduling jobs from any service: the SDK clients.

``Scheduler`` (blocking) and ``AsyncScheduler`` (asyncio) schedule one-shot
jobs, many jobs at once, reschedules, cancellations and cron schedules, and
tell where a job is (``status``); see
docs/wire-format.md for what they write.
"""

from dueflow.job_request import JobRequest
from dueflow.job_status import JobStatus
from dueflow.producers.aio import AsyncScheduler
from dueflow.producers.results import BulkError, BulkResult, Cancelled, Rescheduled, Scheduled
from dueflow.producers.scheduler import Scheduler

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
