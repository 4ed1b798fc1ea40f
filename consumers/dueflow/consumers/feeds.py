"""Per-partition state of a queue's worker (records waiting, offsets, holds) and
the decoding of a record when it reaches the head of its partition."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import TopicPartition

from dueflow import headers as hdr
from dueflow.config import WorkerSettings
from dueflow.consumers.failures import Failure, permanent
from dueflow.consumers.feed_states import FeedState, feed_move
from dueflow.consumers.offsets import OffsetTracker
from dueflow.consumers.registry import RegisteredTask, TaskRegistry
from dueflow.consumers.store import KeyStore
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.reasons import OUT_OF_RANGE, UNDECODABLE, UNKNOWN_TASK
from dueflow.records.job_checks import (
    attempt_of,
    check_job,
    exec_not_before,
    expires_of,
    longest_retry_delay_ms,
    overlap_of,
    retry_not_before,
)
from dueflow.records.worker_codec import (
    F_BACKOFF,
    F_CONTENT_TYPE,
    F_DUE_MS,
    F_JOB_ID,
    F_KEY,
    F_MAX_ATTEMPTS,
    F_PAYLOAD,
    F_TASK,
    F_TIMEOUT_MS,
    F_TRACE,
    JobFields,
    decode_job_fields,
)
from dueflow.rules.wire_bounds import DEFAULT_CLOCK_SKEW_MS, MAX_KEY_BYTES


class Delivery:
    """One record read from an exec or retry partition, on its way to an outcome."""

    __slots__ = (
        "ahead",
        "attempt",
        "bad",
        "command",
        "expires",
        "feed",
        "fields",
        "hmap",
        "key",
        "max_attempts",
        "msg",
        "not_before",
        "offset",
        "payload",
        "progress",
        "rechecked",
        "span",
        "taken",
        "task",
    )

    # Set by :func:`prepare` when the record reaches the head of its partition
    # (creating 10^5 of these per second: only what intake needs is set here).
    fields: tuple[Any, ...] | None
    bad: tuple[str, Failure] | None  # (dead-letter reason, failure)
    key: bytes
    hmap: dict[str, bytes]
    attempt: int
    max_attempts: int
    not_before: int
    expires: int | None  # df-expires: a first attempt not started by then is not run
    task: RegisteredTask | None
    payload: Any
    span: Any
    rechecked: bool  # the key store was brought up to date for this record
    # Set (under the loop watch's lock) when the watchdog took this attempt from a
    # blocked loop: its record's commit, done or not (QueueRuntime.take_blocked).
    taken: Any
    command: bool  # a command to the partition's owner (dueflow.records.command), not a job
    # fired before it was due (emitter.fire_ahead_ms): starts behind the lead fence
    ahead: bool
    progress: Any  # ctx.progress: a progress.AttemptProgress, once reported or seen running

    def __init__(self, feed: PartitionFeed, msg: Any, offset: int) -> None:
        self.feed = feed
        self.msg = msg
        self.offset = offset
        self.fields = None
        self.bad = None
        self.taken = None
        self.expires = None
        self.command = False
        self.ahead = False

    @property
    def planner(self) -> Any:
        """What this attempt's ``ctx.schedule`` goes through (its queue's
        :class:`~dueflow.consumers.follow_ups.FollowUpPlanner`)."""
        return self.feed.planner

    def progressed(self, value: Any) -> None:
        """The handler reported progress (``ctx.progress``; any thread)."""
        reporter = self.feed.reporter
        if reporter is not None:
            reporter.note(self, value)


class PartitionFeed:
    """An assigned exec or retry-tier partition.

    ``backlog`` holds delivered records not dispatched yet, in offset order;
    ``aside`` the records set aside until they are due (a heap of due time,
    offset, record: due soon, they do not hold the records behind them);
    ``tracker`` knows which delivered offsets have not finished. The feed is
    dispatchable when it is :attr:`FeedState.LOADED` and not held (head record
    not due, rate limit, a recheck of the keys). ``state`` moves only through
    :meth:`advance` (:mod:`dueflow.consumers.feed_states`).
    """

    __slots__ = (
        "aside",
        "aside_timer",
        "backlog",
        "checking",
        "committed",
        "fence_goal",
        "fence_ms",
        "fence_probe",
        "fenced",
        "gone",
        "held_until",
        "in_ready",
        "inflight",
        "keys",
        "loaded",
        "partition",
        "paused",
        "planner",
        "rate_held",
        "reporter",
        "revoked",
        "state",
        "tier_ms",
        "timer",
        "topic",
        "tp",
        "tracker",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        tier_ms: int | None,
        keys: KeyStore,
        planner: Any = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.tp = TopicPartition(topic, partition)
        self.tier_ms = tier_ms  # None: the exec topic
        self.keys = keys
        self.backlog: deque[Delivery] = deque()
        self.aside: list[tuple[int, int, Delivery]] = []
        self.aside_timer: asyncio.TimerHandle | None = None
        # The lead fence (dueflow.consumers.lead_fence): every record appended before
        # fence_ms (broker ms) is handled; an answer not reached yet; the jobs waiting.
        self.fence_ms = 0
        self.fence_goal: tuple[int, int] | None = None
        self.fence_probe: asyncio.TimerHandle | None = None
        self.fenced: list[tuple[int, int, Delivery]] = []  # a heap: due, offset, record
        self.tracker = OffsetTracker()
        self.committed: int | None = None  # last offset committed for this partition
        self.inflight = 0
        self._set_state(FeedState.ASSIGNED)
        self.held_until = 0  # wall ms: the head record is not due before
        self.rate_held = False
        self.checking = False  # waiting for the key store to catch up (a redriven record)
        self.paused = False
        self.in_ready = False
        self.timer: asyncio.TimerHandle | None = None
        self.planner = planner  # ctx.schedule's FollowUpPlanner of the queue
        self.reporter: Any = None  # ctx.progress's ProgressReporter of the queue

    def advance(self, to: FeedState) -> None:
        """Move to ``to``; :class:`~dueflow.errors.IllegalTransition` when it cannot."""
        self._set_state(feed_move(self.state, to))

    def _set_state(self, state: FeedState) -> None:
        # What the hot path asks of the state, kept as attributes (read per record).
        self.state = state
        # Its keys are loaded and it is still assigned: records may be dispatched.
        self.loaded = state is FeedState.LOADED
        # Forgotten: what finishes of it now writes nothing.
        self.gone = state is FeedState.GONE
        # No longer read from: revoked (maybe finishing in-flight jobs) or gone.
        self.revoked = self.gone or state is FeedState.REVOKED

    @property
    def held(self) -> bool:
        return self.held_until > 0 or self.rate_held or self.checking

    @property
    def waiting(self) -> int:
        """Records delivered and not dispatched yet (the backlog and those set aside)."""
        return len(self.backlog) + len(self.aside) + len(self.fenced)

    def drop_undispatched(self) -> None:
        """Forget the records not dispatched yet: the partition's next owner reads them."""
        self.backlog.clear()
        self.aside.clear()
        self.fenced.clear()
        self.fence_goal = None
        for timer in (self.aside_timer, self.fence_probe):
            if timer is not None:
                timer.cancel()
        self.aside_timer = None
        self.fence_probe = None

    def __repr__(self) -> str:
        return f"PartitionFeed({self.topic}[{self.partition}], backlog={len(self.backlog)})"


