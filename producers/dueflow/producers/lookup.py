"""Finding a job the client did not just schedule: its outcomes (I/O edge).

``Scheduler.status``, ``cancel`` and ``reschedule`` need to know where a job
is: its queue, its key, its due time, whether it ran. That is what its
outcome records say (the client writes ``scheduled`` for every job by
default). Kafka has no point lookup, so :class:`OutcomeLookup` reads the one
partition of ``<prefix>.outcomes`` the job id hashes to, and only its newest
``scan_limit`` records (:func:`~dueflow.streams.status.outcome_scan.scan_for_job`,
what ``dueflow job --kafka`` does): a job whose records are older than that
window (a busy cluster, a job scheduled long ago) is not found here; the
status view (``dueflow job``) keeps every job that has not finished.

The in-memory pipeline passes its own lookup (``dueflow.testing``).
"""

from __future__ import annotations

from typing import Protocol

from dueflow.config import Settings
from dueflow.rules.job_status import JobStatus

DEFAULT_SCAN_LIMIT = 200_000


class JobLookup(Protocol):
    """Where a job is, by its id."""

    def status(self, job_id: str) -> JobStatus | None:
        """The job as its outcomes tell; None when none is found."""
        ...


class OutcomeLookup:
    """:class:`JobLookup` over the outcomes topic: a bounded scan of one partition."""

    def __init__(
        self, settings: Settings, *, scan_limit: int = DEFAULT_SCAN_LIMIT, timeout_s: float = 30.0
    ) -> None:
        self.settings = settings
        self.scan_limit = scan_limit
        self.timeout_s = timeout_s

    def status(self, job_id: str) -> JobStatus | None:
        from dueflow.streams.status.outcome_scan import scan_for_job

        scan = scan_for_job(
            self.settings, job_id, max_records=self.scan_limit, timeout_s=self.timeout_s
        )
        return scan.status
