"""``ctx.schedule``: follow-up jobs buffered per attempt, written with its success.

A handler calls ``ctx.schedule(task, payload, delay=..., ...)``; the request is
checked at once, as the scheduling client checks it
(:func:`dueflow.records.follow_up.plan_follow_up`: a bad one raises
:class:`~dueflow.errors.InvalidInput` in the handler), and its timer record
joins the attempt's :class:`FollowUpBuffer`, kept by the queue's
:class:`FollowUpPlanner` (``buffers``, by attempt). Nothing is written then.
When the attempt succeeds, the :class:`~dueflow.consumers.recorder.BatchRecorder`
takes the buffer and adds the records (:func:`follow_up_records`: the timer,
placed for the time of writing, and a ``scheduled`` outcome) to the batch that
commits the attempt's ``done`` record, outcome and offset, in one transaction.
When it fails (retry, dead letter, timeout) or is abandoned, the buffer is
dropped. A job that schedules nothing costs the hot path one check of an
empty dict: no buffer, no slot, no store.

A call after the attempt ended (a thread or task the handler left behind)
raises: the worker removes the attempt from its running set before it takes
the buffer, and :meth:`FollowUpPlanner.schedule` makes the buffer visible
before it asks whether the attempt still runs, so a call either lands in a
buffer that is taken afterwards or fails; it is never silently lost.

In a child process (``isolation="process"``) the context is rebuilt with a
planner of its own (wall clock, no tracer); the child sends the buffered
records back with its answer, and the parent adopts them before it records
the success.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.errors import ConflictError, DueflowError
from dueflow.kafka.topic_limits import default_limits_of, producer_max_bytes
from dueflow.kafka.topics import TopicNames, names
from dueflow.observability.tracing import span_headers, trace_id_of
from dueflow.records.follow_up import FollowUp, PlannedFollowUp, place_follow_up, plan_follow_up
from dueflow.records.job_request import JobRequest, JobRules
from dueflow.records.job_result import JobResult, Progress
from dueflow.records.size_budget import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PRODUCER_MAX_MESSAGE_BYTES,
    JobBudget,
    job_shape,
)
from dueflow.records.timer_record import TimerPlacer, TimerRecord
from dueflow.records.worker_codec import encode_outcome
from dueflow.rules.wheel import WheelGeometry
from dueflow.wall_clock import wall_ms

# The broker's default max.message.bytes of a topic, until the timer topic is read.
DEFAULT_TIMER_RECORD_BYTES = DEFAULT_MAX_MESSAGE_BYTES

OutRecord = tuple[str, int, bytes | None, bytes, Sequence[tuple[str, bytes]]]


class ParentJob(Protocol):
    """The running job a follow-up is scheduled from, as the planner reads it (a
    :class:`~dueflow.consumers.context.TaskContext`, which imports this module)."""

    @property
    def job_id(self) -> str: ...

    @property
    def idempotency_key(self) -> str: ...

    @property
    def traceparent(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, bytes]: ...

    @property
    def otel_context(self) -> Any: ...


class DeclaredTasks(Protocol):
    """The tasks of a worker's app, as the planner reads them (a
    :class:`~dueflow.consumers.registry.TaskRegistry`): the queue each one declares."""

    @property
    def declared_queues(self) -> Mapping[str, str]: ...


class FollowUpBuffer:
    """The follow-ups of one attempt, in call order; sealed when the attempt ends."""

    __slots__ = ("_by_id", "_lock", "items", "sealed")

    def __init__(self, items: Iterable[PlannedFollowUp] = ()) -> None:
        self._lock = threading.Lock()
        self.items: list[PlannedFollowUp] = list(items)
        self._by_id = {p.follow_up.job_id: p for p in self.items}
        self.sealed = False

    def add(self, plan: Callable[[int], PlannedFollowUp]) -> FollowUp:
        """``plan(index)`` the next follow-up and keep it. The same job again (same
        id, same content) returns the first one; the same id with other content
        raises :class:`~dueflow.errors.ConflictError`, as the scheduling client does."""
        with self._lock:
            if self.sealed:
                raise attempt_ended()
            planned = plan(len(self.items))
            job_id = planned.follow_up.job_id
            earlier = self._by_id.get(job_id)
            if earlier is not None:
                if earlier.same_job(planned):
                    return earlier.follow_up
                raise ConflictError(
                    f"job id {job_id!r} was scheduled by this attempt already with other "
                    "content (task, payload, due time, queue or key)"
                )
            self.items.append(planned)
            self._by_id[job_id] = planned
            return planned.follow_up

    def seal(self) -> list[PlannedFollowUp]:
        """End the attempt: what it scheduled; later calls raise."""
        with self._lock:
            self.sealed = True
            return list(self.items)


class Attempt:
    """An attempt that is not a worker's delivery (a test context, a child process):
    what a context schedules follow-ups through and reports progress to. A
    delivery has ``planner`` and ``progressed`` too.

    ``reports``: a list keeps every progress value (a test's context); ``sink``:
    where they go instead (a child process's pipe, see ``dueflow.consumers.isolation``).
    """

    __slots__ = ("ended", "planner", "reports", "sink")

    def __init__(
        self, planner: FollowUpPlanner | None, *, reports: list[Progress] | None = None
    ) -> None:
        self.planner = planner
        self.ended = False
        self.reports = reports
        self.sink: Callable[[Progress], None] | None = None

    def progressed(self, value: Progress) -> None:
        if self.sink is not None:
            self.sink(value)
        elif self.reports is not None:
            self.reports.append(value)


class KnownQueues:
    """The queues that exist, as a worker knows them: ``names()`` (static and
    registered, the registry followed) and ``lookup(queue)``, which reads the
    registry again for a queue not known yet (True when it exists now)."""

    __slots__ = ("lookup", "names")

    def __init__(
        self,
        names: Callable[[], frozenset[str]],
        lookup: Callable[[str], bool] | None = None,
    ) -> None:
        self.names = names
        self.lookup = lookup


@dataclass(frozen=True, slots=True)
class FollowUpSetup:
    """What a worker learns at start for ``ctx.schedule``: the timer topic's record
    size limit, the queues that exist (default: the static ones) and the size
    budget of a queue (``budgets(queue)``; None: not known yet and not to be read
    now, then the broker's default limits count)."""

    max_record_bytes: int = DEFAULT_TIMER_RECORD_BYTES
    known: KnownQueues | None = None
    budgets: Callable[[str], JobBudget | None] | None = None
    specs: Callable[[str], QueueSpec | None] | None = None


def attempt_ended() -> DueflowError:
    return DueflowError(
        "ctx.schedule was called after the attempt ended: follow-ups are written with "
        "the attempt's success, so schedule them before the handler returns"
    )


class FollowUpPlanner:
    """What ``ctx.schedule`` checks and builds follow-ups with, for one worker queue.

    ``declared``: the queue of each task of the worker's app (a follow-up without
    ``queue=`` is routed as the scheduling client routes it: ``[routes]``, then
    this, then ``default``); ``clock``: UTC epoch ms (the worker's stamp of the
    broker's clock); ``running(owner)``: whether the attempt that owns a buffer
    still runs; ``max_record_bytes``: the timer topic's ``max.message.bytes``;
    ``tracing``: the worker traces attempts (a follow-up's trace then continues
    from the attempt's span); ``known``: the queues that exist (default: the
    static ones of ``settings``); ``budgets``: the size budget of a queue (None,
    or a queue it has none for: a cluster's defaults with ``max_record_bytes``
    for the timer topic).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        declared: Mapping[str, str],
        clock: Callable[[], int],
        running: Callable[[Any], bool],
        max_record_bytes: int = DEFAULT_TIMER_RECORD_BYTES,
        tracing: bool = False,
        known: KnownQueues | None = None,
        budgets: Callable[[str], JobBudget | None] | None = None,
        specs: Callable[[str], QueueSpec | None] | None = None,
    ) -> None:
        static = {q.name: q for q in settings.queues}
        # A queue's spec (its partitions: where a follow-up set aside goes).
        self.spec_of: Callable[[str], QueueSpec | None] = specs or static.get
        self._init(
            JobRules.from_settings(settings, declared=declared),
            settings.wheel,
            names(settings).timers,
            max_record_bytes,
            producer_max_bytes(settings),
            {},
        )
        self._budgets: Callable[[str], JobBudget | None] | None = budgets
        self._clock = clock
        self._running = running
        self._tracing = tracing
        self._known = known

    @classmethod
    def of_runtime(
        cls,
        settings: Settings,
        registry: DeclaredTasks,
        clock: Callable[[], int],
        running: Mapping[bytes, Any],
        tracing: bool,
        setup: FollowUpSetup | None,
    ) -> FollowUpPlanner:
        """The planner of a queue's runtime: ``running`` maps a key to its running
        attempt (a delivery), which the runtime removes before recording it."""
        setup = setup or FollowUpSetup()
        return cls(
            settings,
            declared=registry.declared_queues,
            clock=clock,
            running=lambda d: running.get(d.key) is d,
            max_record_bytes=setup.max_record_bytes,
            tracing=tracing,
            known=setup.known,
            budgets=setup.budgets,
            specs=setup.specs,
        )

    def _init(
        self,
        rules: JobRules,
        wheel: WheelGeometry,
        topic: str,
        max_bytes: int,
        producer_bytes: int,
        known_budgets: dict[str, JobBudget],
    ) -> None:
        self._rules = rules
        self._wheel = wheel
        self.placer = TimerPlacer(wheel)
        self.topic = topic
        self.max_record_bytes = max_bytes
        self._producer_bytes = producer_bytes
        # (queue, timer limit) -> a default budget; queue -> a budget handed over
        self._defaults: dict[tuple[str, int], JobBudget] = {}
        self._known_budgets = known_budgets
        self._budgets = None
        self._lock = threading.Lock()
        # attempt (a delivery or an Attempt) -> its follow-ups; empty while no
        # running attempt has scheduled one (the recorder checks only that).
        self.buffers: dict[Any, FollowUpBuffer] = {}

    def configure(self, settings: Settings, declared: Mapping[str, str]) -> None:
        """New settings and tasks (the in-memory pipeline's queues grow); the
        buffers stay."""
        self._rules = JobRules.from_settings(settings, declared=declared)

    def budget_of(self, queue: str) -> JobBudget:
        """The size budget of ``queue``: the worker's (its topics' limits), else one
        of a cluster's default limits (``max_record_bytes`` for the timer topic)."""
        found = self._known_budgets.get(queue)
        if found is None and self._budgets is not None:
            found = self._budgets(queue)
            if found is not None:
                self._known_budgets[queue] = found  # handed to child processes too
        if found is not None:
            return found
        key = (queue, self.max_record_bytes)
        found = self._defaults.get(key)
        if found is None:
            found = self._defaults[key] = JobBudget(
                default_limits_of(
                    TopicNames(self.topic.removesuffix(".timers")),
                    QueueSpec(queue),  # only its topics' names count here
                    timers_max_bytes=self.max_record_bytes,
                    producer_max_bytes=self._producer_bytes,
                )
            )
        return found

    def rules(self) -> JobRules:
        """The rules of now: the queues that exist as the worker knows them."""
        known = self._known
        if known is not None:
            queues = known.names()
            if queues != self._rules.queues:
                self._rules = self._rules.with_queues(queues)
        return self._rules

    def schedule(
        self,
        ctx: ParentJob,
        owner: Any,
        task: str,
        payload: Any,
        queue: str | None,
        fields: dict[str, Any],
        *,
        pass_result: bool = False,
    ) -> FollowUp:
        """Check a follow-up of ``ctx``'s attempt and add it to ``owner``'s buffer
        (``pass_result``: it receives the attempt's result)."""
        buffers = self.buffers
        with self._lock:  # two threads of one handler: one buffer
            buffer = buffers.get(owner)
            if buffer is None:
                buffer = buffers[owner] = FollowUpBuffer()
        # Only now (the buffer visible first): see the module docstring.
        if not self._running(owner):
            with self._lock:
                if not buffer.items:
                    buffers.pop(owner, None)  # nobody will take it
            raise attempt_ended()
        now_ms = self._clock()
        req = JobRequest(task, payload, queue=queue, **fields)
        rules = self.rules()
        routed = rules.queue_of(req)
        lookup = None if self._known is None else self._known.lookup
        unknown = routed not in rules.queues and isinstance(routed, str)
        if unknown and lookup is not None and lookup(str(routed)):
            rules = self.rules()  # created a moment ago: the registry knows it now
        trace = trace_headers_of(ctx, traced=self._tracing)
        parent_job_id, parent_key = ctx.job_id, ctx.idempotency_key

        def plan(index: int) -> PlannedFollowUp:
            planned = plan_follow_up(
                req,
                parent_job_id=parent_job_id,
                parent_key=parent_key,
                index=index,
                now_ms=now_ms,
                rules=rules,
                placer=self.placer,
                budget=self.budget_of,
                trace_headers=trace,
            )
            return planned._replace(pass_result=True) if pass_result else planned

        return buffer.add(plan)

    def take(self, owner: Any) -> list[PlannedFollowUp]:
        """The attempt ended: its follow-ups (sealed: a later call raises)."""
        buffer = self.buffers.pop(owner, None)
        return [] if buffer is None else buffer.seal()

    def end(self, owner: Attempt) -> list[PlannedFollowUp]:
        """An :class:`Attempt` ended (a child's handler returned): its follow-ups."""
        owner.ended = True  # first: a call from now on raises (see the module docstring)
        return self.take(owner)

    def pending(self, owner: Any) -> tuple[FollowUp, ...]:
        """The follow-ups a running attempt scheduled so far."""
        buffer = self.buffers.get(owner)
        return () if buffer is None else tuple(p.follow_up for p in buffer.items)

    def adopt(self, owner: Any, planned: list[PlannedFollowUp]) -> None:
        """Follow-ups scheduled for ``owner``'s attempt in a child process."""
        with self._lock:
            self.buffers[owner] = FollowUpBuffer(planned)

    def __reduce__(self) -> tuple[Any, ...]:
        # A child process (isolation="process") gets the rules, not the clock,
        # the running set or the tracer: see child_planner.
        # The budgets known so far go along (a child reads no limits of its own).
        return (
            child_planner,
            (
                self.rules(),
                self._wheel,
                self.topic,
                self.max_record_bytes,
                self._producer_bytes,
                dict(self._known_budgets),
            ),
        )


def child_planner(
    rules: JobRules,
    wheel: WheelGeometry,
    topic: str,
    max_bytes: int,
    producer_bytes: int = PRODUCER_MAX_MESSAGE_BYTES,
    known_budgets: dict[str, JobBudget] | None = None,
) -> FollowUpPlanner:
    """The planner of a context rebuilt in a child process: the wall clock, and an
    attempt that runs until the child answers (:meth:`FollowUpPlanner.end`)."""
    planner = FollowUpPlanner.__new__(FollowUpPlanner)
    planner.spec_of = lambda queue: None  # a child writes nothing
    planner._init(rules, wheel, topic, max_bytes, producer_bytes, dict(known_budgets or {}))
    planner._clock = wall_ms
    planner._running = attempt_open
    planner._tracing = False
    planner._known = None  # the rules of the parent when the job was handed over
    return planner


def fixed_planner(settings: Settings, *, now_ms: int) -> FollowUpPlanner:
    """A planner whose clock reads ``now_ms`` (``TaskContext.for_test``)."""
    return FollowUpPlanner(settings, declared={}, clock=lambda: now_ms, running=attempt_open)


def attempt_open(owner: Attempt) -> bool:
    """Whether an :class:`Attempt` has not ended."""
    return not owner.ended


def trace_headers_of(ctx: ParentJob, *, traced: bool) -> list[tuple[str, bytes]]:
    """The trace headers that make a follow-up continue its parent's trace: a child
    of the attempt's span when the worker traces, else the job's own context."""
    if traced and ctx.otel_context is not None:
        found = span_headers(ctx.otel_context)
        if found:
            return found
    parent = ctx.traceparent
    if parent is None:
        return []
    out = [(hdr.TRACEPARENT, parent.encode())]
    state = ctx.headers.get(hdr.TRACESTATE)
    if state:
        out.append((hdr.TRACESTATE, bytes(state)))
    return out


def follow_up_records(
    planned: Sequence[PlannedFollowUp],
    *,
    now_ms: int,
    placer: TimerPlacer,
    timers_topic: str,
    outcomes_topic: str,
    outcome_headers: Sequence[tuple[str, bytes]],
    worker_id: str,
    result: JobResult | None = None,
    budget: Callable[[str], JobBudget] | None = None,
) -> list[OutRecord]:
    """The records of a successful attempt's follow-ups written at ``now_ms``: each
    one's timer record, placed for now, and its ``scheduled`` outcome (the status
    view then knows the job and its due time before it fires). A follow-up
    scheduled with ``pass_result`` carries the attempt's ``result``
    (:func:`parent_result_headers`) when every hop of it still fits its queue's
    ``budget`` (None: not checked)."""
    out: list[OutRecord] = []
    for p in planned:
        fu, rec = p.follow_up, p.record
        partition = place_follow_up(p, now_ms=now_ms, placer=placer)
        headers: Sequence[tuple[str, bytes]] = rec.headers
        if p.pass_result and result is not None:
            check = None if budget is None else budget(fu.queue)
            headers = [*rec.headers, *parent_result_headers(result, rec, check)]
        out.append((timers_topic, partition, rec.key, rec.value, headers))
        outcome = encode_outcome(
            job_id=fu.job_id,
            queue=fu.queue,
            task=fu.task,
            idempotency_key=fu.idempotency_key,
            state="scheduled",
            attempt=0,
            at_ms=now_ms,
            due_ms=fu.due_ms,
            worker=worker_id,
            trace_id=trace_id_of(rec.headers),
        )
        out.append((outcomes_topic, -1, fu.job_id.encode(), outcome, outcome_headers))
    return out


def parent_result_headers(
    result: JobResult, record: TimerRecord, budget: JobBudget | None
) -> list[tuple[str, bytes]]:
    """The header that passes ``result`` to the follow-up whose timer record is
    ``record``: ``df-parent-result``, or ``df-parent-result-error`` saying why not
    (no result, or a record that would not fit a hop of ``budget``)."""
    raw = result.json
    if raw is None:
        error = result.error or "no result"
        return [(hdr.PARENT_RESULT_ERROR, error.encode("utf-8", "replace"))]
    found = [(hdr.PARENT_RESULT, raw)]
    if budget is None:
        return found
    headers = [*record.headers, *found]
    overflow = budget.overflow(job_shape(record.key, record.value, headers, payload=0))
    if overflow is None:
        return found
    error = f"result of {len(raw):,} bytes does not fit the follow-up: {overflow.describe()}"
    return [(hdr.PARENT_RESULT_ERROR, error.encode())]
