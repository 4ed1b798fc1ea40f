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
:mod:`dueflow.producers.recent`. With ``check_existing_ids=True``, ``schedule``
also looks a job id it does not remember up in the cluster, so a reuse from
another process is told too (:mod:`dueflow.producers.existing`).

Thread-safe: one instance may be shared by threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Unpack

from dueflow.errors import ConflictError, DueflowError, InvalidInput
from dueflow.observability import tracing
from dueflow.producers.bulk import BulkRun
from dueflow.producers.call_options import ScheduleOptions, schedule_call
from dueflow.producers.core import PlannedTimer, ScheduleSpan, delivery_error
from dueflow.producers.cron_calls import CronCalls
from dueflow.producers.existing import existing_job
from dueflow.producers.job_control import JobControl
from dueflow.producers.lookup import ViewLookup
from dueflow.producers.outcomes import scheduled_outcome
from dueflow.producers.result_wait import check_timeout, wait_for_result
from dueflow.producers.results import BulkResult, JsonValue, Scheduled
from dueflow.producers.scheduler_base import BULK_PRODUCER as BULK_PRODUCER
from dueflow.producers.scheduler_base import App as App
from dueflow.producers.scheduler_base import Delivery as Delivery
from dueflow.producers.scheduler_base import declared_queues as declared_queues
from dueflow.producers.unique_calls import UniqueCalls
from dueflow.records.job_request import JobRequest
from dueflow.rules.job_status import JobStatus
from dueflow.rules.unique import UniqueSpec


