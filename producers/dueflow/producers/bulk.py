"""``schedule_many``: many timer records through one producer, errors per job.

One pass over the input: each job is checked and planned completely (its
record built, every limit checked) before it is produced; a bad job becomes a
:class:`BulkError` at its index, nothing of it is written, and the rest go on.
The delivery callback runs only for failures (the bulk producer is
configured with ``delivery.report.only.error``): each names its job through
the job id at the start of the record value and is mapped back to the input
index at the end. confluent-kafka applies that setting in its own layer, so
``poll``/``flush`` still serve a report for every record (taking the GIL for
each), as for any producer: a success costs a ``produce`` call and that,
whether or not a callback is given.

With ``scheduled`` outcomes on, the planner builds each job's outcome record
with its timer record; they are produced once the timers are acknowledged:
after the last job, or every :data:`OUTCOMES_PER_FLUSH` jobs (the producer is
flushed first), so what a call holds stays bounded whatever its input.

This loop is the hot path of the 100k-jobs/s goal: it binds methods to
locals and avoids per-job objects on purpose; :class:`BulkPlanner` plans
each job with what repeats between jobs computed once per call, and
``produce`` gets positional arguments (keywords cost about 0.5 us a call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dueflow.errors import ConflictError, DueflowError, InvalidInput, KafkaOperationError
from dueflow.headers import CONTENT_HASH
from dueflow.kafka.clients import kafka_error
from dueflow.kafka.fatal import served
from dueflow.kafka.topics import names
from dueflow.observability.tracing import JobTracer
from dueflow.producers.bulk_plan import BulkPlanner, Plan
from dueflow.producers.core import ScheduleSpan, TimerPlanner, delivery_error
from dueflow.producers.outcomes import SCHEMA_HEADER as OUTCOME_SCHEMA
from dueflow.producers.outcomes import OutcomeReports
from dueflow.producers.results import BulkError, BulkResult, Scheduled
from dueflow.records.job_binary import leading_strings
from dueflow.records.job_request import JobRequest, as_request

# With `scheduled` outcomes: the jobs whose outcomes a call holds at most before it
# flushes the producer and writes them (about 40 MB of records).
OUTCOMES_PER_FLUSH = 100_000


class BulkDeliveries:
    """Delivery callback of one ``schedule_many`` call: keeps only the failures."""

    __slots__ = ("failures",)

    def __init__(self) -> None:
        self.failures: list[tuple[str, str, KafkaError]] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            # Headers are not kept in delivery reports; the value starts with
            # the job id and the queue (job.avsc), so read those two strings.
            try:
                job_id, queue = leading_strings(msg.value() or b"", 2)
            except (ValueError, UnicodeDecodeError):
                job_id, queue = "", ""
            self.failures.append((job_id, queue, err))


class BulkRun:
    """One ``schedule_many`` call."""

    def __init__(
        self,
        planner: TimerPlanner,
        producer: Producer,
        *,
        clock: Callable[[], int],
        poll_every: int = 1000,
        tracer: JobTracer | None = None,
        outcome_reports: OutcomeReports | None = None,
    ) -> None:
        self.planner = planner
        self.producer = producer
        self.clock = clock
        self.poll_every = max(1, poll_every)
        self.result = BulkResult()
        self.deliveries = BulkDeliveries()
        # With `scheduled` outcomes on, the planner keeps each produced job's outcome
        # record; they are written once the timers are acknowledged.
        self.bulk = BulkPlanner(planner, outcomes=outcome_reports is not None)
        self.per_queue: dict[str, int] = {}
        self.tracer = tracer or JobTracer()
        self.outcome_reports = outcome_reports
        self._reported = 0  # delivery failures already told to the outcome writer

    def run(
        self, jobs: Iterable[JobRequest | Mapping[str, Any]], *, flush_timeout_s: float
    ) -> BulkResult:
        """Plan and produce every job, wait for the broker, return the result."""
        result = self.result
        ids = result.job_ids
        dues = result.due_ms
        per_queue = self.per_queue
        deliveries = self.deliveries
        produce: Callable[..., None] = self.producer.produce  # headers: bytes values
        poll = self.producer.poll
        bulk = self.bulk
        plan = bulk.plan
        clock = self.clock
        topic = self.planner.topic
        poll_every = self.poll_every
        traced = self.tracer.enabled
        outcomes = bulk.outcomes
        produced = 0
        index = -1
        for index, item in enumerate(jobs):
            span = None
            try:
                req = item if type(item) is JobRequest else as_request(item, field=f"jobs[{index}]")
                if traced:
                    now_ms = clock()
                    req = self.planner.routed(req)  # the span names the queue
                    span = ScheduleSpan(self.tracer, req, ids=self.planner.ids, now_ms=now_ms)
                    planned = self._plan_traced(span, now_ms)
                else:
                    planned = plan(req, clock())
            except (InvalidInput, ConflictError) as exc:
                self._reject(index, _job_id_of(item), exc, span)
                continue
            if isinstance(planned, Scheduled):  # an idempotent repeat: nothing to write
                result.duplicates += 1
                job_id, due_ms = planned.job_id, planned.due_ms
            else:
                job_id, due_ms, queue, _, _, partition, key_bytes, value, headers, _ = planned
                try:
                    # positional (topic, value, key, partition, callback,
                    # on_delivery, timestamp, headers): cheaper than keywords
                    produce(topic, value, key_bytes, partition, deliveries, None, 0, headers)
                    refused = None
                except BufferError:  # the producer queue is full: let it drain
                    refused = self._produce_when_full(partition, key_bytes, value, headers)
                except KafkaException as exc:  # refused at once (e.g. unknown partition)
                    refused = exc
                if refused is not None:
                    bulk.failed(job_id, queue)
                    error = kafka_error(f"producing to {topic}", refused)
                    self._reject(index, job_id, error, span)
                    continue
                produced += 1
                if produced % poll_every == 0:
                    poll(0)
                    bulk.remember()
                    if outcomes is not None and len(outcomes) >= OUTCOMES_PER_FLUSH:
                        self._flush(flush_timeout_s)
                        self._write_outcomes()
                per_queue[queue] = per_queue.get(queue, 0) + 1
            ids.append(job_id)
            dues.append(due_ms)
            if span is not None:
                span.end(due_ms=due_ms)
        result.total = index + 1
        bulk.remember()
        self._flush(flush_timeout_s)
        if outcomes:
            self._write_outcomes()
            served(self.producer.flush, flush_timeout_s)
        self._settle()
        return result

    def _flush(self, timeout_s: float) -> None:
        """Wait until every record produced is acknowledged or failed."""
        remaining = served(self.producer.flush, timeout_s)
        if remaining:
            raise KafkaOperationError(
                f"{remaining} records still unacknowledged after {timeout_s:.0f}s"
            )

    def _produce_when_full(
        self, partition: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
    ) -> KafkaException | None:
        """Produce once the producer has room (serving its reports meanwhile);
        the error if it refuses the record."""
        produce: Callable[..., None] = self.producer.produce  # headers: bytes values
        topic = self.planner.topic
        while True:
            served(self.producer.poll, 0.05)
            try:
                produce(topic, value, key, partition, self.deliveries, None, 0, headers)
                return None
            except BufferError:
                continue
            except KafkaException as exc:
                return exc

    def _plan_traced(self, span: ScheduleSpan, now_ms: int) -> Plan | Scheduled:
        planned = self.planner.plan(span.request, now_ms=now_ms, trace_headers=span.headers)
        return self.bulk.general(planned)

    def _write_outcomes(self) -> None:
        """Produce the ``scheduled`` outcomes the planner holds: their timers are
        acknowledged (the producer was flushed), but for those that failed."""
        outcomes = self.bulk.outcomes
        if not outcomes:
            return
        failures = self.deliveries.failures
        failed = {job_id.encode() for job_id, _queue, _err in failures[self._reported :]}
        self._reported = len(failures)
        topic = names(self.planner.settings).outcomes
        produce: Callable[..., None] = self.producer.produce  # headers: bytes values
        reports = self.outcome_reports
        schema = OUTCOME_SCHEMA
        for key, value, chash in outcomes:
            if failed and key in failed:
                continue
            headers = [schema, (CONTENT_HASH, chash)] if chash else [schema]
            try:
                # positional (topic, value, key, partition, callback, on_delivery,
                # timestamp, headers), as for the timers: one per job
                produce(topic, value, key, -1, reports, None, 0, headers)
            except BufferError:  # the producer queue is full: let it drain
                while True:
                    served(self.producer.poll, 0.05)
                    try:
                        produce(topic, value, key, -1, reports, None, 0, headers)
                        break
                    except BufferError:
                        continue
        outcomes.clear()

    def _reject(
        self, index: int, job_id: str | None, error: DueflowError, span: ScheduleSpan | None
    ) -> None:
        self.result.errors.append(BulkError(index, job_id, error))
        self.result.job_ids.append(None)
        self.result.due_ms.append(None)
        if span is not None:
            span.end(error=error)

    def _settle(self) -> None:
        """Turn failed delivery reports into per-job errors; count what was written."""
        result, per_queue, planner = self.result, self.per_queue, self.planner
        failures = self.deliveries.failures
        result.scheduled = sum(per_queue.values()) - len(failures)
        if failures:
            where = {job_id: i for i, job_id in enumerate(result.job_ids) if job_id is not None}
            for job_id, queue, err in failures:
                index = where.get(job_id, -1)
                planner.recent.forget(job_id)
                planner.count_error(queue)
                per_queue[queue] = per_queue.get(queue, 0) - 1
                if index >= 0:
                    result.job_ids[index] = None
                    result.due_ms[index] = None
                result.errors.append(
                    BulkError(index, job_id, delivery_error(f"scheduling job {job_id!r}", err))
                )
        result.errors.sort(key=lambda e: e.index)
        for queue, n in per_queue.items():
            if n > 0:
                planner.delivered(queue, n)


def _job_id_of(item: object) -> str | None:
    if isinstance(item, JobRequest):
        return item.job_id
    if isinstance(item, Mapping):
        value = item.get("job_id")
        return value if isinstance(value, str) else None
    return None
