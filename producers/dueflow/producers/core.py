"""What the sync and the asyncio scheduling clients share, apart from waiting.

:class:`TimerPlanner` turns a request into a timer record ready to produce,
or into an earlier result (an idempotent repeat), or raises for bad input.
It does no Kafka I/O: the clients produce what it returns.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from opentelemetry import trace

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.errors import ConflictError, InvalidInput, KafkaOperationError, TopicMismatch
from dueflow.ids import TAIL_BYTES, uuid7_head, uuid7_tails
from dueflow.kafka.clients import kafka_error
from dueflow.kafka.topic_limits import default_limits
from dueflow.kafka.topics import names
from dueflow.observability import tracing
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.producers.recent import RecentJobs
from dueflow.producers.results import Scheduled
from dueflow.records.job_request import (
    JobRequest,
    JobRules,
    PreparedJob,
    deadline_of,
    prepare_job,
    unknown_queue,
)
from dueflow.records.record_size import header_bytes
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES, JobBudget, JobShape
from dueflow.records.timer_record import (
    TimerPlacer,
    TimerRecord,
    framed_timer,
    timer_record,
)

_new_tuple = tuple.__new__  # NamedTuple without its Python-level __new__ (hot path)

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "JobIds", "PlannedTimer", "TimerPlanner"]


class JobIds:
    """Draws UUIDv7 job ids; random digits come in batches from ``random_bytes``.

    Thread-safe: threads never share random digits."""

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom, batch: int = 4096):
        self._random = random_bytes
        self._batch = batch
        self._tails: list[str] = []  # reversed: the next one is last
        self._lock = threading.Lock()

    def new(self, now_ms: int) -> str:
        with self._lock:
            if not self._tails:
                self._tails = self._draw()
            tail = self._tails.pop()
        return uuid7_head(now_ms) + tail

    def tails(self) -> list[str]:
        """The random tails (:func:`~dueflow.ids.uuid7_tails`) of the next ids, the
        next one last: the rest of the current batch, or a new one. For callers
        that draw ids in bulk (``uuid7_head(now_ms) + tails.pop()``)."""
        with self._lock:
            tails, self._tails = self._tails, []
            return tails or self._draw()

    def _draw(self) -> list[str]:
        tails = uuid7_tails(self._random(TAIL_BYTES * self._batch))
        tails.reverse()
        return tails


class PlannedTimer(NamedTuple):
    """A job ready to produce: the checked job and its record."""

    job: PreparedJob
    record: TimerRecord

    def result(self) -> Scheduled:
        """What ``schedule`` reports once the record is written."""
        job = self.job
        return Scheduled(
            job.job_id,
            job.due_ms,
            job.queue,
            job.task,
            job.idempotency_key,
            job.content_hash or "",
            self.record.partition,
            expires_ms=hdr.header_int(self.record.headers, hdr.EXPIRES),
        )


class TimerPlanner:
    """Checks requests and builds timer records; remembers recent jobs (no I/O of
    its own: ``queue_lookup`` is the client's way to learn of a queue it does not
    know yet, see :meth:`check_queue`; ``budgets`` gives the size budget of a queue,
    reading its topics' limits the first time, see :meth:`budget_of`).

    Without ``budgets`` a queue's budget is that of a cluster with the broker's
    default limits (``max_record_bytes`` for the timer topic), as ``dueflow topics
    ensure`` creates it (:func:`dueflow.kafka.topic_limits.default_limits`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        recent: RecentJobs,
        ids: JobIds,
        max_record_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        metrics: Metrics | None = None,
        rules: JobRules | None = None,
        queue_lookup: Callable[[str], bool] | None = None,
        budgets: Callable[[str], JobBudget] | None = None,
        schema_ids: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        # The schema registry option: the registry's id of job.avsc (asked for at the
        # first plan, see ensure_schema_id); every job value is framed with it.
        self.schema_ids = schema_ids
        self.schema_id: int | None = None
        # Replaced as a whole (one attribute store) when the known queues change.
        self.rules = rules or JobRules.from_settings(settings)
        self.queue_lookup = queue_lookup
        self.topic = names(settings).timers
        self.placer = TimerPlacer(settings.wheel)
        self.recent = recent
        self.ids = ids
        self.max_record_bytes = max_record_bytes
        self.metrics = metrics
        self._budget_lookup = budgets
        # queue -> its budget, once known (the hot path looks here first)
        self.budgets: dict[str, JobBudget] = {}

    def budget_of(self, queue: str) -> JobBudget:
        """The size budget of ``queue`` (its topics' limits are read the first time)."""
        found = self.budgets.get(queue)
        if found is not None:
            return found
        if self._budget_lookup is not None:
            found = self._budget_lookup(queue)
        else:
            spec = _spec_of(self.settings, queue)
            found = JobBudget(
                default_limits(self.settings, spec, timers_max_bytes=self.max_record_bytes)
            )
        self.budgets[queue] = found
        return found

    def check_size(
        self,
        budget: JobBudget,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        payload: int,
    ) -> None:
        """Raise :class:`~dueflow.records.size_budget.RecordTooLarge` unless every
        hop of the job whose timer record is ``key``/``value``/``headers`` fits
        (the slow path: called for records above the budget's fast limit)."""
        refusal = budget.refusal(
            JobShape(
                len(key),
                len(value),
                header_bytes(headers),
                len(headers),
                len(hdr.header(headers, hdr.JOB_ID) or b""),
                len(hdr.header(headers, hdr.TASK) or b""),
                payload,
            )
        )
        if refusal is not None:
            raise refusal

    def ensure_schema_id(self) -> int | None:
        """The registry's id of job.avsc with the registry option on (asked for the
        first time: :class:`~dueflow.errors.SchemaRegistryError` when the registry
        does not answer), else None."""
        if self.schema_id is None and self.schema_ids is not None:
            self.schema_id = self.schema_ids()
        return self.schema_id

    def set_queues(self, queues: Iterable[str]) -> None:
        """The queues that exist changed (the registry was read)."""
        self.rules = self.rules.with_queues(queues)

    def routed(self, req: JobRequest) -> JobRequest:
        """``req`` with its queue resolved (by the route of its task when it has none)."""
        if req.queue is not None or type(req.task) is not str:
            return req
        return replace(req, queue=self.rules.router.queue_for(req.task))

    def check_queue(self, queue: object) -> None:
        """Raise :class:`~dueflow.errors.UnknownQueue` unless ``queue`` exists. A queue
        not known yet is looked up first (``queue_lookup``: the client reads the
        queue registry to its end, so a queue created a moment ago is found)."""
        if queue in self.rules.queues:
            return
        if type(queue) is str and self.queue_lookup is not None and self.queue_lookup(queue):
            return
        raise unknown_queue(queue, self.rules.queues)

    def plan(
        self,
        req: JobRequest,
        *,
        now_ms: int,
        trace_headers: Sequence[tuple[str, bytes]] = (),
    ) -> PlannedTimer | Scheduled:
        """The record to write for ``req``, or the earlier result of an idempotent repeat:
        :func:`prepare_job` (a queue it does not know is looked up: :meth:`check_queue`),
        then :func:`timer_record`.

        Raises :class:`InvalidInput` for bad input (payload too large included)
        and :class:`~dueflow.errors.ConflictError` for a job id this client
        scheduled with other content. A returned plan is claimed in the
        recent-jobs memory: call :meth:`failed` if writing it fails. With the
        registry option, the first plan asks the registry for the schema id
        (:meth:`ensure_schema_id`) and every value is framed.
        """
        if self.schema_ids is not None and self.schema_id is None:
            self.ensure_schema_id()
        try:
            job = prepare_job(
                req,
                now_ms=now_ms,
                rules=self.rules,
                new_job_id=self.ids.new,
                trace=_trace_map(trace_headers) if trace_headers else None,
                check_queue=self.check_queue,
            )
            queue = job.queue
            if req.expires is not None or req.max_lateness is not None:
                deadline = deadline_of(req, job.due_ms)
                if deadline is not None:  # the worker reads it (dueflow.rules.deadline)
                    trace_headers = [*trace_headers, (hdr.EXPIRES, b"%d" % deadline)]
            record = timer_record(
                job, now_ms=now_ms, placer=self.placer, trace_headers=trace_headers
            )
            if self.schema_id is not None:  # the registry option
                record = framed_timer(record, self.schema_id)
            partition, key_bytes, value, headers, size = record
            budget = self.budgets.get(queue) or self.budget_of(queue)
            if size > budget.fast_limit or trace_headers:
                self.check_size(budget, key_bytes, value, headers, len(job.payload))
            task = job.task
            earlier = self.recent.claim(
                job.job_id,
                (job.content_hash or "", job.due_ms, queue, task, job.idempotency_key, partition),
                task,
            )
        except (InvalidInput, ConflictError):
            self.count_error(self.rules.queue_of(req))
            raise
        if earlier is not None:
            return earlier
        return _new_tuple(PlannedTimer, (job, record))

    def delivered(self, queue: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.schedules_produced.labels(queue).inc(n)

    def failed(self, planned: PlannedTimer) -> None:
        """Forget a plan whose write failed, so that a retry writes it again."""
        self.recent.forget(planned.job.job_id)
        self.count_error(planned.job.queue)

    def count_error(self, queue: object, n: int = 1) -> None:
        if self.metrics is not None:
            label = queue if isinstance(queue, str) and queue in self.rules.queues else "unknown"
            self.metrics.schedule_errors.labels(label).inc(n)


class ScheduleSpan:
    """The ``dueflow.schedule`` span of one job (only made when tracing is on).

    The span names the job, so a request without a job id gets its id here,
    before planning. ``headers`` carry the span's context onto the timer
    record (and into the job's ``trace`` field); :meth:`end` closes it.
    """

    __slots__ = ("headers", "request", "step")

    def __init__(self, tracer: JobTracer, req: JobRequest, *, ids: JobIds, now_ms: int) -> None:
        if req.job_id is None:
            req = replace(req, job_id=ids.new(now_ms))
        self.request = req  # its queue resolved by the caller (the span names it)
        self.step = tracer.span_for_schedule(
            job_id=str(req.job_id), queue=str(req.queue), task=str(req.task)
        )
        self.headers = [(k, v) for k, v in self.step.headers if v is not None]

    def end(self, *, due_ms: int | None = None, error: BaseException | None = None) -> None:
        if due_ms is not None:
            self.step.set(due_ms=due_ms)
        if error is not None:
            self.step.fail(error)
        self.step.end()


def _spec_of(settings: Settings, queue: str) -> QueueSpec:
    """The static spec of ``queue``, or a default one (a registered queue: only
    its topic names matter to a default budget)."""
    for spec in settings.queues:
        if spec.name == queue:
            return spec
    return QueueSpec(queue)


def default_tracer() -> JobTracer:
    """The application's tracer provider when it installed one, else tracing off."""
    return JobTracer(trace.get_tracer_provider()) if tracing.enabled() else JobTracer()


def _trace_map(trace_headers: Sequence[tuple[str, bytes]]) -> Mapping[str, str]:
    return {k: v.decode("ascii", "replace") for k, v in trace_headers}


def check_timer_topic(
    admin: AdminClient,
    topic: str,
    *,
    partitions: int,
    shard_partitions: int | None = None,
    timeout_s: float = 15.0,
) -> int:
    """Check that ``topic`` exists with the wheel's partition count; return its
    ``max.message.bytes``. Raises a clear error otherwise.

    A topic with more shards than the settings say (``topics ensure`` ran with a
    larger ``wheel.shards``) is accepted: this client writes into the first
    ones only, which their emitters fire all the same.

    A topic created a moment ago may not be visible (or describable) yet:
    missing answers are retried for a few seconds before they count.
    """
    shard_partitions = shard_partitions or partitions
    deadline = time.monotonic() + timeout_s
    missing_since: float | None = None
    while True:
        try:
            md = admin.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(f"describe {topic}", exc) from exc
        found = md.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            now = time.monotonic()
            missing_since = now if missing_since is None else missing_since
            if now - missing_since > _SETTLE_S or now > deadline:
                raise KafkaOperationError(
                    f"topic {topic} does not exist: create dueflow's topics first "
                    "(`dueflow topics ensure`)"
                )
            time.sleep(0.1)
            continue
        have = len(found.partitions)
        if have % shard_partitions or have < partitions:
            raise TopicMismatch(
                f"topic {topic} has {have} partitions but the timing wheel of these "
                f"settings needs {partitions} ({partitions // shard_partitions} shards of "
                f"{shard_partitions}): the settings (wheel, wheel.shards) differ from those "
                "the topic was created with"
                + ("; run `dueflow topics ensure` to add the shards" if have < partitions else "")
            )
        try:
            return read_max_message_bytes(admin, topic, timeout_s=timeout_s)
        except KafkaOperationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# How long a topic may stay invisible before it counts as missing.
_SETTLE_S = 3.0


def read_max_message_bytes(admin: AdminClient, topic: str, *, timeout_s: float = 15.0) -> int:
    """``max.message.bytes`` of ``topic``; a clear error when the topic does not exist."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    futures = admin.describe_configs([resource], request_timeout=timeout_s)
    try:
        entries = futures[resource].result()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaOperationError(
                f"topic {topic} does not exist: create dueflow's topics first "
                "(`dueflow topics ensure`)",
                cause=exc,
            ) from exc
        raise kafka_error(f"describe configs of {topic}", exc) from exc
    entry = entries.get("max.message.bytes")
    return int(entry.value) if entry is not None and entry.value else DEFAULT_MAX_MESSAGE_BYTES


def delivery_error(what: str, err: KafkaError) -> KafkaOperationError:
    """A delivery report's error as a dueflow error (retriability kept)."""
    out = KafkaOperationError(f"{what}: {err.str()}", cause=KafkaException(err))
    out.retriable = bool(err.retriable())
    return out


def producer_settings(max_record_bytes: int) -> dict[str, Any]:
    """Producer overrides so that any record the topic accepts can be sent."""
    return {"message.max.bytes": max(1_000_000, max_record_bytes + 65_536)}