# ---------------------------------------------------------------------- decoding

_JSON = "application/json"
_COMMAND_KINDS = frozenset(k.encode() for k in hdr.COMMAND_KINDS)
_NOTICE = hdr.NOTICE


@dataclass(frozen=True, slots=True)
class WireLimits:
    """What a worker allows of the times on a record (see :mod:`dueflow.records.job_checks`):
    the clock skew between processes and the queue's retry tiers."""

    skew_ms: int = DEFAULT_CLOCK_SKEW_MS
    tiers_ms: tuple[int, ...] = ()


def prepare(d: Delivery, registry: TaskRegistry, *, now_ms: int, limits: WireLimits) -> None:
    """Decode and check a record once it is at the head of its partition.

    Sets ``fields`` (the Job), ``key``, ``attempt``, ``not_before``, ``expires``,
    the task and the decoded payload, or ``bad`` with the dead-letter reason:
    ``undecodable`` (value or payload), ``out_of_range`` (a header or field out
    of its range: :mod:`dueflow.records.job_checks`) or ``unknown_task``. A bad
    record is due at once (``not_before`` 0): it never holds its partition.
    Never raises: whatever goes wrong here dead-letters the record. A command
    (``df-kind`` ``steer``, ...) only gets ``command`` set: its applier decodes it.
    """
    try:
        _prepare(d, registry, now_ms, limits)
    except Exception as exc:  # a record must never stop its partition
        _unreadable(d, exc)


