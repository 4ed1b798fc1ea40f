"""The scheduling client: schedule, schedule_many, cancel, and cron schedules.

::

    with Scheduler(settings, app="myapp.tasks") as s:
        job = s.schedule("send_email", {"to": "a@example.com"}, delay="10m")
        s.add_schedule("nightly", cron="0 3 * * *", timezone="Europe/Paris", task="report")

A job without ``queue=`` goes where its task is routed (:mod:`dueflow.rules.routing`:
the ``[routes]`` table, then the ``@task`` declarations of ``app``, then
``default``). The queues that exist are the static ones of the settings and
those of the queue registry, read at ``start()`` and followed on a thread
(:class:`~dueflow.kafka.queue_reader.QueueWatcher`), so a queue created while the
client runs is usable at once; a job for a queue that does not exist is
refused with :class:`~dueflow.errors.UnknownQueue` (after reading the
registry to its end once more), never written.

Every call checks its input completely before anything is written and
raises :class:`~dueflow.errors.InvalidInput` naming the field, the value and
what is accepted. ``schedule`` returns once the broker has acknowledged the
timer record (acks=all). A job id reused with the same content returns the
first result and writes nothing; with other content it raises
:class:`~dueflow.errors.ConflictError`. That memory is per client instance
and bounded (``recent_jobs``, default 100,000 jobs): see
:mod:`dueflow.producers.recent`.

Thread-safe: one instance may be shared by threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dueflow.config import QueueSpec, Settings
from dueflow.errors import DueflowError, InvalidInput, KafkaOperationError, UnknownQueue
from dueflow.kafka.clients import kafka_error, make_admin, make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.queue_reader import QueueWatcher
from dueflow.kafka.topics import names
from dueflow.model import Backoff
from dueflow.observability import tracing
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.producers.bulk import BulkRun
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import (
    JobIds,
    PlannedTimer,
    ScheduleSpan,
    TimerPlanner,
    check_timer_topic,
    default_tracer,
    delivery_error,
    producer_settings,
)
from dueflow.producers.lifecycle import Lifecycle
from dueflow.producers.lookup import DEFAULT_SCAN_LIMIT, JobLookup, OutcomeLookup
from dueflow.producers.outcomes import OutcomeReports, scheduled_outcome
from dueflow.producers.recent import DEFAULT_CAPACITY, RecentJobs
from dueflow.producers.results import BulkResult, Cancelled, Rescheduled, Scheduled
from dueflow.producers.schedules import ScheduleStore
from dueflow.producers.targets import Target
from dueflow.producers.timer_finder import TimerFinder, WheelTimerFinder
from dueflow.records.job_request import Duration, Instant, JobRequest, JobRules, due_of
from dueflow.records.queue_registry import QueueView, merge_queues
from dueflow.rules.cron import CronSchedule, MisfirePolicy, OverlapPolicy
from dueflow.rules.job_status import JobStatus
from dueflow.wall_clock import wall_ms

if TYPE_CHECKING:
    from dueflow.consumers.registry import TaskRegistry

# An app: module name(s) with @task handlers, or a TaskRegistry.
App = Union[str, Sequence[str], "TaskRegistry", None]


class Delivery:
    """Delivery report of one record (set by the producer's callback)."""

    __slots__ = ("done", "error", "partition")

    def __init__(self) -> None:
        self.done = False
        self.error: KafkaError | None = None
        self.partition = -1

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.error = err
        partition = msg.partition() if err is None else None
        self.partition = -1 if partition is None else partition
        self.done = True


# schedule_many writes through a producer of its own, tuned for throughput:
# longer batches, and delivery reports only for failures (a report per record
# would cost a Python call each). flush() at the end sends without lingering.
BULK_PRODUCER = {"delivery.report.only.error": True, "linger.ms": 50}


class Scheduler:
    """Schedules jobs and cron schedules through Kafka (blocking calls)."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], int] = wall_ms,
        random_bytes: Callable[[int], bytes] = os.urandom,
        recent_jobs: int = DEFAULT_CAPACITY,
        delivery_timeout_s: float = 30.0,
        producer_config: Mapping[str, Any] | None = None,
        tracer: JobTracer | None = None,
        scheduled_outcomes: bool = True,
        status_scan_limit: int = DEFAULT_SCAN_LIMIT,
        app: App = None,
        registry_timeout_s: float = 10.0,
    ) -> None:
        self.settings = settings
        # Where @task declarations come from (routing): this, else settings.app.
        self._app = app
        self.registry_timeout_s = registry_timeout_s
        self._queues: QueueWatcher | None = None
        # Also write a `scheduled` outcome per job, so the status view, status()
        # and `dueflow job` know a job before it runs (dueflow.producers.outcomes;
        # its cost: README, "Where is my job").
        self.scheduled_outcomes = scheduled_outcomes
        self.outcome_reports = OutcomeReports()
        self.names = names(settings)
        self.metrics = metrics
        self.clock = clock
        self.delivery_timeout_s = delivery_timeout_s
        self._random_bytes = random_bytes
        self._recent_capacity = recent_jobs
        self._producer_config = dict(producer_config or {})
        self._producer_conf: dict[str, Any] = {}
        self._tracer = tracer
        self.tracer = tracer or JobTracer()
        self._producer: Producer | None = None
        self._bulk_producer: Producer | None = None
        self._schedules: ScheduleStore | None = None
        self._planner: TimerPlanner | None = None
        # status(), cancel() and reschedule() find a job by its outcomes: the newest
        # status_scan_limit records of its outcomes partition (dueflow.producers.lookup).
        self.status_scan_limit = status_scan_limit
        self._lookup: JobLookup | None = None
        self._timers: TimerFinder | None = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> Scheduler:
        """Connect: read the timer topic's size limit, create the producer."""
        if self._producer is not None:
            return self
        # Without a tracer of its own, the client follows the application's
        # global tracer provider, if one is installed by now.
        self.tracer = self._tracer or default_tracer()
        admin = make_admin(self.settings)
        geo = self.settings.wheel
        limit = check_timer_topic(
            admin,
            self.names.timers,
            partitions=geo.total_partitions,
            shard_partitions=geo.shard_partitions,
        )
        declared = declared_queues(self._app if self._app is not None else self.settings.app)
        watcher = QueueWatcher(self.settings, on_change=self._on_queues, component="scheduler")
        self._planner = TimerPlanner(
            self.settings,
            recent=RecentJobs(self._recent_capacity),
            ids=JobIds(self._random_bytes),
            max_record_bytes=limit,
            metrics=self.metrics,
            rules=JobRules.from_settings(self.settings, declared=declared),
            queue_lookup=lambda queue: watcher.knows(queue, self.registry_timeout_s),
        )
        watcher.start(self.registry_timeout_s)
        self._queues = watcher
        self._planner.set_queues(watcher.view.names)
        try:
            self._make_producers(limit)
        except BaseException:
            self.close()
            raise
        return self

    def _make_producers(self, limit: int) -> None:
        conf = {
            "message.timeout.ms": int(self.delivery_timeout_s * 1000),
            **producer_settings(limit),
            **self._producer_config,
        }
        self._producer_conf = conf
        self._producer = make_producer(self.settings, **conf)
        self._bulk_producer = make_producer(self.settings, **{**BULK_PRODUCER, **conf})
        planner = self.planner
        self._schedules = ScheduleStore(
            self.settings,
            write=self.write_record,
            clock=self.clock,
            route=planner.rules.router.queue_for,
            check_queue=planner.check_queue,
        )
        self._lookup = OutcomeLookup(self.settings, scan_limit=self.status_scan_limit)
        self._timers = WheelTimerFinder(self.settings, queue_spec=self.queue_spec)

    def _on_queues(self, view: QueueView, changed: set[str]) -> None:
        """The registry changed (on the watcher's thread)."""
        planner = self._planner
        if planner is not None:
            planner.set_queues(view.names)

    @property
    def queues(self) -> QueueView:
        """The queues this client knows now: static and registered, merged (a
        client without a registry, as the in-memory one: the static queues)."""
        if self._queues is not None:
            return self._queues.view
        if self._planner is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return merge_queues(self.settings.queues, {})

    def queue_spec(self, name: str) -> QueueSpec:
        """The spec of queue ``name`` (static or registered); :class:`UnknownQueue`
        when no one knows it (the registry is read again first)."""
        self.planner.check_queue(name)
        spec = self.queues.get(name)
        if spec is None:
            raise UnknownQueue(name, self.queues.names)
        return spec

    def close(self) -> None:
        """Wait for outstanding records (up to the delivery timeout), then drop the producer."""
        producers = (self._producer, self._bulk_producer)
        self._producer = self._bulk_producer = None
        self._schedules = None
        self._lookup = None
        self._timers = None
        watcher, self._queues = self._queues, None
        if watcher is not None:
            watcher.close()
        for producer in producers:
            if producer is not None:
                served(producer.flush, self.delivery_timeout_s)

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def producer_settings(self) -> dict[str, Any]:
        """The librdkafka settings the producers got on top of ``dueflow.kafka.clients``'
        defaults (the bulk producer adds :data:`BULK_PRODUCER`)."""
        return dict(self._producer_conf)

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._producer

    @property
    def planner(self) -> TimerPlanner:
        if self._planner is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._planner

    # ------------------------------------------------------------ one job
    def schedule(
        self,
        task: str,
        payload: Any = None,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        job_id: str | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | str | Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
        jitter: Duration | None = None,
        labels: Mapping[str, str] | None = None,
        expires: Instant | None = None,
        max_lateness: Duration | None = None,
    ) -> Scheduled:
        """Schedule ``task(payload)`` at ``run_at``, after ``delay``, or now, on
        ``queue`` (default: where the task is routed, see the module doc).

        ``expires`` (an instant) / ``max_lateness`` (a duration after the due
        time): a job not started by then is not run, outcome ``expired``
        (:mod:`dueflow.rules.deadline`).

        Returns the job id and the UTC due time (jitter applied) once the
        broker has the timer. Raises :class:`InvalidInput` (nothing written;
        :class:`~dueflow.errors.UnknownQueue` for a queue that does not exist),
        :class:`ConflictError`, or :class:`KafkaOperationError` when the
        broker did not take the record.
        """
        return self.schedule_request(
            JobRequest(
                task,
                payload,
                run_at=run_at,
                delay=delay,
                queue=queue,
                job_id=job_id,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
                jitter=jitter,
                labels=labels,
                expires=expires,
                max_lateness=max_lateness,
            )
        )

    def schedule_request(self, req: JobRequest) -> Scheduled:
        """:meth:`schedule` for a prepared :class:`JobRequest`."""
        planner, now_ms = self.planner, self.clock()
        if not self.tracer.enabled:
            planned = planner.plan(req, now_ms=now_ms)
            return planned if isinstance(planned, Scheduled) else self._write_one(planned)
        span = ScheduleSpan(self.tracer, planner.routed(req), ids=planner.ids, now_ms=now_ms)
        try:
            planned = planner.plan(span.request, now_ms=now_ms, trace_headers=span.headers)
            result = planned if isinstance(planned, Scheduled) else self._write_one(planned)
        except DueflowError as exc:
            span.end(error=exc)
            raise
        span.end(due_ms=result.due_ms)
        return result

    def _write_one(self, planned: PlannedTimer) -> Scheduled:
        rec = planned.record
        delivery = Delivery()
        self._produce(self.planner.topic, rec.value, rec.key, rec.partition, rec.headers, delivery)
        self._wait(delivery)
        if delivery.error is not None:
            self.planner.failed(planned)
            raise delivery_error(f"scheduling job {planned.job.job_id!r}", delivery.error)
        self.planner.delivered(planned.job.queue)
        if self.scheduled_outcomes:
            self.record_scheduled(planned)
        return planned.result()

    def record_scheduled(self, planned: PlannedTimer) -> None:
        """Produce the ``scheduled`` outcome of a job whose timer was acknowledged
        (nobody waits for it; ``close()`` flushes it)."""
        job = planned.job
        rec = scheduled_outcome(
            self.names,
            job_id=job.job_id,
            queue=job.queue,
            task=job.task,
            idempotency_key=job.idempotency_key,
            due_ms=job.due_ms,
            at_ms=self.clock(),
            trace_id=tracing.trace_id_of(planned.record.headers),
            schedule_id=job.schedule_id,
        )
        self._produce(rec.topic, rec.value, rec.key, None, rec.headers, self.outcome_reports)

    # ------------------------------------------------------------ bulk
    def schedule_many(
        self, jobs: Iterable[JobRequest | Mapping[str, Any]], *, poll_every: int = 1000
    ) -> BulkResult:
        """Schedule many jobs in one call; errors are reported per job, not raised.

        ``jobs`` may be any iterable of :class:`JobRequest` or dicts of its
        fields (a generator of 100k items is fine): records are produced as
        they come, delivery reports are served every ``poll_every`` jobs and
        whenever the producer queue is full, so memory stays bounded by the
        producer's queue, not by the input. Returns once every record is
        acknowledged or failed; see :class:`BulkResult`.
        """
        producer = self._bulk_producer
        if producer is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        run = BulkRun(
            self.planner,
            producer,
            clock=self.clock,
            poll_every=poll_every,
            tracer=self.tracer,
            outcome_reports=self.outcome_reports if self.scheduled_outcomes else None,
        )
        return run.run(jobs, flush_timeout_s=self.delivery_timeout_s + 30.0)

    # ------------------------------------------------------------ where is it
    @property
    def lookup(self) -> JobLookup:
        """How this client finds a job by its id (see :mod:`dueflow.producers.lookup`)."""
        if self._lookup is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._lookup

    def status(self, job_id: str) -> JobStatus | None:
        """Where job ``job_id`` is: state (``scheduled`` while it waits for its due
        time), queue, task, due time, attempts, last outcome and error; None when
        no outcome of it is found.

        Read from the job's outcome records (the client writes ``scheduled`` for
        every job unless ``scheduled_outcomes=False``): the newest
        ``status_scan_limit`` records of the one outcomes partition the id
        hashes to. ``status.pending`` is True until a worker takes the job.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty string")
        self._read_own_writes()
        return self.lookup.status(job_id)

    def _read_own_writes(self) -> None:
        """Send what this client produced and nobody waited for (``scheduled`` outcomes)
        before a lookup, so it finds the jobs it just scheduled."""
        producer = self._producer
        if producer is not None and len(producer):
            served(producer.flush, self.delivery_timeout_s)

    # ------------------------------------------------------------ cancel
    def cancel(
        self, job_id: str, *, queue: str | None = None, idempotency_key: str | None = None
    ) -> Cancelled:
        """Cancel ``job_id``: workers skip it if it has not run yet, and its retries.

        The job is looked up first (:meth:`status`): the cancellation goes to the
        queue and key its outcomes name, and the result says whether it was found
        and what state it was in. A job that has finished (succeeded, dead,
        cancelled, ...) is not cancelled again (``cancelled`` False). Refused with
        :class:`InvalidInput`: a ``queue`` the job is not known in, a job id known
        in more than one queue without ``queue``, a job not found without
        ``queue`` (then ``queue=`` writes the cancellation there anyway: ``found``
        False), a job due later than its queue's idempotency retention from now
        (workers would forget the cancellation before it comes due). Returns once
        the records are acknowledged.
        """
        records, cancelled = self.cancel_plan(job_id, queue=queue, idempotency_key=idempotency_key)
        partition = self._write_all(records, f"cancelling job {job_id!r}")
        return cancelled._replace(partition=partition) if records else cancelled

    def cancel_plan(
        self, job_id: str, *, queue: str | None = None, idempotency_key: str | None = None
    ) -> tuple[list[OutgoingRecord], Cancelled]:
        """The records that cancel ``job_id`` (none when it has finished) and the
        result (partition not known yet); looks the job up (blocking)."""
        target = self._find_target(
            job_id, queue=queue, idempotency_key=idempotency_key, verb="cancel"
        )
        return self._lifecycle().cancel_plan(target)

    # ------------------------------------------------------------ reschedule
    def reschedule(
        self,
        job_id: str,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
    ) -> Rescheduled:
        """Move pending job ``job_id`` to ``run_at`` (or ``delay`` from now): it runs
        then, never at its old time, never twice (the rule and its races:
        :mod:`dueflow.records.reschedule`). A time in the past runs it at once.

        The job is looked up by its outcomes (as :meth:`status`; ``queue`` as for
        :meth:`cancel`) and its timer record is read from the wheel; then a new
        timer (same job id, key and value, the new due time) and a reschedule
        record for its key are written, in that order. A job that has started or
        finished, a cron occurrence, or one that is not found is not rescheduled:
        ``rescheduled`` is False and ``reason`` says why. Raises
        :class:`InvalidInput` for a bad time, a wrong or ambiguous queue, or a job
        due beyond its queue's idempotency retention from now (workers would
        forget the reschedule record before the old timer fires).
        """
        due_ms = due_of(run_at, delay, now_ms=self.clock(), required=True)
        target = self._find_target(job_id, queue=queue, idempotency_key=None, verb="reschedule")
        move = self._lifecycle().reschedule_plan(target, due_ms)
        if move.timer is None:
            return move.result
        timer = move.timer
        delivery = Delivery()
        topic = self.planner.topic
        self._produce(topic, timer.value, timer.key, timer.partition, timer.headers, delivery)
        self._wait(delivery)
        if delivery.error is not None:
            raise delivery_error(f"rescheduling job {job_id!r} ({topic})", delivery.error)
        self._write_all(move.records, f"rescheduling job {job_id!r}")
        self.planner.recent.move(job_id, due_ms, timer.partition)
        return move.result

    @property
    def timers(self) -> TimerFinder:
        """How this client finds a pending job's timer (:mod:`dueflow.producers.timer_finder`)."""
        if self._timers is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._timers

    def _lifecycle(self) -> Lifecycle:
        """Plans cancels and reschedules (:mod:`dueflow.producers.lifecycle`)."""
        return Lifecycle(
            self.settings,
            planner=self.planner,
            lookup=self.lookup,
            timers=self.timers,
            clock=self.clock,
            queue_spec=self.queue_spec,
        )

    def _find_target(
        self,
        job_id: str,
        *,
        queue: str | None,
        idempotency_key: str | None,
        verb: str,
    ) -> Target:
        """The job a cancel or reschedule of ``job_id`` means (see
        :mod:`dueflow.producers.targets`): looked up by its outcomes, else what this
        client scheduled, else ``queue``."""
        self._read_own_writes()
        return self._lifecycle().target(
            job_id, queue=queue, idempotency_key=idempotency_key, verb=verb
        )

    def _write_all(self, records: list[OutgoingRecord], what: str) -> int:
        """Produce ``records``, wait for every one; the first one's partition."""
        deliveries = [Delivery() for _ in records]
        for rec, d in zip(records, deliveries, strict=True):
            self._produce_record(rec, d)
        for d in deliveries:
            self._wait(d)
        for d, rec in zip(deliveries, records, strict=True):
            if d.error is not None:
                raise delivery_error(f"{what} ({rec.topic})", d.error)
        return deliveries[0].partition if deliveries else -1

    # ------------------------------------------------------------ cron
    @property
    def schedules(self) -> ScheduleStore:
        """The cron schedules of the cluster (see :class:`ScheduleStore`)."""
        if self._schedules is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._schedules

    def add_schedule(
        self,
        schedule_id: str,
        *,
        cron: str,
        timezone: str,
        task: str,
        payload: Any = None,
        queue: str | None = None,
        misfire: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE,
        jitter: Duration | None = None,
        start: Instant | None = None,
        end: Instant | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | str | Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
        labels: Mapping[str, str] | None = None,
        paused: bool = False,
        overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
    ) -> CronSchedule:
        """Run ``task(payload)`` at every occurrence of ``cron`` read in ``timezone``.

        ``queue`` defaults to the task's route (see the module doc).
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
        return self.schedules.add(
            schedule_id,
            cron=cron,
            timezone=timezone,
            task=task,
            payload=payload,
            queue=queue,
            misfire=misfire,
            jitter=jitter,
            start=start,
            end=end,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
            labels=labels,
            paused=paused,
            overlap=overlap,
        )

    def update_schedule(self, schedule_id: str, **changes: Any) -> CronSchedule:
        """Change fields of a schedule (the keywords of :meth:`add_schedule`; omitted or
        ``None`` ones are kept). Writes a new version."""
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

    # ------------------------------------------------------------ plumbing
    def write_record(self, rec: OutgoingRecord) -> int:
        """Produce one record and wait for the broker; return its partition."""
        delivery = Delivery()
        self._produce_record(rec, delivery)
        self._wait(delivery)
        if delivery.error is not None:
            raise delivery_error(f"writing to {rec.topic}", delivery.error)
        return delivery.partition

    def _produce_record(self, rec: OutgoingRecord, delivery: Delivery) -> None:
        self._produce(rec.topic, rec.value, rec.key, rec.partition, rec.headers, delivery)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes,
        partition: int | None,
        headers: list[tuple[str, bytes]],
        delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        producer = self.producer
        produce: Callable[..., None] = producer.produce  # headers: list[tuple[str, bytes]]
        while True:
            try:
                if partition is None:
                    produce(topic, value, key, on_delivery=delivery, headers=headers)
                else:
                    produce(topic, value, key, partition, on_delivery=delivery, headers=headers)
                return
            except BufferError:
                served(producer.poll, 0.05)
            except KafkaException as exc:
                raise kafka_error(f"producing to {topic}", exc) from exc

    def _wait(self, delivery: Delivery) -> None:
        deadline = time.monotonic() + self.delivery_timeout_s + 30.0
        while not delivery.done:
            served(self.producer.poll, 0.05)
            if time.monotonic() > deadline:
                raise KafkaOperationError("no delivery report from the producer in time")


def declared_queues(app: App) -> dict[str, str]:
    """``task -> queue`` of the ``@task`` declarations of ``app`` (modules are
    imported: :class:`InvalidInput` names one that is not importable)."""
    if app is None or app == () or app == "":
        return {}
    from dueflow.consumers.registry import TaskRegistry

    if isinstance(app, TaskRegistry):
        registry = app
    else:
        modules = [app] if isinstance(app, str) else list(app)
        registry = TaskRegistry.from_modules(
            [m.strip() for item in modules for m in item.split(",") if m.strip()]
        )
    return {t.spec.name: t.spec.queue for t in registry}
