"""What a caller asks to schedule, checked and turned into a :class:`Job` (pure).

:class:`JobRequest` holds the arguments of ``Scheduler.schedule`` as given;
:func:`prepare_job` checks every one of them and builds the :class:`Job` that
goes into the timer topic, or raises :class:`InvalidInput` naming the field,
the value and what is accepted. Nothing is written before this succeeds.

The clock and the random job id are arguments (``now_ms``, ``new_job_id``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from dueflow.config import Settings
from dueflow.deadline import job_deadline
from dueflow.errors import InvalidInput
from dueflow.jitter import deterministic_jitter_ms
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.timeutil import parse_duration, to_utc_ms

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
MAX_NAME_CHARS = 255
MAX_INT32 = (1 << 31) - 1

Instant = datetime | str
Duration = timedelta | float | int | str


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job to schedule, as the caller gives it (see :func:`prepare_job`).

    ``payload`` is any JSON-serializable value (stored as JSON) or ``bytes``
    (stored as is, ``application/octet-stream``). Give ``run_at`` (a tz-aware
    datetime or ISO-8601 text with an offset) or ``delay`` (a duration), or
    neither to run at once. ``expires`` (an instant) and ``max_lateness`` (a
    duration after the due time) give a deadline: a job not started by then
    is not run (:mod:`dueflow.deadline`).
    """

    task: str
    payload: Any = None
    run_at: Instant | None = None
    delay: Duration | None = None
    queue: str = "default"
    job_id: str | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    backoff: Backoff | str | Mapping[str, Any] | None = None
    timeout: Duration | None = None
    jitter: Duration | None = None
    labels: Mapping[str, str] | None = None
    expires: Instant | None = None
    max_lateness: Duration | None = None


REQUEST_FIELDS = frozenset(f.name for f in fields(JobRequest))


@dataclass(frozen=True, slots=True)
class JobRules:
    """What the cluster accepts: its queues and the default attempt count."""

    queues: frozenset[str]
    default_max_attempts: int = 4

    @classmethod
    def from_settings(cls, settings: Settings) -> JobRules:
        return cls(frozenset(settings.queue_names), settings.worker.default_max_attempts)


def as_request(item: JobRequest | Mapping[str, Any], *, field: str = "job") -> JobRequest:
    """A :class:`JobRequest` from itself or from a dict of its fields."""
    if isinstance(item, JobRequest):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - REQUEST_FIELDS
        if unknown:
            raise InvalidInput(
                f"{field}.{sorted(unknown)[0]}",
                item[sorted(unknown)[0]],
                f"only the fields {sorted(REQUEST_FIELDS)}",
            )
        if "task" not in item:
            raise InvalidInput(f"{field}.task", None, "a task name (required)")
        return JobRequest(**item)
    raise InvalidInput(field, type(item).__name__, "a JobRequest or a dict of its fields")


