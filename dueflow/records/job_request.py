"""What a caller asks to schedule, checked and turned into a :class:`Job` (pure).

:class:`JobRequest` holds the arguments of ``Scheduler.schedule`` as given;
:func:`prepare_job` checks every one of them and builds the :class:`Job` that
goes into the timer topic, or raises :class:`InvalidInput` naming the field,
the value and what is accepted. Nothing is written before this succeeds.
:class:`JobRules` is what the cluster accepts (queues, routes, known tasks).

The checks of single fields and their limits are in
:mod:`dueflow.records.request_checks`, the payload's bytes and content hash in
:mod:`dueflow.records.job_payload`; their names are importable from here too.

The clock and the random job id are arguments (``now_ms``, ``new_job_id``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from dueflow.config import Settings
from dueflow.errors import InvalidInput
from dueflow.model import Backoff, Job
from dueflow.records.job_payload import JSON as JSON
from dueflow.records.job_payload import NON_FINITE_ACCEPTED as NON_FINITE_ACCEPTED
from dueflow.records.job_payload import OCTET_STREAM as OCTET_STREAM
from dueflow.records.job_payload import _non_finite as _non_finite
from dueflow.records.job_payload import bad_payload as bad_payload
from dueflow.records.job_payload import check_finite as check_finite
from dueflow.records.job_payload import content_hash as content_hash
from dueflow.records.job_payload import content_hash_prefix as content_hash_prefix
from dueflow.records.job_payload import encode_payload as encode_payload
from dueflow.records.request_checks import NAME_ACCEPTED as NAME_ACCEPTED
from dueflow.records.request_checks import TIMEOUT_ACCEPTED as TIMEOUT_ACCEPTED
from dueflow.records.request_checks import BackoffSpec as BackoffSpec
from dueflow.records.request_checks import Duration as Duration
from dueflow.records.request_checks import Instant as Instant
from dueflow.records.request_checks import bad_attempts as bad_attempts
from dueflow.records.request_checks import bad_name as bad_name
from dueflow.records.request_checks import bad_task as bad_task
from dueflow.records.request_checks import check_labels
from dueflow.records.request_checks import check_name as check_name
from dueflow.records.request_checks import due_after as due_after
from dueflow.records.request_checks import due_of as due_of
from dueflow.records.request_checks import due_too_late as due_too_late
from dueflow.records.request_checks import is_name as is_name
from dueflow.records.request_checks import parse_backoff as parse_backoff
from dueflow.records.request_checks import parse_timeout as parse_timeout
from dueflow.records.request_checks import unknown_queue as unknown_queue
from dueflow.records.request_checks import unknown_task as unknown_task
from dueflow.rules.deadline import job_deadline
from dueflow.rules.jitter import deterministic_jitter_ms
from dueflow.rules.routing import Router

# The limits every reader of the wire accepts (MAX_DUE_MS: 9999-12-31T23:59:59.999Z,
# the last millisecond a datetime holds), here for the SDK's callers too.
from dueflow.rules.wire_bounds import MAX_DUE_MS as MAX_DUE_MS
from dueflow.rules.wire_bounds import MAX_INT32 as MAX_INT32
from dueflow.rules.wire_bounds import MAX_LONG as MAX_LONG
from dueflow.rules.wire_bounds import MAX_NAME_CHARS as MAX_NAME_CHARS
from dueflow.task_name import is_task_name
from dueflow.timeutil import format_utc, parse_duration, to_utc_ms


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job to schedule, as the caller gives it (see :func:`prepare_job`).

    ``payload`` is any JSON-serializable value (stored as JSON) or ``bytes``
    (stored as is, ``application/octet-stream``). Give ``run_at`` (a tz-aware
    datetime or ISO-8601 text with an offset) or ``delay`` (a duration), or
    neither to run at once. ``queue`` ``None``: the task's route decides
    (:mod:`dueflow.rules.routing`). ``expires`` (an instant) and ``max_lateness`` (a
    duration after the due time) give a deadline: a job not started by then
    is not run (:mod:`dueflow.rules.deadline`).
    """

    task: str
    payload: Any = None
    run_at: Instant | None = None
    delay: Duration | None = None
    queue: str | None = None
    job_id: str | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    backoff: BackoffSpec | None = None
    timeout: Duration | None = None
    jitter: Duration | None = None
    labels: Mapping[str, str] | None = None
    expires: Instant | None = None
    max_lateness: Duration | None = None


