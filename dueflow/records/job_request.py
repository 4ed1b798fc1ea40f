"""What a caller asks to schedule, checked and turned into a :class:`Job` (pure).

:class:`JobRequest` holds the arguments of ``Scheduler.schedule`` as given;
:func:`prepare_job` checks every one of them and builds the :class:`Job` that
goes into the timer topic, or raises :class:`InvalidInput` naming the field,
the value and what is accepted. Nothing is written before this succeeds.

Limits, so that every accepted job can be encoded and read back: a due time
(``run_at``, ``now + delay``, plus the jitter window) at or before
9999-12-31T23:59:59.999Z, the last instant a :class:`~datetime.datetime`
holds (:data:`MAX_DUE_MS`); timeouts and backoff times up to an Avro long;
``max_attempts`` up to an Avro int; task names by the workers' rule
(:mod:`dueflow.task_name`); a JSON payload without NaN or Infinity (JSON has
neither: orjson would write them as ``null``).

The clock and the random job id are arguments (``now_ms``, ``new_job_id``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from dueflow.config import Settings
from dueflow.control_chars import CONTROL_CHARS_TEXT, has_control
from dueflow.errors import InvalidInput, UnknownQueue
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.rules.deadline import job_deadline
from dueflow.rules.jitter import deterministic_jitter_ms
from dueflow.rules.routing import Router

# The limits every reader of the wire accepts (MAX_DUE_MS: 9999-12-31T23:59:59.999Z,
# the last millisecond a datetime holds), here for the SDK's callers too.
from dueflow.rules.wire_bounds import MAX_DUE_MS as MAX_DUE_MS
from dueflow.rules.wire_bounds import MAX_INT32 as MAX_INT32
from dueflow.rules.wire_bounds import MAX_LONG as MAX_LONG
from dueflow.rules.wire_bounds import MAX_NAME_CHARS as MAX_NAME_CHARS
from dueflow.task_name import TASK_NAME_ACCEPTED, is_task_name
from dueflow.timeutil import format_utc, parse_duration, to_utc_ms

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"

Instant = datetime | str
Duration = timedelta | float | int | str
BackoffSpec = Backoff | str | Mapping[str, Any]


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
            NO_STRINGS if req.labels is None else _labels(req.labels),
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


def encode_payload(payload: Any) -> tuple[bytes, str]:
    """Payload bytes and content type: bytes as is, anything else as JSON (sorted keys).

    A NaN or infinite float anywhere in it is refused (:func:`check_finite`)."""
    if isinstance(payload, bytes):
        return payload, OCTET_STREAM
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload), OCTET_STREAM
    try:
        raw = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise bad_payload(payload, exc) from None
    if b"null" in raw:  # orjson writes NaN and Infinity as null: look only then
        check_finite(payload)
    return raw, JSON


NON_FINITE_ACCEPTED = (
    "a finite number: JSON has no NaN or Infinity (they would be written as null); "
    "send null or a string instead"
)


def check_finite(payload: Any) -> None:
    """Raise :class:`InvalidInput` naming the path (``payload['a'][2]``) of the first
    NaN or infinite float in ``payload``, looking where orjson does: dicts, lists,
    tuples, dataclasses and enum values."""
    found = _non_finite(payload)
    if found is not None:
        steps, value = found
        path = "payload" + "".join(
            f".{s}" if isinstance(s, _Attribute) else f"[{s!r}]" for s in reversed(steps)
        )
        raise InvalidInput(path, value, NON_FINITE_ACCEPTED)


class _Attribute(str):
    """A step into a dataclass field (shown ``.name``; a dict key is ``['name']``)."""

    __slots__ = ()


def _non_finite(value: Any) -> tuple[list[object], float] | None:
    """(steps from the hit up to the top, the value) of the first non-finite float."""
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], value)
    items: Any
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((_Attribute(f.name), getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, Enum):
        return _non_finite(value.value)
    else:
        return None
    for step, item in items:
        found = _non_finite(item)
        if found is not None:
            found[0].append(step)
            return found
    return None


def bad_payload(payload: Any, exc: Exception) -> InvalidInput:
    """The error for a payload that JSON cannot encode (``exc`` says why)."""
    return InvalidInput(
        "payload",
        f"<{type(payload).__name__}: {exc}>",
        "a JSON-serializable value (dict, list, str, number, bool, None) or bytes",
    )


def content_hash(task: str, payload: bytes, content_type: str) -> str:
    """Stable hash of what a job does: task, payload bytes and content type (32 hex)."""
    head = b"%s\0%s\0" % (task.encode(), content_type.encode())
    return hashlib.blake2b(head + payload, digest_size=16).hexdigest()


def content_hash_prefix(task: str, content_type: str) -> hashlib.blake2b:
    """A hasher holding what :func:`content_hash` hashes before the payload: a copy
    of it, updated with the payload, gives the same hex digest."""
    return hashlib.blake2b(b"%s\0%s\0" % (task.encode(), content_type.encode()), digest_size=16)


_BACKOFF_ACCEPTED = (
    "exponential, fixed or none, optionally with :BASE[:MAX] (milliseconds or durations, "
    "e.g. exponential:500:60000 or fixed:10s), a dict with kind/base_ms/max_ms/multiplier/"
    "jitter, or a dueflow.model.Backoff"
)


def parse_backoff(value: Backoff | str | Mapping[str, Any] | None) -> Backoff | None:
    """A valid :class:`Backoff` (or ``None``: the queue's retry tiers)."""
    if value is None:
        return None
    if isinstance(value, Backoff):
        backoff = value
    elif isinstance(value, str):
        backoff = _backoff_from_text(value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"kind", "base_ms", "max_ms", "multiplier", "jitter"}
        if unknown or "kind" not in value:
            raise InvalidInput("backoff", dict(value), _BACKOFF_ACCEPTED)
        try:
            kind = BackoffKind(value["kind"])
        except ValueError:
            raise InvalidInput("backoff", dict(value), _BACKOFF_ACCEPTED) from None
        defaults = Backoff(kind)
        backoff = Backoff(
            kind,
            base_ms=value.get("base_ms", defaults.base_ms),
            max_ms=value.get("max_ms", defaults.max_ms),
            multiplier=value.get("multiplier", defaults.multiplier),
            jitter=value.get("jitter", defaults.jitter),
        )
    else:
        raise InvalidInput("backoff", value, _BACKOFF_ACCEPTED)
    return _checked_backoff(backoff, value)


def _backoff_from_text(text: str) -> Backoff:
    parts = text.strip().lower().split(":")
    try:
        kind = BackoffKind(parts[0])
    except ValueError:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED) from None
    if len(parts) > 3:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED)
    times = [_backoff_ms(p, text) for p in parts[1:]]
    base = times[0] if times else Backoff().base_ms
    top = times[1] if len(times) > 1 else max(Backoff().max_ms, base)
    return Backoff(kind, base_ms=base, max_ms=top)


