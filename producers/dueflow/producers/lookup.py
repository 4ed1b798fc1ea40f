"""Finding a job by its id: the status view, else a bounded scan (I/O edge).

``Scheduler.status``, ``cancel`` and ``reschedule`` need to know where a job
is: its queue, its key, its due time, whether it ran. :class:`ViewLookup`
asks the status view (:mod:`dueflow.producers.view_client`), whose table
holds every job that has not ended, at any horizon, and every ended one for
``observability.status_retention_ms``: a point lookup, not a scan. When the
view does not answer (not running, slow, another cluster's), it falls back
to :class:`OutcomeLookup`: the one outcomes partition the job id hashes to,
and only its newest ``scan_limit`` records
(:func:`~dueflow.kafka.outcome_scan.scan_for_job`, what ``dueflow job
--kafka`` does). A job whose records are older than that window is not found
there: such answers say ``complete=False``, and the fallback is logged.

Read-your-writes: a job this client scheduled a moment ago, whose
``scheduled`` outcome the view has not folded yet, is waited for briefly
(``?wait_ms=``), then answered from the client's memory
(``source="client"``).

The in-memory pipeline passes its own lookup (``dueflow.testing``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from dueflow.config import Settings
from dueflow.kafka.outcome_scan import scan_for_job
from dueflow.observability.logs import event
from dueflow.producers.results import Scheduled
from dueflow.producers.view_client import WAIT_MAX_MS, ViewClient, ViewUnavailable
from dueflow.rules.job_status import JobStatus

log = logging.getLogger("dueflow.producers")

DEFAULT_SCAN_LIMIT = 200_000
# How long a lookup of a job this client just scheduled waits for the view to fold it.
READ_YOUR_WRITES_WAIT_MS = 1_000
FALLBACK_LOG_EVERY_S = 60.0  # the "view did not answer" warning, at most this often


class JobLookup(Protocol):
    """Where a job is, by its id."""

    def status(self, job_id: str, *, timeout_s: float | None = None) -> JobStatus | None:
        """The job as its outcomes tell; None when none is found. ``timeout_s``: the
        most the lookup may take (default: the lookup's own)."""
        ...


class OutcomeLookup:
    """:class:`JobLookup` over the outcomes topic: a bounded scan of one partition."""

    def __init__(
        self, settings: Settings, *, scan_limit: int = DEFAULT_SCAN_LIMIT, timeout_s: float = 30.0
    ) -> None:
        self.settings = settings
        self.scan_limit = scan_limit
        self.timeout_s = timeout_s

    def status(self, job_id: str, *, timeout_s: float | None = None) -> JobStatus | None:
        """The job as the newest ``scan_limit`` records of its partition tell
        (``source="kafka-scan"``; ``complete`` False when older records were left);
        ``timeout_s``: the most the scan may take (default: the lookup's own)."""
        scan = scan_for_job(
            self.settings,
            job_id,
            max_records=self.scan_limit,
            timeout_s=self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s),
        )
        if scan.view is None:
            if scan.skipped_older:
                event(
                    log,
                    "job not found by the outcomes scan: the answer may be incomplete",
                    logging.WARNING,
                    job_id=job_id,
                    topic=scan.topic,
                    partition=scan.partition,
                    records_read=scan.scanned,
                    older_records_not_read=scan.skipped_older,
                )
            return None
        return JobStatus.from_view(
            scan.view,
            queues=scan.queues,
            source="kafka-scan",
            complete=scan.skipped_older == 0,
            content_hash=scan.content_hash,
        )