# The fields of a JobRequest: task, payload and the keywords of RequestOptions
# (dueflow.records.job_options; tests/unit/test_scheduling_options.py checks it, and
# mypy checks every ``JobRequest(task, payload, **options)``).
REQUEST_FIELDS = frozenset(f.name for f in fields(JobRequest))


@dataclass(frozen=True, slots=True)
class JobRules:
    """What the cluster accepts: its queues, the default attempt count, and how a
    job without a queue is routed. ``known_tasks``: the tasks of the producer's app
    (``app=``, ``--app``, ``DUEFLOW_APP``); with them, a task the app does not
    declare and the route table does not name is refused (a misspelled name would
    reach the DLQ as ``unknown_task``); ``None``: any valid name."""

    queues: frozenset[str]
    default_max_attempts: int = 4
    router: Router = field(default_factory=Router)
    known_tasks: frozenset[str] | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        queues: Iterable[str] | None = None,
        declared: Mapping[str, str] | None = None,
        known_tasks: Iterable[str] | None = None,
    ) -> JobRules:
        """Rules of ``settings``; ``queues``: the known queues (default: the static
        ones), ``declared``: ``@task`` queues by task name (see :mod:`dueflow.rules.routing`),
        ``known_tasks``: the app's tasks, when the producer knows them."""
        return cls(
            frozenset(settings.queue_names if queues is None else queues),
            settings.worker.default_max_attempts,
            Router(settings.routes, declared),
            None if known_tasks is None else frozenset(known_tasks),
        )

    def check_task(self, task: str) -> None:
        """Refuse ``task`` when the producer knows its app's tasks and this is none of
        them, nor one the route table names (:class:`InvalidInput`, with a suggestion)."""
        known = self.known_tasks
        if known is not None and task not in known and not self.router.routed(task):
            raise unknown_task(task, known)

    def with_queues(self, queues: Iterable[str]) -> JobRules:
        return replace(self, queues=frozenset(queues))

    def queue_of(self, req: JobRequest) -> object:
        """The queue of ``req``: its own, or its task's route."""
        queue = req.queue
        return self.router.queue_for(req.task) if queue is None else queue


def as_request(item: JobRequest | Mapping[str, Any], *, field: str = "job") -> JobRequest:
    """A :class:`JobRequest` from itself or from a dict of its fields."""
    if isinstance(item, JobRequest):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - REQUEST_FIELDS
        if unknown:
            first = sorted(unknown, key=str)[0]  # keys need not be strings
            raise InvalidInput(
                f"{field}.{first}", item[first], f"only the fields {sorted(REQUEST_FIELDS)}"
            )
        if "task" not in item:
            raise InvalidInput(f"{field}.task", None, "a task name (required)")
        return JobRequest(**item)
    raise InvalidInput(field, type(item).__name__, "a JobRequest or a dict of its fields")


class PreparedJob(NamedTuple):
    """A checked job, its fields in the order of schemas/dueflow/schemas/job.avsc.

    The schema-order tuple is what the fast Avro encoder reads
    (:func:`dueflow.records.job_binary.encode_job`); :meth:`to_job` gives the
    :class:`Job` domain value.
    """

    job_id: str
    queue: str
    task: str
    payload: bytes
    content_type: str
    due_ms: int
    idempotency_key: str
    max_attempts: int
    backoff: Backoff | None
    timeout_ms: int | None
    jitter_ms: int
    created_ms: int
    trace: Mapping[str, str]
    schedule_id: str | None
    schedule_version: int | None
    content_hash: str | None
    labels: Mapping[str, str]

    def to_job(self) -> Job:
        return Job(**self._asdict())


NO_STRINGS: Mapping[str, str] = MappingProxyType({})
# NamedTuple's generated __new__ is a Python function; building the tuple
# directly skips that frame (schedule_many builds one per job).
_new_prepared = tuple.__new__