class PreparedJob(NamedTuple):
    """A checked job, its fields in the order of schemas/job.avsc.

    The schema-order tuple is what the fast Avro encoder reads
    (:func:`dueflow.schemas.job_binary.encode_job`); :meth:`to_job` gives the
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
) -> PreparedJob:
    """Check ``req`` and build its job; :class:`InvalidInput` names the first bad field.

    The due time is ``run_at``, ``now + delay``, or ``now``; jitter adds a
    deterministic offset in ``[0, jitter]`` derived from the job id, so the
    same job is always placed at the same time. ``new_job_id(now_ms)`` draws
    an id when the request has none. (Written for speed: ``schedule_many``
    runs it for every job.)
    """
    task = req.task
    if type(task) is not str or not 0 < len(task) <= MAX_NAME_CHARS:
        raise bad_name("task", task)
    queue = req.queue
    if queue not in rules.queues:
        raise unknown_queue(queue, rules.queues)
    payload = req.payload
    if type(payload) is bytes:
        content_type = OCTET_STREAM
    else:
        payload, content_type = encode_payload(payload)
    job_id = req.job_id
    if job_id is None:
        job_id = new_job_id(now_ms)
    elif type(job_id) is not str or not 0 < len(job_id) <= MAX_NAME_CHARS:
        raise bad_name("job_id", job_id)
    key = req.idempotency_key
    if key is None:
        key = job_id
    elif type(key) is not str or not 0 < len(key) <= MAX_NAME_CHARS:
        raise bad_name("idempotency_key", key)
    due_ms = _due_ms(req, now_ms)
    jitter_ms = 0
    if req.jitter is not None:
        jitter_ms = parse_duration(req.jitter, field="jitter")
        if jitter_ms:
            due_ms += deterministic_jitter_ms(job_id, jitter_ms)
    max_attempts = req.max_attempts
    if max_attempts is None:
        max_attempts = rules.default_max_attempts
    elif type(max_attempts) is not int or not 1 <= max_attempts <= MAX_INT32:
        raise bad_attempts(max_attempts)
    backoff = None if req.backoff is None else parse_backoff(req.backoff)
    timeout_ms = None if req.timeout is None else _timeout_ms(req.timeout)
    labels = NO_STRINGS if req.labels is None else _labels(req.labels)
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
            backoff,
            timeout_ms,
            jitter_ms,
            now_ms,
            trace or NO_STRINGS,
            None,
            None,
            content_hash(task, payload, content_type),
            labels,
        ),
    )


def deadline_of(req: JobRequest, due_ms: int) -> int | None:
    """The deadline of ``req``'s job due at ``due_ms`` (:func:`dueflow.deadline.job_deadline`);
    :class:`InvalidInput` names ``expires`` or ``max_lateness``."""
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
    """Payload bytes and content type: bytes as is, anything else as JSON (sorted keys)."""
    if isinstance(payload, bytes):
        return payload, OCTET_STREAM
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload), OCTET_STREAM
    try:
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS), JSON
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise bad_payload(payload, exc) from None


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
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidInput(f"backoff.{name}", v, "an integer number of milliseconds >= 0")
    if b.max_ms < b.base_ms:
        raise InvalidInput("backoff.max_ms", b.max_ms, f">= base_ms ({b.base_ms})")
    if not isinstance(b.multiplier, int | float) or not 1.0 <= b.multiplier <= 1000.0:
        raise InvalidInput("backoff.multiplier", b.multiplier, "a number from 1 to 1000")
    if not isinstance(b.jitter, bool):
        raise InvalidInput("backoff.jitter", b.jitter, "true or false")
    return b


def bad_name(field: str, value: object) -> InvalidInput:
    """The error for a task, job id or key that is not a usable name."""
    return InvalidInput(field, value, f"a non-empty string of at most {MAX_NAME_CHARS} chars")


def unknown_queue(queue: object, queues: frozenset[str]) -> InvalidInput:
    return InvalidInput("queue", queue, f"one of the configured queues {sorted(queues)}")


def bad_attempts(value: object) -> InvalidInput:
    return InvalidInput("max_attempts", value, f"an integer from 1 to {MAX_INT32}")


def _due_ms(req: JobRequest, now_ms: int) -> int:
    return due_of(req.run_at, req.delay, now_ms=now_ms)


def due_of(
    run_at: Instant | None, delay: Duration | None, *, now_ms: int, required: bool = False
) -> int:
    """The due time ``run_at``, ``now + delay``, or ``now`` (``required``: one of them must
    be given); :class:`InvalidInput` names the field."""
    if run_at is not None:
        if delay is not None:
            raise InvalidInput("delay", delay, "either run_at or delay, not both")
        return to_utc_ms(run_at, field="run_at")
    if delay is None:
        if required:
            raise InvalidInput("run_at", None, "the new due time: run_at= or delay=")
        return now_ms
    if type(delay) is int and delay >= 0:
        return now_ms + delay * 1000
    return now_ms + parse_duration(delay, field="delay")


def _max_attempts(value: int | None, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_INT32:
        raise InvalidInput("max_attempts", value, f"an integer from 1 to {MAX_INT32}")
    return value


def _timeout_ms(value: Duration | None) -> int | None:
    if value is None:
        return None
    ms = parse_duration(value, field="timeout")
    if ms < 1:
        raise InvalidInput("timeout", value, "a duration of at least 1 ms, or None")
    return ms


def _labels(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidInput("labels", value, "a dict of strings to strings")
    return dict(value)