def _backoff_ms(part: str, text: str) -> int:
    if part.isdigit():
        return int(part)
    try:
        return parse_duration(part, field="backoff")
    except InvalidInput:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED) from None


def _checked_backoff(b: Backoff, shown: object) -> Backoff:
    if not isinstance(b.kind, BackoffKind):
        raise InvalidInput("backoff", shown, _BACKOFF_ACCEPTED)
    for name in ("base_ms", "max_ms"):
        v = getattr(b, name)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LONG:
            raise InvalidInput(
                f"backoff.{name}", v, f"an integer number of milliseconds from 0 to {MAX_LONG}"
            )
    if b.max_ms < b.base_ms:
        raise InvalidInput("backoff.max_ms", b.max_ms, f">= base_ms ({b.base_ms})")
    if not isinstance(b.multiplier, int | float) or not 1.0 <= b.multiplier <= 1000.0:
        raise InvalidInput("backoff.multiplier", b.multiplier, "a number from 1 to 1000")
    if not isinstance(b.jitter, bool):
        raise InvalidInput("backoff.jitter", b.jitter, "true or false")
    return b


NAME_ACCEPTED = (
    f"a non-empty string of at most {MAX_NAME_CHARS} chars (valid UTF-8), " + CONTROL_CHARS_TEXT
)


def is_name(value: object) -> bool:
    """Whether ``value`` is a usable job id, idempotency key, schedule id or label key:
    1 to 255 characters that UTF-8 can encode (no lone surrogates), none of them a
    control character (:data:`~dueflow.control_chars.CONTROL_CHARS`)."""
    if type(value) is not str or not 0 < len(value) <= MAX_NAME_CHARS:
        return False
    if value.isascii():
        return value.isprintable()  # ASCII: printable is "no C0, no DEL"
    return _utf8(value) and not has_control(value)


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def bad_name(field: str, value: object) -> InvalidInput:
    """The error for a job id, key or schedule id that is not a usable name (the
    message shows the value with its control characters escaped)."""
    return InvalidInput(field, value, NAME_ACCEPTED)