class Scheduler(JobControl, CronCalls):
    """Schedules jobs and cron schedules through Kafka (blocking calls)."""

    # ------------------------------------------------------------ one job
    def schedule(
        self, task: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled:
        """Schedule ``task(payload)`` at ``run_at``, after ``delay``, or now, on
        ``queue`` (default: where the task is routed, see the module doc).

        The keywords (all optional): ``run_at``, ``delay``, ``queue``, ``job_id``,
        ``idempotency_key``, ``max_attempts``, ``backoff``, ``timeout``,
        ``jitter``, ``labels`` (as :class:`JobRequest` takes them), ``expires``,
        ``max_lateness``, and the unique key's ``unique_key``, ``unique_for``,
        ``unique_until``, ``on_duplicate``, ``debounce``, ``admission_wait``
        (:class:`~dueflow.producers.call_options.ScheduleOptions`). Another keyword
        raises :class:`~dueflow.records.job_options.UnknownKeyword` naming it.

        ``expires`` (an instant) / ``max_lateness`` (a duration after the due
        time): a job not started by then is not run, outcome ``expired``
        (:mod:`dueflow.rules.deadline`).

        ``unique_key``: at most one job holds the key at a time (a finalized
        queue only; docs/scheduling.md, "Unique and debounced jobs"): it is
        held for ``unique_for`` from the admission, or (without it) until the
        job ends (``unique_until="end"``, the default) or starts (``"start"``).
        A job scheduled while the key is held is not scheduled: per
        ``on_duplicate``, the call returns the holder's id (``"return"``, the
        default; ``duplicate=True``), raises :class:`~dueflow.errors.DuplicateJob`
        (``"refuse"``), or replaces the holder's payload and due time if it has
        not started (``"replace"``). ``debounce="5s"``: the job is due 5 s after
        the call, and every call with the key before it starts replaces it.
        The worker that owns the key decides; the call waits up to
        ``admission_wait`` seconds for its verdict (``pending_admission=True``
        when none came: the request stands).

        Returns the job id and the UTC due time (jitter applied) once the
        broker has the timer. Raises :class:`InvalidInput` (nothing written;
        :class:`~dueflow.errors.UnknownQueue` for a queue that does not exist),
        :class:`ConflictError`, or :class:`KafkaOperationError` when the
        broker did not take the record.
        """
        call = schedule_call("schedule", task, payload, options)
        if call.unique is None:
            return self.schedule_request(call.request)
        return self.schedule_unique(call.request, call.unique.spec, wait=call.admission_wait)

    def schedule_unique(self, req: JobRequest, spec: UniqueSpec, *, wait: float) -> Scheduled:
        """:meth:`schedule` of a prepared request under unique key ``spec`` (see
        :mod:`dueflow.producers.unique_calls`)."""
        if not isinstance(wait, int | float) or isinstance(wait, bool) or not 0 <= wait <= 3600:
            raise InvalidInput("admission_wait", wait, "seconds from 0 to 3600")
        planner = self.planner
        planned = planner.plan(planner.routed(req), now_ms=self.clock())
        if isinstance(planned, Scheduled):
            return planned  # this client asked for this very job already
        queue = planned.job.queue
        try:
            if not self._steerable(queue):
                raise InvalidInput(
                    "unique_key",
                    spec.key,
                    f"a job on a finalized queue: its workers decide who holds a key "
                    f"(`dueflow queue finalize {queue}` once they all run this release)",
                )
            if self._verdicts is None:
                raise DueflowError("the scheduler is not started: use start() or `with`")
            calls = UniqueCalls(self, verdicts=self._verdicts, new_id=planner.ids.new)
            result = calls.admit(planned, spec, wait=float(wait))
        except BaseException:
            planner.failed(planned)
            raise
        planner.delivered(queue)
        if result.job_id != planned.job.job_id:
            planner.recent.forget(planned.job.job_id)  # not scheduled: a duplicate
        self._after_unique()
        return result

    def _after_unique(self) -> None:
        """Called after an admission (the in-memory client runs jobs there when eager)."""

    def schedule_request(self, req: JobRequest) -> Scheduled:
        """:meth:`schedule` for a prepared :class:`JobRequest`."""
        planner, now_ms = self.planner, self.clock()
        check = self.check_existing_ids and req.job_id is not None
        if not self.tracer.enabled:
            planned = planner.plan(req, now_ms=now_ms)
            if isinstance(planned, Scheduled):
                return planned
            earlier = self.existing(planned) if check else None
            return earlier if earlier is not None else self._write_one(planned)
        span = ScheduleSpan(self.tracer, planner.routed(req), ids=planner.ids, now_ms=now_ms)
        try:
            planned = planner.plan(span.request, now_ms=now_ms, trace_headers=span.headers)
            if isinstance(planned, Scheduled):
                result = planned
            else:
                earlier = self.existing(planned) if check else None
                result = earlier if earlier is not None else self._write_one(planned)
        except DueflowError as exc:
            span.end(error=exc)
            raise
        span.end(due_ms=result.due_ms)
        return result

    def existing(self, planned: PlannedTimer) -> Scheduled | None:
        """The job already in the cluster under ``planned``'s id, when it is the same
        job (``duplicate=True``: write nothing); ``None`` when there is none; raises
        :class:`~dueflow.errors.ConflictError` for one with other content
        (:func:`~dueflow.producers.existing.existing_job`). Looks the id up by its
        outcomes (blocking); on an error the plan is forgotten, nothing is written."""
        job = planned.job
        try:
            self._read_own_writes()
            lookup = self.lookup  # what the cluster knows: not this client's own memory
            found = (
                lookup.cluster_status(job.job_id)
                if isinstance(lookup, ViewLookup)
                else lookup.status(job.job_id)
            )
            return existing_job(
                found,
                content_hash=job.content_hash or "",
                task=job.task,
            )
        except BaseException as exc:
            self.planner.recent.forget(job.job_id)
            if isinstance(exc, ConflictError):
                self.planner.count_error(job.queue)
            raise

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
            at_ms=job.created_ms,  # written then: before it can fire, however late the ack
            trace_id=tracing.trace_id_of(planned.record.headers),
            schedule_id=job.schedule_id,
            content_hash=job.content_hash,
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
        acknowledged or failed; see :class:`BulkResult`. With the schema registry
        option, a registry that cannot be reached raises
        :class:`~dueflow.errors.SchemaRegistryError` before any job is taken.
        """
        producer = self._bulk_producer
        if producer is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        # The registry option: a registry that cannot be reached fails the call
        # (SchemaRegistryError) before any job is taken, not each job of it.
        self.planner.ensure_schema_id()
        run = BulkRun(
            self.planner,
            producer,
            clock=self.clock,
            poll_every=poll_every,
            tracer=self.tracer,
            outcome_reports=self.outcome_reports if self.scheduled_outcomes else None,
        )
        return run.run(jobs, flush_timeout_s=self.delivery_timeout_s + 30.0)

    def status(self, job_id: str) -> JobStatus | None:
        """Where job ``job_id`` is: state (``scheduled`` while it waits for its due
        time), queue, task, due time, attempts, last outcome and error; None when
        no outcome of it is known.

        Asked of the status view (``observability.status_url``), which knows every
        job from its ``scheduled`` outcome (written for every job unless
        ``scheduled_outcomes=False``) until it ends, at any horizon, and an ended
        job for ``observability.status_retention_ms``. When the view does not
        answer, read from the newest ``status_scan_limit`` records of the one
        outcomes partition the id hashes to: ``status.source`` is then
        ``"kafka-scan"`` and ``status.complete`` False when older records were
        not read (see :mod:`dueflow.producers.lookup`). ``status.pending`` is
        True until a worker takes the job; ``status.running`` while an attempt
        has run for a second or reports progress (``status.progress``,
        ``status.progress_detail``); a finished job's ``status.result`` is what
        its handler returned.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty string")
        self._read_own_writes()
        return self.lookup.status(job_id)

    def result(self, job_id: str, *, timeout: float | None = 30.0) -> JsonValue:
        """The result of job ``job_id``: what its handler returned (JSON's value), once
        the job has succeeded; waits for it at most ``timeout`` seconds (None: no
        limit).

        Raises :class:`~dueflow.errors.JobFailed` when the job is dead (``error_type``,
        ``error``, ``attempts``), :class:`~dueflow.errors.JobCancelled`,
        :class:`~dueflow.errors.JobNotRun` when it expired or was skipped,
        :class:`~dueflow.errors.ResultNotKept` when it succeeded but its value was
        not kept (not JSON, over ``worker.result_max_bytes``), and
        :class:`~dueflow.errors.ResultTimeout` when it has not ended in time (or no
        outcome of it is found). A handler that returned None gives None. Asked of
        the status view's long poll (it answers when it folds the job's end), else
        as :meth:`status` finds the job without the view, asked again until it has
        ended.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty string")
        timeout_s = check_timeout(timeout)
        self._read_own_writes()
        return wait_for_result(job_id, self._result_lookup(job_id), timeout_s)

    def _result_lookup(
        self, job_id: str, *, chunk_s: float | None = None
    ) -> Callable[[float], JobStatus | None]:
        """How :meth:`result` looks ``job_id`` up, given the time one look may take:
        the status view's long poll, which answers as soon as the view folds the
        job's end (the scan when the view does not answer); without a view (the
        in-memory pipeline's lookup), :meth:`status`'s lookup, asked again.
        ``chunk_s``: the longest one look waits (an awaiting caller's thread)."""
        lookup = self.lookup
        if isinstance(lookup, ViewLookup):
            view = lookup

            def ask(budget: float) -> JobStatus | None:
                wait_s = budget if chunk_s is None else min(budget, chunk_s)
                return view.final_status(job_id, wait_s=wait_s)

            return ask
        return lambda budget: lookup.status(job_id, timeout_s=budget)
