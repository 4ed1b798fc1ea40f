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
from typing import Any, Unpack

from confluent_kafka import KafkaError, Message, Producer

from dueflow.config import Settings
from dueflow.errors import DueflowError, InvalidInput
from dueflow.kafka.fatal import served
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.producers.call_options import (
    CronChanges,
    CronDefinition,
    ScheduleOptions,
    schedule_call,
)
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import PlannedTimer, ScheduleSpan, delivery_error
from dueflow.producers.fan_in_commands import GroupScheduled
from dueflow.producers.lookup import DEFAULT_SCAN_LIMIT
from dueflow.producers.recent import DEFAULT_CAPACITY
from dueflow.producers.result_wait import await_result, check_timeout
from dueflow.producers.results import (
    BulkResult,
    Cancelled,
    JsonValue,
    Rescheduled,
    Scheduled,
    Updated,
)
from dueflow.producers.scheduler import App, Scheduler
from dueflow.records.job_request import Duration, Instant, JobRequest
from dueflow.rules.cron import CronSchedule
from dueflow.rules.job_status import JobStatus
from dueflow.wall_clock import wall_ms

# result(): the longest one look at the status view waits in a worker thread, so an
# await that is cancelled leaves its thread waiting for at most this long.
RESULT_WAIT_CHUNK_S = 5.0


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
        check_existing_ids: bool = False,
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
            check_existing_ids=check_existing_ids,
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
        self, task: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled:
        """See :meth:`Scheduler.schedule` (with ``unique_key=``, the admission is
        written and waited for in a worker thread)."""
        call = schedule_call("schedule", task, payload, options)
        if call.unique is None:
            return await self.schedule_request(call.request)
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(
                self.sync.schedule_unique,
                call.request,
                call.unique.spec,
                wait=call.admission_wait,
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
        if req.queue not in planner.budgets and isinstance(req.queue, str):
            # The queue's topic limits are read the first time: off the loop.
            await asyncio.to_thread(planner.budget_of, req.queue)
        if planner.schema_ids is not None and planner.schema_id is None:
            # The registry option: the first schedule asks for the id, off the loop.
            await asyncio.to_thread(planner.ensure_schema_id)
        now_ms = sync.clock()
        check = sync.check_existing_ids and req.job_id is not None
        span = None
        if sync.tracer.enabled:
            span = ScheduleSpan(sync.tracer, req, ids=planner.ids, now_ms=now_ms)
            req = span.request
        try:
            planned = planner.plan(req, now_ms=now_ms, trace_headers=span.headers if span else ())
            if isinstance(planned, Scheduled):
                result = planned
            else:
                earlier = await asyncio.to_thread(sync.existing, planned) if check else None
                result = earlier if earlier is not None else await self._write_one(planned)
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
        """See :meth:`Scheduler.status` (the lookup, an HTTP request to the status view
        or the fallback scan, runs in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(self.sync.status, job_id)

    # The same keyword as Scheduler.result: a job's wait, not the call's cancellation.
    async def result(self, job_id: str, *, timeout: float | None = 30.0) -> JsonValue:  # noqa: ASYNC109
        """See :meth:`Scheduler.result`: awaits the job's end (each lookup runs in a
        worker thread; cancelling the await stops the waiting)."""
        self._require_started()
        if not isinstance(job_id, str) or not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty string")
        timeout_s = check_timeout(timeout)
        sync = self.sync
        await asyncio.to_thread(sync._read_own_writes)

        ask = sync._result_lookup(job_id, chunk_s=RESULT_WAIT_CHUNK_S)

        async def lookup(budget: float) -> JobStatus | None:
            return await asyncio.to_thread(ask, budget)

        return await await_result(job_id, lookup, timeout_s)

    # ------------------------------------------------------------ cancel
    async def cancel(
        self,
        job_id: str,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> Cancelled:
        """See :meth:`Scheduler.cancel` (the lookup, the writes and the wait for the
        verdict run in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(
                self.sync.cancel,
                job_id,
                queue=queue,
                idempotency_key=idempotency_key,
                wait=wait,
            )
        )

    # ------------------------------------------------------------ reschedule
    async def reschedule(
        self,
        job_id: str,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Rescheduled:
        """See :meth:`Scheduler.reschedule` (runs in a worker thread: it reads Kafka)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(
                self.sync.reschedule, job_id, run_at=run_at, delay=delay, queue=queue, wait=wait
            )
        )

    # ------------------------------------------------------------ update
    async def update(
        self,
        job_id: str,
        *,
        payload: Any,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Updated:
        """See :meth:`Scheduler.update` (runs in a worker thread: it reads Kafka)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(
                self.sync.update,
                job_id,
                payload=payload,
                run_at=run_at,
                delay=delay,
                queue=queue,
                wait=wait,
            )
        )

    # ------------------------------------------------------------ fan-in
    async def group(
        self,
        members: Iterable[JobRequest | Mapping[str, Any]],
        *,
        then: JobRequest | Mapping[str, Any],
        group_id: str | None = None,
    ) -> GroupScheduled:
        """See :meth:`Scheduler.group` (runs in a worker thread: it waits for the broker)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.group, list(members), then=then, group_id=group_id)
        )

    # ------------------------------------------------------------ cron
    async def add_schedule(
        self, schedule_id: str, **definition: Unpack[CronDefinition]
    ) -> CronSchedule:
        """See :meth:`Scheduler.add_schedule` (same keywords; runs in a worker thread)."""
        self._require_started()
        return await asyncio.to_thread(
            functools.partial(self.sync.add_schedule, schedule_id, **definition)
        )

    async def update_schedule(
        self, schedule_id: str, **changes: Unpack[CronChanges]
    ) -> CronSchedule:
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