def check_name(field: str, value: object) -> str:
    """``value`` when it is a usable name (:func:`is_name`), else :func:`bad_name`."""
    if not is_name(value):
        raise bad_name(field, value)
    return value  # type: ignore[return-value]


def bad_task(value: object) -> InvalidInput:
    """The error for a task name a worker would not accept (:mod:`dueflow.task_name`)."""
    return InvalidInput("task", value, TASK_NAME_ACCEPTED)


def unknown_task(task: str, known: Iterable[str]) -> InvalidInput:
    """The error for a task the producer's app does not declare (:meth:`JobRules.check_task`)."""
    names = sorted(known)
    shown = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
    close = difflib.get_close_matches(task, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidInput(
        "task",
        task,
        f"a task of the app ({shown}) or one the route table names "
        f"([routes], DUEFLOW_ROUTES){hint}",
    )


def due_too_late(field: str, value: object, *, now_ms: int) -> InvalidInput:
    """The error for a ``run_at`` or ``delay`` whose due time is after :data:`MAX_DUE_MS`."""
    if field == "delay":
        accepted = (
            f"a duration putting the due time at or before {format_utc(MAX_DUE_MS)} "
            f"(at most {MAX_DUE_MS - now_ms} ms from now)"
        )
    else:
        accepted = f"a time at or before {format_utc(MAX_DUE_MS)}"
    return InvalidInput(field, value, accepted)


def unknown_queue(queue: object, queues: frozenset[str]) -> UnknownQueue:
    """The error for a queue nobody knows: names it and says how to create it."""
    return UnknownQueue(queue, queues)


def bad_attempts(value: object) -> InvalidInput:
    return InvalidInput("max_attempts", value, f"an integer from 1 to {MAX_INT32}")


def due_of(
    run_at: Instant | None, delay: Duration | None, *, now_ms: int, required: bool = False
) -> int:
    """The due time ``run_at``, ``now + delay``, or ``now`` (``required``: one of them must
    be given); :class:`InvalidInput` names the field."""
    if run_at is not None:
        if delay is not None:
            raise InvalidInput("delay", delay, "either run_at or delay, not both")
        due_ms = to_utc_ms(run_at, field="run_at")
        if due_ms > MAX_DUE_MS:
            raise due_too_late("run_at", run_at, now_ms=now_ms)
        return due_ms
    if delay is None:
        if required:
            raise InvalidInput("run_at", None, "the new due time: run_at= or delay=")
        return now_ms
    return due_after(delay, now_ms=now_ms)


def due_after(delay: Duration, *, now_ms: int) -> int:
    """The due time ``now + delay`` (whole seconds as an int, the fast case);
    :class:`InvalidInput` names ``delay`` when it is no duration or lands after
    :data:`MAX_DUE_MS`."""
    if type(delay) is int and delay >= 0:
        due_ms = now_ms + delay * 1000
    else:
        due_ms = now_ms + parse_duration(delay, field="delay")
    if due_ms > MAX_DUE_MS:
        raise due_too_late("delay", delay, now_ms=now_ms)
    return due_ms


TIMEOUT_ACCEPTED = f"a duration of at least 1 ms and at most {MAX_LONG} ms, or None"


def parse_timeout(value: Duration | None) -> int | None:
    """A job's ``timeout`` in ms (``None``: the worker's default); 1 ms to an Avro long."""
    if value is None:
        return None
    ms = parse_duration(value, field="timeout")
    if not 1 <= ms <= MAX_LONG:
        raise InvalidInput("timeout", value, TIMEOUT_ACCEPTED)
    return ms


def _labels(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and _utf8(k) and _utf8(v)
        for k, v in value.items()
    ):
        raise InvalidInput("labels", value, "a dict of strings to strings (valid UTF-8)")
    for key in value:
        check_name(f"labels[{key!r}]", key)
    # Sorted by key (code points: UTF-8 byte order), so that equal labels are
    # equal bytes whatever order the caller's map has; every client does the same.
    return dict(sorted(value.items()))
