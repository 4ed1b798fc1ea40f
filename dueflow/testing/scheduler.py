"""The scheduling client over the in-memory log: :class:`dueflow.Scheduler` itself.

:class:`InMemoryScheduler` is a :class:`~dueflow.producers.scheduler.Scheduler`
whose producer is a :class:`~dueflow.testing.log.MemoryProducer` and whose
schedule store reads the log: every check (fields, queues, payload encoding
and size, job-id conflicts, backoff text, cron expressions and zones), every
record and every result are those of the real client. Only ``start`` (no
topic to describe), the store's reads and the job lookup of ``status``,
``cancel`` and ``reschedule`` (every outcome of the log, no scan window; the
job's newest timer record) differ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from confluent_kafka import Producer

from dueflow.config import Settings
from dueflow.errors import InvalidInput, ResultTimeout
from dueflow.kafka.topics import names
from dueflow.observability.tracing import JobTracer
from dueflow.producers.core import DEFAULT_MAX_MESSAGE_BYTES, JobIds, TimerPlanner
from dueflow.producers.fan_in_commands import GroupScheduled
from dueflow.producers.finalized import AllFinalized
from dueflow.producers.recent import DEFAULT_CAPACITY, RecentJobs
from dueflow.producers.result_wait import check_timeout, settled
from dueflow.producers.results import (
    BulkResult,
    Cancelled,
    JsonValue,
    Rescheduled,
    Scheduled,
    Updated,
)
from dueflow.producers.schedule_client import ScheduleStore, StoredSchedule
from dueflow.producers.scheduler import App, Scheduler, declared_queues
from dueflow.records.job_request import Duration, Instant, JobRequest, JobRules
from dueflow.testing.log import MemoryLog, MemoryProducer, MemoryRecord
from dueflow.testing.lookup import MemoryLookup, MemoryTimerFinder, MemoryVerdicts


class MemoryScheduleStore(ScheduleStore):
    """Cron schedules written to and read from the in-memory log."""

    def __init__(
        self,
        settings: Settings,
        *,
        log: MemoryLog,
        write: Callable[[Any], int],
        clock: Callable[[], int],
        route: Callable[[str], str] | None = None,
        check_queue: Callable[[object], None] | None = None,
    ) -> None:
        super().__init__(settings, write=write, clock=clock, route=route, check_queue=check_queue)
        self._log = log

    def read_all(self) -> dict[str, StoredSchedule]:
        """The latest record of every schedule id (the log is always read to its end)."""
        latest: dict[str, StoredSchedule] = {}
        for record in self._log.records(self.topic):
            self._apply(record.key(), record.value(), record.headers(), latest)
        return latest


class InMemoryScheduler(Scheduler):
    """:class:`dueflow.Scheduler` writing to a :class:`MemoryLog` (no broker).

    ``on_record`` hears every record as it is written (the pipeline's emitter
    reads a schedule change at once, as a running emitter would);
    ``after_write`` is called after every call that scheduled or cancelled
    jobs (the pipeline's eager mode runs them there). Tracing is off.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        log: MemoryLog,
        clock: Callable[[], int],
        random_bytes: Callable[[int], bytes],
        recent_jobs: int = DEFAULT_CAPACITY,
        after_write: Callable[[], None] | None = None,
        on_record: Callable[[MemoryRecord], None] | None = None,
        scheduled_outcomes: bool = True,
        app: App = None,
        check_existing_ids: bool = False,
    ) -> None:
        super().__init__(
            settings,
            clock=clock,
            random_bytes=random_bytes,
            recent_jobs=recent_jobs,
            tracer=JobTracer(),
            scheduled_outcomes=scheduled_outcomes,
            app=app,
            check_existing_ids=check_existing_ids,
        )
        self._log = log
        self._after_write = after_write or (lambda: None)
        self._on_record = on_record
        self._recent: RecentJobs | None = None

    def start(self) -> InMemoryScheduler:
        """Ready at once: no topic to describe (the broker's default record size limit)."""
        if self._producer is not None:
            return self
        self.tracer = JobTracer()
        if self._recent is None:
            self._recent = RecentJobs(self._recent_capacity)
        # Jobs without a queue are routed as the real client routes them (its app:
        # the pipeline's tasks); the queues are the settings' (no registry here).
        declared = declared_queues(self._app if self._app is not None else self.settings.app)
        self._planner = TimerPlanner(
            self.settings,
            recent=self._recent,
            ids=JobIds(self._random_bytes),
            max_record_bytes=DEFAULT_MAX_MESSAGE_BYTES,
            metrics=self.metrics,
            rules=JobRules.from_settings(self.settings, declared=declared),
        )
        producer = cast(Producer, MemoryProducer(self._log, on_record=self._on_record))
        self._producer = self._bulk_producer = producer
        self._schedules = MemoryScheduleStore(
            self.settings,
            log=self._log,
            write=self.write_record,
            clock=self.clock,
            route=self._planner.rules.router.queue_for,
            check_queue=self._planner.check_queue,
        )
        self._lookup = MemoryLookup(self.settings, self._log)
        self._timers = MemoryTimerFinder(self.settings, self._log)
        # Its worker applies commands: every queue is steered with them.
        self._verdicts = MemoryVerdicts(self.settings, self._log)
        self._finalized = AllFinalized()
        return self

    def reconfigure(self, settings: Settings) -> None:
        """Take new settings (more queues) and keep what this client remembers."""
        started = self._producer is not None
        self.settings = settings
        self.names = names(settings)
        self._producer = self._bulk_producer = None
        if started:
            self.start()

    # Every call that schedules jobs lets the pipeline run them when it is eager.
    def schedule_request(self, req: JobRequest) -> Scheduled:
        result = super().schedule_request(req)
        self._after_write()
        return result

    def schedule_many(
        self, jobs: Iterable[JobRequest | Mapping[str, Any]], *, poll_every: int = 1000
    ) -> BulkResult:
        result = super().schedule_many(jobs, poll_every=poll_every)
        self._after_write()
        return result

    def _after_unique(self) -> None:
        self._after_write()

    def group(
        self,
        members: Iterable[JobRequest | Mapping[str, Any]],
        *,
        then: JobRequest | Mapping[str, Any],
        group_id: str | None = None,
    ) -> GroupScheduled:
        result = super().group(members, then=then, group_id=group_id)
        self._after_write()
        return result

    def cancel(
        self,
        job_id: str,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> Cancelled:
        # Its worker answers at once: the verdict is there without waiting.
        wait = 0.0 if wait is None else wait
        result = super().cancel(job_id, queue=queue, idempotency_key=idempotency_key, wait=wait)
        self._after_write()
        return result

    def result(self, job_id: str, *, timeout: float | None = 30.0) -> JsonValue:
        """:meth:`dueflow.Scheduler.result` in memory: nothing runs while a call waits
        (the pipeline runs jobs when told to), so a job that has not ended raises
        :class:`~dueflow.errors.ResultTimeout` at once."""
        if not isinstance(job_id, str) or not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty string")
        timeout_s = check_timeout(timeout)
        status = self.status(job_id)
        done, value = settled(job_id, status)
        if done:
            return value
        raise ResultTimeout(
            job_id,
            "unknown" if status is None else status.state,
            0.0 if timeout_s is None else timeout_s,
            hint="; in memory nothing runs while a call waits: run the pipeline first "
            "(run_until_idle, advance, or eager mode)",
        )

    def reschedule(
        self,
        job_id: str,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Rescheduled:
        wait = 0.0 if wait is None else wait
        result = super().reschedule(job_id, run_at=run_at, delay=delay, queue=queue, wait=wait)
        self._after_write()
        return result

    def update(
        self,
        job_id: str,
        *,
        payload: Any,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Updated:
        wait = 0.0 if wait is None else wait
        result = super().update(
            job_id, payload=payload, run_at=run_at, delay=delay, queue=queue, wait=wait
        )
        self._after_write()
        return result
