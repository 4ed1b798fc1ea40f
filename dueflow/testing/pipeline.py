"""The whole pipeline in one process, on a fake clock: scheduler, emitter, worker.

::

    pipeline = InMemoryPipeline([send_invoice])
    job = pipeline.scheduler.schedule("send-invoice", {"id": 7}, delay="10m")
    pipeline.advance(minutes=10)          # runs it at its due time
    assert pipeline.job(job.job_id).state == "succeeded"

Three ways to run what is scheduled:

- ``advance(...)`` / ``run_until(instant)``: time moves forward and every job,
  retry and cron occurrence runs at its own due time on the way, as on a
  healthy cluster;
- ``clock.advance(...)`` then ``run_due()``: time jumps and nothing runs
  meanwhile, as if every process were down; ``run_due`` then runs what came
  due, late, and cron schedules apply their misfire policy;
- ``run_until_idle()``: like ``advance`` up to the moment no job or retry is
  left (cron occurrences alone do not keep it going);

or ``eager=True``: every ``schedule`` call runs its job, and its retries,
before it returns, whatever their due times (Celery's ``task_always_eager``);
the runs still record their due times. Cron occurrences are not eager (each
one places the next: they run on the clock).

Follow-ups a handler schedules (``ctx.schedule``) are written with its
success and run at their due times like any job (eagerly too). Lifecycle
hooks in ``tasks``: ``@on_startup`` ones run when the pipeline is made,
``@on_failure`` after each failed attempt, ``@on_shutdown`` at :meth:`close`
(:mod:`dueflow.testing.hooks`).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from dueflow import headers as hdr
from dueflow.apps.ops.dlq import DeadLetterEntry, decode_entry
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.hooks import WorkerInfo, hook_kind
from dueflow.consumers.registry import TaskRegistry, spec_of
from dueflow.errors import DueflowError
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.rules.job_state import JobView, apply_outcome, header_ms
from dueflow.testing.clock import FakeClock, _instant_ms
from dueflow.testing.emitter import MemoryEmitter, PendingTimer, Quarantined
from dueflow.testing.hooks import HookError
from dueflow.testing.log import MemoryLog, MemoryRecord
from dueflow.testing.scheduler import InMemoryScheduler
from dueflow.testing.views import JobRun, JobState, PendingJob
from dueflow.testing.worker import WORKER_ID, InMemoryWorker

Handler = Callable[..., Any]


class RunawayJobs(DueflowError):
    """More runs than ``max_runs`` in one call: a job that schedules itself again
    without end, most likely."""


class InMemoryPipeline:
    """Scheduler, emitter and worker of dueflow over an in-memory log (no broker, no Java).

    ``tasks``: ``@task`` functions or module names (as ``dueflow worker --app``).
    ``settings``: the cluster's settings (queues, retry tiers, worker defaults);
    by default the queues the tasks name, plus ``default``, with the
    defaults of :class:`~dueflow.config.QueueSpec`. ``queues``: the queues the
    worker consumes (default: those the tasks name, as ``dueflow worker``).
    ``seed`` makes job ids and backoff jitter the same on every run.
    """

    def __init__(
        self,
        tasks: Iterable[Handler | str] = (),
        *,
        settings: Settings | None = None,
        queues: Sequence[str] | None = None,
        clock: FakeClock | None = None,
        start: datetime | str | int | None = None,
        eager: bool = False,
        seed: int | str = 0,
        max_runs: int = 10_000,
    ) -> None:
        if clock is not None and start is not None:
            raise DueflowError("give clock or start, not both")
        self.clock = clock if clock is not None else FakeClock(start)
        self.eager = eager
        self.max_runs = max_runs
        self.registry = TaskRegistry()
        _register(self.registry, tasks)
        self._own_settings = settings is None
        self.settings = settings.validate() if settings is not None else self._settings()
        self.metrics = Metrics()
        ids = random.Random(f"{seed}:ids")
        self.log = MemoryLog(self.settings, clock=self.clock)
        self.scheduler = InMemoryScheduler(
            self.settings,
            log=self.log,
            clock=self.clock,
            random_bytes=ids.randbytes,
            after_write=self._after_write,
            on_record=self._on_record,
            app=self.registry,  # jobs without a queue go where their @task says
        ).start()
        self.emitter = MemoryEmitter(self.settings, self.log, metrics=self.metrics)
        self.worker = InMemoryWorker(
            self.settings,
            self.registry,
            self.log,
            clock=self.clock,
            rng=random.Random(f"{seed}:backoff"),
            metrics=self.metrics,
            queues=queues,
        )
        self._history: list[JobRun] = []
        self._running = threading.Event()
        self._closed = False
        try:
            self.worker.hooks.startup(self._worker_info())
        except BaseException:
            self.worker.close()
            raise

    # ------------------------------------------------------------ setup
    def register(self, *tasks: Handler | str) -> None:
        """Add ``@task`` functions (or modules of them); their queues are added to
        the settings the pipeline made (given settings must configure them)."""
        _register(self.registry, tasks)
        if self._own_settings:
            self.settings = self._settings()
            now = self.clock()
            self.log.configure(self.settings)
            self.scheduler.reconfigure(self.settings)
            self.emitter.configure(self.settings, now_ms=now)
        else:
            self.scheduler.reconfigure(self.settings)  # the new tasks' routes
        self.worker.configure(self.settings, self.registry)
        self.worker.hooks.startup(self._worker_info())  # the startup hooks added now

    def _worker_info(self) -> WorkerInfo:
        tasks = tuple(sorted(t.spec.name for t in self.registry))
        return WorkerInfo(WORKER_ID, tuple(self.worker.queues), tasks)

    @property
    def hook_errors(self) -> list[HookError]:
        """Hook calls that raised (they are logged and counted, as on a worker)."""
        return list(self.worker.hooks.errors)

    def _settings(self) -> Settings:
        queues = dict.fromkeys(["default", *self.registry.queues])
        return Settings(queues=tuple(QueueSpec(q) for q in queues)).validate()

    def close(self) -> None:
        """Run the shutdown hooks and stop the event loop of async handlers (a pytest
        fixture does it for you)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.worker.hooks.shutdown(self._worker_info())
        finally:
            self.worker.close()

    def __enter__(self) -> InMemoryPipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ running
    def run_due(self) -> list[JobRun]:
        """Fire the timers due now and run every delivery due now, until none is left
        (a retry due now, a job a handler scheduled for now); return what ran."""
        return self._run(eager=False)

    def run_until(self, instant: datetime | str | int) -> list[JobRun]:
        """Move the clock to ``instant``, running everything at its own due time on
        the way (each due time in turn, in order); return what ran."""
        target = _instant_ms(instant, "instant")
        if target < self.clock():
            raise DueflowError(f"instant {instant!r} is before now ({self.clock.now})")
        out = self.run_due()
        while True:
            nxt = self._next_due(jobs_only=False)
            if nxt is None or nxt > target:
                break
            self.clock.set(max(nxt, self.clock()))
            out += self._run(eager=False, budget=self.max_runs - len(out))
        self.clock.set(max(target, self.clock()))
        return out + self._run(eager=False, budget=self.max_runs - len(out))

    def advance(
        self,
        seconds: float = 0,
        *,
        minutes: float = 0,
        hours: float = 0,
        days: float = 0,
        ms: int = 0,
    ) -> list[JobRun]:
        """:meth:`run_until` now plus this much."""
        probe = FakeClock(self.clock())
        target = probe.advance(seconds, minutes=minutes, hours=hours, days=days, ms=ms)
        return self.run_until(target)

    def run_until_idle(self) -> list[JobRun]:
        """Run until no job or retry is pending, moving the clock to each due time
        (cron occurrences on the way run too; they alone do not keep it going).
        Jobs in a queue no worker consumes never run: see :meth:`pending`."""
        out = self.run_due()
        while True:
            work = self._next_due(jobs_only=True)
            if work is None:
                return out
            nxt = self._next_due(jobs_only=False)
            due = work if nxt is None else min(work, nxt)
            self.clock.set(max(due, self.clock()))
            out += self._run(eager=False, budget=self.max_runs - len(out))

    def _next_due(self, *, jobs_only: bool) -> int | None:
        dues = (self.emitter.next_due(jobs_only=jobs_only), self.worker.next_due())
        found = [d for d in dues if d is not None]
        return min(found) if found else None

    def _on_record(self, record: MemoryRecord) -> None:
        # A running emitter reads a schedule change at once: it places the next
        # occurrence after the time of the change, not after the next run_due.
        if record.topic() == names(self.settings).schedules:
            self.emitter.poll(self.clock())
        # The worker applies a command (cancel, move, update) as soon as it is
        # written: the call that wrote it can read the verdict.
        elif hdr.is_command(record.headers()):
            self.worker.poll(self.clock())

    def _after_write(self) -> None:
        if self.eager and not self._running.is_set():
            self._run(eager=True)

    def _run(self, *, eager: bool, budget: int | None = None) -> list[JobRun]:
        if self._running.is_set():
            raise DueflowError(
                "the pipeline is running already: a handler cannot run it (schedule jobs "
                "from a handler: they run when the call that runs this one gets to them)"
            )
        budget = self.max_runs if budget is None else budget
        self._running.set()
        out: list[JobRun] = []
        try:
            while True:
                now = self.clock()
                self.emitter.fire_due(now, eager=eager)
                self.worker.poll(now)
                run = self.worker.run_next(now, ignore_due=eager)
                if run is None:
                    if self._timers_written(now, eager=eager):
                        continue  # a command the worker applied wrote a due timer
                    return out
                out.append(run)
                self._history.append(run)
                if len(out) > budget:
                    raise RunawayJobs(
                        f"more than {self.max_runs} runs in one call (the last: {run!r}): "
                        "a job that schedules itself again without end? (max_runs=)"
                    )
        finally:
            self._running.clear()

    def _timers_written(self, now_ms: int, *, eager: bool) -> bool:
        """Whether the worker wrote timers that are due now (a group's callback, a
        member's end on its way to its group) since the emitter last fired."""
        self.emitter.poll(now_ms)
        due = self.emitter.next_due(jobs_only=eager)
        return due is not None and (eager or due <= now_ms)

    # ------------------------------------------------------------ inspection
    @property
    def history(self) -> list[JobRun]:
        """Every decision of the worker, in order: attempts that ran, and deliveries
        that did not run (``duplicate``, ``cancelled``, dead before running)."""
        return list(self._history)

    def runs(self, job_id: str | None = None, *, task: str | None = None) -> list[JobRun]:
        """The attempts that ran (a handler was called), in order; of one job or task."""
        return [
            r
            for r in self._history
            if r.ran and (job_id is None or r.job_id == job_id) and (task is None or r.task == task)
        ]

    def pending(self, job_id: str | None = None) -> list[PendingJob]:
        """Jobs waiting: timers not due (``timer``), fired and not taken (``exec``),
        retries not due (``retry``), by due time; with ``consumed=False`` those in a
        queue no worker of this pipeline reads."""
        self.emitter.poll(self.clock())
        self.worker.poll(self.clock())
        consumed = set(self.worker.queues)
        out = [_pending_timer(t, consumed) for t in self.emitter.pending()]
        out += self.worker.pending()
        out += self._stranded(consumed)
        out.sort(key=lambda p: p.due_ms)
        return [p for p in out if job_id is None or p.job_id == job_id]

    def _stranded(self, consumed: set[str]) -> list[PendingJob]:
        n = names(self.settings)
        out = []
        for q in self.settings.queues:
            if q.name in consumed:
                continue
            for topic in (n.exec(q.name), *(n.retry(q.name, t) for t in q.retry_tiers_ms)):
                for record in self.log.records(topic):
                    h = dict(record.headers())
                    out.append(
                        PendingJob(
                            job_id=_text(h.get(hdr.JOB_ID)),
                            task=_text(h.get(hdr.TASK)),
                            queue=q.name,
                            due_ms=int(h.get(hdr.DUE) or 0),
                            where="exec" if topic == n.exec(q.name) else "retry",
                            attempt=int(h.get(hdr.ATTEMPT) or 1),
                            topic=topic,
                            consumed=False,
                        )
                    )
        return out

    def dead_letters(self, queue: str | None = None) -> list[DeadLetterEntry]:
        """The DLQ records, as ``dueflow dlq list/show`` reads them (reason, attempts,
        error type and message, traceback, the job), oldest first."""
        n = names(self.settings)
        out = []
        for q in self.settings.queue_names:
            if queue is None or q == queue:
                out += [decode_entry(q, r) for r in self.log.records(n.dlq(q))]
        return sorted(out, key=lambda e: (e.dead_ms, e.offset))

    @property
    def quarantined(self) -> list[Quarantined]:
        """Timer records the emitter set aside (malformed headers, unknown queue)."""
        return list(self.emitter.quarantined)

    def status(self, job_id: str) -> JobView | None:
        """What the status view (``dueflow job ID``) would show: the job's outcome
        records folded in order; None before its first outcome."""
        view: JobView | None = None
        for record in self.log.records(names(self.settings).outcomes):
            if record.key() != job_id.encode():
                continue
            version = codec.parse_schema_header(
                hdr.header(record.headers(), hdr.SCHEMA), expected="outcome"
            )
            outcome = codec.decode("outcome", record.value() or b"", writer_version=version)
            view = apply_outcome(
                view,
                outcome,
                partition=record.partition(),
                next_due_ms=header_ms(hdr.header(record.headers(), hdr.NEXT_DUE)),
            )
        return view

    def job(self, job_id: str) -> JobState:
        """Where job ``job_id`` is: state, runs, pending deliveries, dead letter."""
        view = self.status(job_id)
        pending = tuple(self.pending(job_id))
        state = view.get("state") if view else None
        if not state:
            state = "scheduled" if pending else "unknown"
        dead = [e for e in self.dead_letters() if e.job_id == job_id]
        return JobState(
            job_id=job_id,
            state=str(state),
            runs=tuple(r for r in self._history if r.job_id == job_id),
            pending=pending,
            dead_letter=dead[-1] if dead else None,
            view=view,
        )


def _register(registry: TaskRegistry, tasks: Iterable[Handler | str]) -> None:
    for item in tasks:
        if isinstance(item, str):
            found = TaskRegistry.from_modules([item])
            for entry in found:
                registry.add(entry.fn, entry.spec)
            for hook in found.hooks:
                registry.hooks.add(hook.fn)
        elif hook_kind(item) is not None and spec_of(item) is None:
            registry.hooks.add(item)
        else:
            registry.add(item)


def _pending_timer(timer: PendingTimer, consumed: set[str]) -> PendingJob:
    h = dict(timer.record.headers())
    queue = _text(h.get(hdr.QUEUE))
    return PendingJob(
        job_id=_text(h.get(hdr.JOB_ID)),
        task=_text(h.get(hdr.TASK)),
        queue=queue,
        due_ms=timer.due_ms,
        where="timer",
        topic=timer.record.topic(),
        consumed=queue in consumed,
        cron=timer.cron,
        schedule_id=_text(h.get(hdr.SCHEDULE)) or None,
    )


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "replace")