def prepare_job(
    req: JobRequest,
    *,
    now_ms: int,
    rules: JobRules,
    new_job_id: Callable[[int], str],
    trace: Mapping[str, str] | None = None,
    check_queue: Callable[[object], None] | None = None,
) -> PreparedJob:
    """Check ``req`` and build its job; :class:`InvalidInput` names the first bad field.

    The due time is ``run_at``, ``now + delay``, or ``now``; jitter adds a
    deterministic offset in ``[0, jitter]`` derived from the job id, so the
    same job is always placed at the same time. ``new_job_id(now_ms)`` draws
    an id when the request has none. ``check_queue``: how a queue that is not
    among ``rules.queues`` is looked up (the client reads the queue registry)
    before it is refused; without it, it is refused at once. The one planning
    path of every client (the SDK's ``schedule``, ``ctx.schedule``, the CLI), so
    written for speed: a request with none of the rarer fields costs a few
    ``None`` tests for them.
    """
    task = req.task
    if not is_task_name(task):
        raise bad_task(task)
    queue = _queue_of(req.queue, task, rules, check_queue)
    payload = req.payload
    if type(payload) is bytes:
        content_type = OCTET_STREAM
    else:
        payload, content_type = encode_payload(payload)
    job_id, key = _ids_of(req, now_ms, new_job_id)
    due_ms = _due_of_request(req, now_ms)
    jitter_ms = 0 if req.jitter is None else _jitter_ms(req.jitter, due_ms)
    if jitter_ms:
        due_ms += deterministic_jitter_ms(job_id, jitter_ms)
    max_attempts = req.max_attempts
    if max_attempts is None:
        max_attempts = rules.default_max_attempts
    elif type(max_attempts) is not int or not 1 <= max_attempts <= MAX_INT32:
        raise bad_attempts(max_attempts)
    return _new_prepared(
        PreparedJob,
        (
            job_id,
            queue,
            task,
            payload,
            content_type,
            due_ms,
            key,
            max_attempts,
            None if req.backoff is None else parse_backoff(req.backoff),
            None if req.timeout is None else parse_timeout(req.timeout),
            jitter_ms,
            now_ms,
            trace or NO_STRINGS,
            None,
            None,
            content_hash(task, payload, content_type),
            NO_STRINGS if req.labels is None else check_labels(req.labels),
        ),
    )


def _queue_of(
    queue: str | None, task: str, rules: JobRules, check_queue: Callable[[object], None] | None
) -> str:
    """The job's queue (``queue``, else the task's route), checked to exist, then the
    task checked to be known (after the queue: a task routed elsewhere passes)."""
    if queue is None:
        queue = rules.router.queue_for(task)
    if queue not in rules.queues:
        if check_queue is None:
            raise unknown_queue(queue, rules.queues)
        check_queue(queue)
    if rules.known_tasks is not None:
        rules.check_task(task)
    return queue


def _ids_of(req: JobRequest, now_ms: int, new_job_id: Callable[[int], str]) -> tuple[str, str]:
    """The job id (drawn when the request has none) and idempotency key (default: the id)."""
    job_id = req.job_id
    if job_id is None:
        job_id = new_job_id(now_ms)
    elif not is_name(job_id):
        raise bad_name("job_id", job_id)
    key = req.idempotency_key
    if key is None:
        key = job_id
    elif not is_name(key):
        raise bad_name("idempotency_key", key)
    return job_id, key


def _due_of_request(req: JobRequest, now_ms: int) -> int:
    """The request's due time before jitter: ``run_at``, ``now + delay``, or ``now``."""
    if req.run_at is not None:
        return due_of(req.run_at, req.delay, now_ms=now_ms)
    if req.delay is not None:
        return due_after(req.delay, now_ms=now_ms)
    return now_ms


def _jitter_ms(jitter: Duration, due_ms: int) -> int:
    """The jitter window of a job due at ``due_ms``, in ms: :class:`InvalidInput`
    names ``jitter`` when it is no duration or the window ends after :data:`MAX_DUE_MS`."""
    jitter_ms = parse_duration(jitter, field="jitter")
    if jitter_ms > MAX_DUE_MS - due_ms:
        raise InvalidInput(
            "jitter",
            jitter,
            f"a window ending at or before {format_utc(MAX_DUE_MS)} "
            f"(at most {MAX_DUE_MS - due_ms} ms after the due time)",
        )
    return jitter_ms


def deadline_of(req: JobRequest, due_ms: int) -> int | None:
    """The deadline of ``req``'s job due at ``due_ms``
    (:func:`~dueflow.rules.deadline.job_deadline`); :class:`InvalidInput` names
    ``expires`` or ``max_lateness``."""
    if req.expires is None and req.max_lateness is None:
        return None
    return job_deadline(
        due_ms=due_ms,
        expires_ms=None if req.expires is None else to_utc_ms(req.expires, field="expires"),
        max_lateness_ms=None
        if req.max_lateness is None
        else parse_duration(req.max_lateness, field="max_lateness"),
    )