_READ_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("hmap", {}),
    ("key", b""),
    ("attempt", 1),
    ("max_attempts", 1),
    ("rechecked", False),
    ("span", None),
    ("payload", None),
)


def _unreadable(d: Delivery, exc: Exception) -> None:
    """``d`` could not be read (a bug, not bad input): dead-lettered at once, with every
    attribute the runtime reads set."""
    for name, default in _READ_DEFAULTS:
        if not hasattr(d, name):
            setattr(d, name, dict(default) if isinstance(default, dict) else default)
    d.fields = None
    d.task = None
    d.not_before = 0
    d.expires = None
    d.bad = (UNDECODABLE, permanent(type(exc).__name__, f"record not readable: {exc!r}"))


def _prepare(d: Delivery, registry: TaskRegistry, now_ms: int, limits: WireLimits) -> None:
    # Once per record on the worker's hot path: kept in one frame (over 80 lines);
    # the checks it calls are the ones every other reader uses.
    msg = d.msg
    raw = msg.headers()
    hmap: dict[str, bytes] = dict(raw) if raw else {}
    d.hmap = hmap
    d.task = None
    d.payload = None
    d.span = None
    d.progress = None
    d.rechecked = False
    d.max_attempts = 1
    d.attempt = 1
    d.not_before = 0
    d.expires = None
    key = msg.key()
    d.key = key or b""
    kind = hmap.get(hdr.KIND)
    if kind is not None and kind in _COMMAND_KINDS:  # decoded by its applier (commands.py)
        d.command = True
        return
    if _NOTICE in hmap:  # a group member's end, fired as a job timer (groups.py)
        d.command = True
        return
    try:
        fields = decode_job_fields(msg.value() or b"", hmap.get(hdr.SCHEMA))
    except UndecodableRecord as exc:
        reason = OUT_OF_RANGE if isinstance(exc, FieldOutOfRange) else UNDECODABLE
        d.bad = (reason, permanent(type(exc).__name__, str(exc)))
        return
    try:
        check_job(fields)
    except FieldOutOfRange as exc:  # the value's fields are not used: the headers say who
        d.bad = (OUT_OF_RANGE, permanent("FieldOutOfRange", str(exc)))
        return
    if key is None:
        key = fields[F_KEY].encode()
    d.key = key
    task = registry.get(fields[F_TASK])
    try:
        if not 0 < len(key) <= MAX_KEY_BYTES:
            raise FieldOutOfRange("key", key, f"1 to {MAX_KEY_BYTES} bytes (the idempotency key)")
        d.attempt = attempt_of(hmap)
        if d.feed.tier_ms is None:
            d.not_before = exec_not_before(
                hmap, fields[F_DUE_MS], now_ms=now_ms, skew_ms=limits.skew_ms
            )
            fired = hmap.get(hdr.FIRED)
            if fired is not None and fired.isdigit():
                fired_ms = int(fired)
                if fired_ms < d.not_before:
                    d.ahead = True
                # The emitter stamps a fire with the broker's time (its lower bound)
                # before sending it: every record appended before then is in front of
                # this one, at the head now, so handled (the lead fence).
                feed = d.feed
                if feed.fence_ms < fired_ms <= now_ms:
                    feed.fence_ms = fired_ms
        else:
            longest = longest_retry_delay_ms(
                limits.tiers_ms, fields[F_BACKOFF], task.spec.backoff if task else None
            )
            d.not_before = retry_not_before(
                hmap,
                fields[F_DUE_MS],
                now_ms=now_ms,
                skew_ms=limits.skew_ms,
                longest_delay_ms=longest,
            )
        if hdr.EXPIRES in hmap:
            d.expires = expires_of(hmap)
        if hdr.OVERLAP in hmap:
            overlap_of(hmap)
    except FieldOutOfRange as exc:
        d.fields = fields  # the value is good: the DLQ record names the job by it
        d.not_before = 0
        d.bad = (OUT_OF_RANGE, permanent("FieldOutOfRange", str(exc)))
        return
    d.fields = fields
    if task is None:
        known = sorted(t.spec.name for t in registry)[:20]
        d.bad = (
            UNKNOWN_TASK,
            permanent(
                "UnknownTask",
                f"no handler for task {fields[F_TASK]!r} in this worker (known: {known})",
            ),
        )
        return
    d.task = task
    content_type = fields[F_CONTENT_TYPE]
    payload = fields[F_PAYLOAD]
    if content_type == _JSON:
        try:
            d.payload = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            d.bad = (UNDECODABLE, permanent("UndecodablePayload", f"JSON payload: {exc}"))
    elif content_type.startswith("text/"):
        try:
            d.payload = payload.decode()
        except UnicodeDecodeError as exc:
            d.bad = (UNDECODABLE, permanent("UndecodablePayload", f"text payload: {exc}"))
    else:
        d.payload = payload


