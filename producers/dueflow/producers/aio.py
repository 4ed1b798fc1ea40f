"""The scheduling client for asyncio: the same calls as :class:`Scheduler`, awaited.

::

    async with AsyncScheduler(settings) as s:
        job = await s.schedule("send_email", {"to": "a@example.com"}, delay="10m")

Nothing blocks the event loop: a single job is produced from the loop and its
delivery report, served by a polling thread, resolves an asyncio future via
``loop.call_soon_threadsafe``; ``schedule_many`` and the cron calls, which
block by nature (bulk flush, reading the schedules topic), run in a worker
thread. Input checks, errors and results are exactly those of
:class:`~dueflow.producers.scheduler.Scheduler`, which this class wraps.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from dueflow.config import Settings
from dueflow.errors import DueflowError
from dueflow.kafka.fatal import served
from dueflow.model import Backoff
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import PlannedTimer, ScheduleSpan, delivery_error
from dueflow.producers.lookup import DEFAULT_SCAN_LIMIT
from dueflow.producers.recent import DEFAULT_CAPACITY
from dueflow.producers.results import BulkResult, Cancelled, Rescheduled, Scheduled
from dueflow.producers.scheduler import App, Scheduler
from dueflow.records.job_request import Duration, Instant, JobRequest
from dueflow.rules.cron import CronSchedule
from dueflow.rules.job_status import JobStatus
from dueflow.wall_clock import wall_ms


class _Future:
    """Delivery callback that resolves an asyncio future from the polling thread."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.loop.call_soon_threadsafe(self._resolve, err, msg.partition())

    def _resolve(self, err: KafkaError | None, partition: int | None) -> None:
        if self.future.done():  # cancelled by the caller meanwhile
            return
        if err is not None:
            self.future.set_exception(_DeliveryFailed(err))
        else:
            self.future.set_result(-1 if partition is None else partition)


class _DeliveryFailed(Exception):
    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


