"""What every call of the scheduling client stands on: :class:`SchedulerBase`.

Its settings and the collaborators ``start()`` makes and ``close()`` closes
(the producers, the :class:`~dueflow.producers.core.TimerPlanner`, the queue
watcher, the job lookup, the timer finder, the verdict watch, the schedule
store), and the writes: one record and wait for the broker
(:meth:`SchedulerBase.write_record`), several in order. The calls themselves
are in :class:`~dueflow.producers.scheduler.Scheduler` (one job, many jobs,
where is it), :class:`~dueflow.producers.job_control.JobControl` (cancel,
reschedule, update, group) and :class:`~dueflow.producers.cron_calls.CronCalls`
(cron schedules), which build on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Union

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dueflow.config import QueueSpec, Settings
from dueflow.errors import DueflowError, KafkaOperationError, UnknownQueue
from dueflow.kafka.clients import cluster_id_of, kafka_error, make_admin, make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.queue_reader import QueueWatcher
from dueflow.kafka.topic_limits import BudgetBook, TopicLimits
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import (
    JobIds,
    TimerPlanner,
    check_timer_topic,
    default_tracer,
    delivery_error,
    producer_settings,
)
from dueflow.producers.finalized import Finalized, FinalizedQueues
from dueflow.producers.lookup import DEFAULT_SCAN_LIMIT, JobLookup, OutcomeLookup, ViewLookup
from dueflow.producers.outcomes import OutcomeReports
from dueflow.producers.recent import DEFAULT_CAPACITY, RecentJobs
from dueflow.producers.schedule_client import ScheduleStore
from dueflow.producers.schema_registry import registry_ids
from dueflow.producers.timer_finder import TimerFinder, WheelTimerFinder
from dueflow.producers.verdicts import Verdicts, VerdictWatch
from dueflow.producers.view_client import ViewClient
from dueflow.records.job_request import JobRules
from dueflow.records.queue_registry import QueueView, merge_queues
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


class SchedulerBase:
    """The scheduling client's state, lifecycle and writes (see the module doc)."""

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
        check_existing_ids: bool = False,
    ) -> None:
        self.settings = settings
        # A job with an explicit id this client does not remember is looked up in
        # the cluster first (dueflow.producers.existing): a bounded scan of one
        # outcomes partition per such call.
        self.check_existing_ids = check_existing_ids
        # Where @task declarations come from (routing): this, else settings.app.
        self._app = app
        self.registry_timeout_s = registry_timeout_s
        self._queues: QueueWatcher | None = None
        # Also write a `scheduled` outcome per job, so the status view, status()
        # and `dueflow job` know a job before it runs (dueflow.producers.outcomes;
        # its cost: docs/observability.md, "Where is my job?").
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
        # status(), cancel() and reschedule() ask the status view; when it does not
        # answer, they scan the newest status_scan_limit records of the job's outcomes
        # partition (dueflow.producers.lookup).
        self.status_scan_limit = status_scan_limit
        self._lookup: JobLookup | None = None
        self._timers: TimerFinder | None = None
        # cancel(), reschedule() and update() on a finalized queue: commands to the
        # job's worker, whose verdicts wait=... reads (dueflow.producers.steer_calls).
        self._verdicts: Verdicts | None = None
        self._finalized: Finalized | None = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> Self:
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
        # A queue's topic limits are read the first time a job goes to it.
        limits = TopicLimits(self.settings, admin=lambda: admin)
        self._planner = TimerPlanner(
            self.settings,
            recent=RecentJobs(self._recent_capacity),
            ids=JobIds(self._random_bytes),
            max_record_bytes=limit,
            metrics=self.metrics,
            rules=JobRules.from_settings(
                self.settings, declared=declared, known_tasks=declared or None
            ),
            queue_lookup=lambda queue: watcher.knows(queue, self.registry_timeout_s),
            budgets=BudgetBook(lambda queue: limits.of(self.queue_spec(queue))),
            schema_ids=registry_ids(self.settings),
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
        settings = self.settings
        view = ViewClient.from_settings(
            settings, cluster_id=lambda: cluster_id_of(make_admin(settings), timeout_s=5.0)
        )
        self._lookup = ViewLookup(
            view,
            OutcomeLookup(settings, scan_limit=self.status_scan_limit),
            recent=planner.recent.get,
            retention_ms=settings.observability.status_retention_ms,
            clock=self.clock,
            view_configured=settings.observability.status_url is not None,
        )
        self._timers = WheelTimerFinder(self.settings, queue_spec=self.queue_spec)
        self._verdicts = VerdictWatch(self.settings)
        self._finalized = FinalizedQueues(self.settings)

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
        lookup, self._lookup = self._lookup, None
        if isinstance(lookup, ViewLookup):
            lookup.close()
        self._timers = None
        verdicts, self._verdicts = self._verdicts, None
        if verdicts is not None:
            verdicts.close()
        watcher, self._queues = self._queues, None
        if watcher is not None:
            watcher.close()
        for producer in producers:
            if producer is not None:
                served(producer.flush, self.delivery_timeout_s)

    def __enter__(self) -> Self:
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

    # ------------------------------------------------------------ where is it
    @property
    def lookup(self) -> JobLookup:
        """How this client finds a job by its id (see :mod:`dueflow.producers.lookup`)."""
        if self._lookup is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._lookup

    @property
    def timers(self) -> TimerFinder:
        """How this client finds a pending job's timer (:mod:`dueflow.producers.timer_finder`)."""
        if self._timers is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._timers

    # ------------------------------------------------------------ cron
    @property
    def schedules(self) -> ScheduleStore:
        """The cron schedules of the cluster (see :class:`ScheduleStore`)."""
        if self._schedules is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._schedules

    def _steerable(self, queue: str) -> bool:
        """Whether ``queue``'s jobs are steered with commands (it was finalized)."""
        if self._finalized is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        return self._finalized.steerable(queue)

    def _read_own_writes(self) -> None:
        """Send what this client produced and nobody waited for (``scheduled`` outcomes)
        before a lookup, so it finds the jobs it just scheduled."""
        producer = self._producer
        if producer is not None and len(producer):
            served(producer.flush, self.delivery_timeout_s)

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


def declared_queues(app: App) -> dict[str, str]:
    """``task -> queue`` of the ``@task`` declarations of ``app`` (modules are
    imported: :class:`InvalidInput` names one that is not importable)."""
    if app is None or app == () or app == "":
        return {}
    # imported here: the SDK loads the worker's package (about 30 ms) only for an app
    from dueflow.consumers.registry import TaskRegistry

    if isinstance(app, TaskRegistry):
        registry = app
    else:
        modules = [app] if isinstance(app, str) else list(app)
        registry = TaskRegistry.from_modules(
            [m.strip() for item in modules for m in item.split(",") if m.strip()]
        )
    return {t.spec.name: t.spec.queue for t in registry}