class ViewLookup:
    """:class:`JobLookup` of the SDK: the status view, else ``fallback``; and what this
    client scheduled (``recent``) while the view has not folded it."""

    def __init__(
        self,
        view: ViewClient,
        fallback: JobLookup,
        *,
        recent: Callable[[str], Scheduled | None] = lambda _job_id: None,
        retention_ms: int,
        clock: Callable[[], int],
        view_configured: bool = True,
    ) -> None:
        self.view = view
        self.view_configured = view_configured
        self.fallback = fallback
        self._recent = recent
        self._retention_ms = retention_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._warned_at: float | None = None

    def status(self, job_id: str, *, timeout_s: float | None = None) -> JobStatus | None:
        return self._status(job_id, own=True, timeout_s=timeout_s)

    def cluster_status(self, job_id: str) -> JobStatus | None:
        """:meth:`status` without this client's memory of what it scheduled (whether a
        job id exists in the cluster)."""
        return self._status(job_id, own=False)

    def _status(
        self, job_id: str, *, own: bool, timeout_s: float | None = None
    ) -> JobStatus | None:
        try:
            found = self.view.job(job_id)
            if found is None:
                mine = self._mine(job_id) if own else None
                if mine is None:
                    return None
                found = self.view.job(job_id, wait_ms=READ_YOUR_WRITES_WAIT_MS, until="change")
                if found is None:
                    return scheduled_status(mine)
        except ViewUnavailable as exc:
            self._warn(exc)
            status = self.fallback.status(job_id, timeout_s=timeout_s)
            if status is None:
                mine = self._mine(job_id) if own else None
                return None if mine is None else scheduled_status(mine)
            return status
        return JobStatus.from_view(found, source="status-view")

    def final_status(self, job_id: str, *, wait_s: float) -> JobStatus | None:
        """The job once it has ended, else as it is after ``wait_s`` (at most one
        request of the view's bound, :data:`~dueflow.producers.view_client.WAIT_MAX_MS`):
        the view's long poll (``?wait_ms=&until=final``: the view answers when it
        folds the job's end). When the view does not answer, :meth:`status`'s
        fallback (the scan, given at most ``wait_s``)."""
        wait_ms = int(max(0.0, min(wait_s * 1000, WAIT_MAX_MS)))
        try:
            found = self.view.job(job_id, wait_ms=wait_ms, until="final")
        except ViewUnavailable as exc:
            self._warn(exc)
            status = self.fallback.status(job_id, timeout_s=wait_s)
            if status is not None:
                return status
            found = None
        if found is None:
            mine = self._mine(job_id)
            return None if mine is None else scheduled_status(mine)
        return JobStatus.from_view(found, source="status-view")

    def _mine(self, job_id: str) -> Scheduled | None:
        """What this client scheduled as ``job_id``, unless it would have ended and left
        the view's table by now."""
        mine = self._recent(job_id)
        if mine is None or mine.due_ms + self._retention_ms < self._clock():
            return None
        return mine

    def _warn(self, exc: ViewUnavailable) -> None:
        if exc.absent and not self.view_configured:
            # No view set up and none listening at the default address: the scan is
            # what this client does (answers still say complete=False when so).
            event(log, "no status view: scanning the outcomes topic", logging.DEBUG)
            return
        now = time.monotonic()
        with self._lock:
            if self._warned_at is not None and now - self._warned_at < FALLBACK_LOG_EVERY_S:
                return
            self._warned_at = now
        event(
            log,
            "status view did not answer: scanning the outcomes topic, answers may be incomplete",
            logging.WARNING,
            url=self.view.base_url,
            reason=str(exc),
        )

    def close(self) -> None:
        self.view.close()


def scheduled_status(job: Scheduled) -> JobStatus:
    """What a client knows of a job it scheduled (``source="client"``, incomplete)."""
    return JobStatus(
        job_id=job.job_id,
        state="scheduled",
        queue=job.queue,
        task=job.task,
        idempotency_key=job.idempotency_key,
        due_ms=job.due_ms,
        attempts=0,
        last_outcome="scheduled",
        updated_ms=0,
        last_error=None,
        schedule_id=None,
        queues=(job.queue,),
        history=(),
        source="client",
        complete=False,
    )