class AsyncScheduler:
    """Schedules jobs and cron schedules through Kafka from asyncio code."""

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
    ) -> None:
        self.sync = Scheduler(
            settings,
            metrics=metrics,
            clock=clock,
            random_bytes=random_bytes,
            recent_jobs=recent_jobs,
            delivery_timeout_s=delivery_timeout_s,
            producer_config=producer_config,
            tracer=tracer,
            scheduled_outcomes=scheduled_outcomes,
            status_scan_limit=status_scan_limit,
            app=app,
        )
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> AsyncScheduler:
        if self._poller is not None:
            return self
        await asyncio.to_thread(self.sync.start)
        self._stop.clear()
        producer = self.sync.producer
        self._poller = threading.Thread(
            target=self._poll_loop, args=(producer,), name="dueflow-scheduler-poll", daemon=True
        )
        self._poller.start()
        return self

    def _poll_loop(self, producer: Producer) -> None:
        while not self._stop.is_set():
            served(producer.poll, 0.1)

    async def close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            self._stop.set()
            await asyncio.to_thread(poller.join)
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncScheduler:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ one job
    async def schedule(
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
        timeout: Duration | None = None,  # noqa: ASYNC109 - the job's run time limit
        jitter: Duration | None = None,
        labels: Mapping[str, str] | None = None,
        expires: Instant | None = None,
        max_lateness: Duration | None = None,
    ) -> Scheduled:
        """See :meth:`Scheduler.schedule`."""
        return await self.schedule_request(
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

    async def schedule_request(self, req: JobRequest) -> Scheduled:
        """:meth:`schedule` for a prepared :class:`JobRequest`."""
        self._require_started()
        sync = self.sync
        planner = sync.planner
        req = planner.routed(req)
        if req.queue not in planner.rules.queues:
            # Not known yet: read the registry off the loop (raises UnknownQueue).
            try:
                await asyncio.to_thread(planner.check_queue, req.queue)
            except DueflowError:
                planner.count_error(req.queue)
                raise
        now_ms = sync.clock()
        span = None
        if sync.tracer.enabled:
            span = ScheduleSpan(sync.tracer, req, ids=planner.ids, now_ms=now_ms)
            req = span.request
        try:
            planned = planner.plan(req, now_ms=now_ms, trace_headers=span.headers if span else ())
            if isinstance(planned, Scheduled):
                result = planned
            else:
                result = await self._write_one(planned)
        except DueflowError as exc:
            if span is not None:
                span.end(error=exc)
            raise
        if span is not None:
            span.end(due_ms=result.due_ms)
        return result

    async def _write_one(self, planned: PlannedTimer) -> Scheduled:
        planner = self.sync.planner
        rec = planned.record
        try:
            await self._produce(planner.topic, rec.value, rec.key, rec.partition, rec.headers)
        except _DeliveryFailed as exc:
            planner.failed(planned)
            raise delivery_error(f"scheduling job {planned.job.job_id!r}", exc.err) from None
        except BaseException:
            planner.failed(planned)
            raise
        planner.delivered(planned.job.queue)
        if self.sync.scheduled_outcomes:
            self.sync.record_scheduled(planned)
        return planned.result()

    async def schedule_many(
        self, jobs: Iterable[JobRequest | Mapping[str, Any]], *, poll_every: int = 1000
    ) -> BulkResult:
        """See :meth:`Scheduler.schedule_many` (runs in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(self.sync.schedule_many, jobs, poll_every=poll_every)

    # ------------------------------------------------------------ where is it
    async def status(self, job_id: str) -> JobStatus | None:
        """See :meth:`Scheduler.status` (the scan runs in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(self.sync.status, job_id)

    # ------------------------------------------------------------ cancel
    async def cancel(
        self, job_id: str, *, queue: str | None = None, idempotency_key: str | None = None
    ) -> Cancelled:
        """See :meth:`Scheduler.cancel` (the lookup runs in a worker thread)."""
        self._require_started()
        records, cancelled = await asyncio.to_thread(
            functools.partial(
                self.sync.cancel_plan, job_id, queue=queue, idempotency_key=idempotency_key
            )
        )
        if not records:
            return cancelled
        results = await asyncio.gather(
            *(self._produce_record(rec) for rec in records), return_exceptions=True
        )
        for rec, res in zip(records, results, strict=True):
            if isinstance(res, _DeliveryFailed):
                raise delivery_error(f"cancelling job {job_id!r} ({rec.topic})", res.err)
            if isinstance(res, BaseException):
                raise res
        partition = results[0]
        assert isinstance(partition, int)
        return cancelled._replace(partition=partition)

    # ------------------------------------------------------------ reschedule
    async def reschedule(
        self,
        job_id: str,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
    ) -> Rescheduled:
        """See :meth:`Scheduler.reschedule` (runs in a worker thread: it reads Kafka)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.reschedule, job_id, run_at=run_at, delay=delay, queue=queue)
        )

    # ------------------------------------------------------------ cron
    async def add_schedule(self, schedule_id: str, **definition: Any) -> CronSchedule:
        """See :meth:`Scheduler.add_schedule` (same keywords; runs in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.add_schedule, schedule_id, **definition)
        )

    async def update_schedule(self, schedule_id: str, **changes: Any) -> CronSchedule:
        """See :meth:`Scheduler.update_schedule`."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.update_schedule, schedule_id, **changes)
        )

    async def pause_schedule(self, schedule_id: str) -> CronSchedule:
        self._require_started()
        return await asyncio.to_thread(self.sync.pause_schedule, schedule_id)

    async def resume_schedule(self, schedule_id: str) -> CronSchedule:
        self._require_started()
        return await asyncio.to_thread(self.sync.resume_schedule, schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        self._require_started()
        return await asyncio.to_thread(self.sync.delete_schedule, schedule_id)

    async def get_schedule(self, schedule_id: str) -> CronSchedule | None:
        self._require_started()
        return await asyncio.to_thread(self.sync.get_schedule, schedule_id)

    async def list_schedules(self, *, include_paused: bool = True) -> list[CronSchedule]:
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.list_schedules, include_paused=include_paused)
        )

    # ------------------------------------------------------------ plumbing
    def _require_started(self) -> None:
        if self._poller is None:
            raise DueflowError("the scheduler is not started: use `await start()` or `async with`")

    async def _produce_record(self, rec: OutgoingRecord) -> int:
        return await self._produce(rec.topic, rec.value, rec.key, rec.partition, rec.headers)

    async def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes,
        partition: int | None,
        headers: list[tuple[str, bytes]],
    ) -> int:
        """Produce one record from the loop; return its partition once acknowledged."""
        produce: Callable[..., None] = self.sync.producer.produce  # headers: bytes values
        waiter = _Future(asyncio.get_running_loop())
        while True:
            try:
                if partition is None:
                    produce(topic, value, key, on_delivery=waiter, headers=headers)
                else:
                    produce(topic, value, key, partition, on_delivery=waiter, headers=headers)
                break
            except BufferError:  # queue full: the polling thread drains it
                await asyncio.sleep(0.01)
        return await waiter.future