def attempt_limits(
    task: RegisteredTask, fields: JobFields, ws: WorkerSettings
) -> tuple[int, float]:
    """``(max_attempts, timeout_s)`` of a job's attempt: the task's settings first, then
    the job record's, then the worker's defaults."""
    spec = task.spec
    max_attempts = spec.max_attempts or fields[F_MAX_ATTEMPTS]
    if max_attempts < 1:
        max_attempts = ws.default_max_attempts
    if spec.timeout_s is not None:
        timeout_s = spec.timeout_s
    elif fields[F_TIMEOUT_MS]:
        timeout_s = fields[F_TIMEOUT_MS] / 1000
    else:
        timeout_s = ws.default_timeout_s
    return max_attempts, timeout_s


def int_or(raw: bytes | None, default: int) -> int:
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def identity(d: Delivery) -> tuple[str, str, str]:
    """(job id, task, idempotency key) of a record, decodable or not."""
    fields = d.fields
    if fields is not None:
        return fields[F_JOB_ID], fields[F_TASK], fields[F_KEY]
    hmap = d.hmap
    job = hmap.get(hdr.JOB_ID)
    task = hmap.get(hdr.TASK)
    key = d.key.decode("utf-8", "replace")
    return (
        job.decode("utf-8", "replace") if job else key,
        task.decode("utf-8", "replace") if task else "",
        key,
    )


def trace_id(d: Delivery) -> str | None:
    """The trace id of the job (its attempt's span, the ``traceparent`` header, else
    the job's trace map)."""
    if d.span is not None and d.span.trace_id is not None:
        return str(d.span.trace_id)
    raw = d.hmap.get(hdr.TRACEPARENT)
    if raw is None and d.fields is not None:
        text = d.fields[F_TRACE].get(hdr.TRACEPARENT)
        raw = text.encode() if text else None
    if raw is None:
        return None
    parts = raw.split(b"-")
    return parts[1].decode("ascii", "replace") if len(parts) >= 4 else None
