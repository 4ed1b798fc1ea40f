"""The Kafka header contract of dueflow.

Timer records carry everything the emitter needs in headers, so it never
decodes a value: it forwards the value bytes unchanged. Any Kafka client can
schedule a job by writing a record with these headers (see
docs/wire-format.md). Header values are UTF-8 text; numbers are ASCII
decimal.

Timer record (topic ``<prefix>.timers``):

========================  =====================================================
header                    meaning
========================  =====================================================
``df-due``     required   UTC epoch milliseconds at or after which the job runs
``df-queue``   required   queue name: the job goes to ``<prefix>.exec.<queue>``
``df-kind``    optional   ``job`` (default) or ``cron`` (a schedule occurrence)
``df-job``     optional   job id, for logs and traces
``df-task``    optional   task name, for logs and metrics
``df-schedule``  cron     schedule id of an occurrence
``df-sv``        cron     schedule version the occurrence was computed from
``df-occurrence``  cron   the occurrence's nominal instant (ms, before jitter)
``df-partition``          optional: the exec partition a job fires into
                          (default: by key); workers set it on a retry they
                          send back through the wheel (the job keeps its
                          partition)
``df-parent``  optional   job id of the job whose handler scheduled this one
                          (``ctx.schedule``: the worker writes the timer in
                          that job's transaction), for logs and tracing
``df-schema``  optional   value schema, e.g. ``dueflow.Job/1``
``df-expires`` optional   UTC epoch ms: a job not started by then is not run
                          (outcome ``expired``; a worker decides at start)
``df-overlap`` cron       the schedule's overlap policy when not ``allow``
``traceparent``           W3C trace context (``tracestate`` too)
``df-trace-link``         W3C ``traceparent`` of the job's previous step, when
                          that step is not the parent (see dueflow.observability.tracing)
``df-version``            the version token of this timer: the id of the command
                          that made it (absent: the job as scheduled). Written
                          only by the worker that owns the job's exec partition
``df-unique``             the unique key a worker admitted the job under
``df-group``              ``<group id>@<queue>:<partition>`` of a group member
``df-parent-result``      the parent's result (UTF-8 JSON) for a job scheduled
                          with ``ctx.schedule(..., pass_result=True)``; absent
                          when the parent returned None
``df-parent-result-error``  why the parent's result is not passed (not JSON, too
                          large): the parent still succeeded
``df-group-results``      the members' states and results, on a group's callback
``df-notice``             ``member-ended``: a group member's end on its way to the
                          group's owner through the timer wheel (a command, though
                          its ``df-kind`` is ``job`` for the emitter)
========================  =====================================================

Command records (topic ``<prefix>.exec.<queue>``, on the job's exec partition,
key: the target key followed by ``\x00cmd``; value: ``dueflow.Command``) carry
``df-kind`` ``steer``, ``admit``, ``group`` or ``member-ended``, ``df-due`` ``0``
(never held), ``df-job``, ``df-queue`` and ``df-schema``. Every reader of an exec
topic tells them from jobs by ``df-kind`` (:func:`is_command`).

The record key is the job's idempotency key; it becomes the exec record's
key, which chooses the exec partition (murmur2, like Java's default
partitioner). Exec, retry and DLQ records add:

``df-fired``  emitter fire time (ms);  ``df-attempt``  1-based attempt number;
``df-first-failure`` / ``df-last-failure`` (ms);  ``df-error`` short reason;
``df-src`` ``topic:partition:offset`` of the timer record that fired it.

Retry records (``<prefix>.retry.<queue>.<tier>``) are the failed record's
value bytes, unchanged, with the failed record's headers and these set by
the worker:

=======================  ======================================================
header                   meaning
=======================  ======================================================
``df-attempt``           the attempt this record runs as (2 for the first retry)
``df-due``               not before: UTC epoch ms at or after which the retry
                         runs (a worker never runs a record before its df-due)
``df-first-failure``     UTC epoch ms of the job's first failed attempt
``df-last-failure``      UTC epoch ms of the failure that made this retry
``df-error``             ``<exception type>: <message>`` of that failure
                         (at most 200 characters)
``df-origin``            ``topic:partition:offset`` of the exec record the job
                         first ran from (reported in the DLQ record)
=======================  ======================================================

Exec records without ``df-attempt`` run as attempt 1. A worker writes its
records with an explicit partition: the partition the job was read from.

Records the operator tools write again (``dueflow replay``, ``dueflow dlq
redrive``) carry who and when:

=======================  ======================================================
header                   meaning
=======================  ======================================================
``df-redriven-by``       who redrove a dead job (``dueflow dlq redrive --by``)
``df-redriven-at``       when (UTC epoch ms); a worker that finds the key of
                         such a record final reads its key store up to date
                         before it decides (the redrive cleared the state)
``df-redriven-from``     ``topic:partition:offset`` of the DLQ record
``df-replayed-from``     ``topic:partition:offset`` of the record replayed
``df-replayed-by``       who replayed it (``dueflow replay``)
``df-replayed-at``       when (UTC epoch ms)
=======================  ======================================================

A ``scheduled`` outcome (``<prefix>.outcomes``, written by the scheduling
client) may carry ``df-content-hash``: the job's ``content_hash``, so that a
client in another process can tell a job id reused with other content
(``Scheduler(check_existing_ids=True)``, ``dueflow schedule --job-id``).

A worker's ``retrying`` outcome carries ``df-next-due``: when the next attempt
is due (UTC epoch ms, the ``df-due`` of the retry record it wrote in the same
transaction). The outcome's ``due_ms`` stays the failed attempt's due time.

A dead letter that could not hold the job's value
carries ``df-value-ref``: ``topic:partition:offset`` of the record that holds
it (in ``job_headers`` and on the record; see dueflow.records.set_aside).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

DUE = "df-due"
QUEUE = "df-queue"
KIND = "df-kind"
JOB_ID = "df-job"
TASK = "df-task"
SCHEDULE = "df-schedule"
SCHEDULE_VERSION = "df-sv"
OCCURRENCE = "df-occurrence"
PARTITION = "df-partition"
PARENT = "df-parent"
SCHEMA = "df-schema"
EXPIRES = "df-expires"
OVERLAP = "df-overlap"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_LINK = "df-trace-link"
VERSION = "df-version"
UNIQUE = "df-unique"
GROUP = "df-group"
PARENT_RESULT = "df-parent-result"
PARENT_RESULT_ERROR = "df-parent-result-error"
GROUP_RESULTS = "df-group-results"
NOTICE = "df-notice"

FIRED = "df-fired"
ATTEMPT = "df-attempt"
FIRST_FAILURE = "df-first-failure"
LAST_FAILURE = "df-last-failure"
ERROR = "df-error"
SOURCE = "df-src"
ORIGIN = "df-origin"
REDRIVEN_BY = "df-redriven-by"
REDRIVEN_AT = "df-redriven-at"
REDRIVEN_FROM = "df-redriven-from"
REPLAYED_FROM = "df-replayed-from"
REPLAYED_BY = "df-replayed-by"
REPLAYED_AT = "df-replayed-at"
CONTENT_HASH = "df-content-hash"
VALUE_REF = "df-value-ref"
NEXT_DUE = "df-next-due"  # on a `retrying` outcome: the next attempt's due time

KIND_JOB = "job"
KIND_CRON = "cron"
# Commands to the worker that owns an exec partition (dueflow.records.command).
KIND_STEER = "steer"
KIND_ADMIT = "admit"
KIND_GROUP = "group"
KIND_MEMBER_ENDED = "member-ended"
COMMAND_KINDS = frozenset({KIND_STEER, KIND_ADMIT, KIND_GROUP, KIND_MEMBER_ENDED})
_COMMAND_KIND_BYTES = frozenset(k.encode() for k in COMMAND_KINDS)

Headers = list[tuple[str, bytes]]


def header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    """Last value of header ``name`` (Kafka allows repeats; the last one wins)."""
    if not headers:
        return None
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found


def is_command(headers: Any) -> bool:
    """Whether a record of an exec topic is a command, not a job (its ``df-kind``);
    ``headers``: a record's header pairs as any Kafka client returns them."""
    return header(headers, KIND) in _COMMAND_KIND_BYTES or header(headers, NOTICE) is not None


def header_text(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    raw = header(headers, name)
    return None if raw is None else raw.decode("utf-8", "replace")


def header_int(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> int | None:
    """Header ``name`` as an int; ``None`` if absent. ``ValueError`` if not a number."""
    raw = header(headers, name)
    return None if raw is None else int(raw)


def encode(pairs: Iterable[tuple[str, str | int | bytes | None]]) -> Headers:
    """Headers from ``(name, value)`` pairs, skipping ``None`` values."""
    out: Headers = []
    for key, value in pairs:
        if value is None:
            continue
        if isinstance(value, bytes):
            out.append((key, value))
        else:
            out.append((key, str(value).encode()))
    return out


def source_of(topic: str, partition: int, offset: int) -> bytes:
    """``topic:partition:offset`` of a record: the value of ``df-src``, ``df-origin``,
    ``df-redriven-from`` and ``df-replayed-from``."""
    return f"{topic}:{partition}:{offset}".encode()


def fired(headers: Headers, *, fired_at: bytes, source: bytes | None = None) -> Headers:
    """The headers of the exec record a timer fires as: the timer's own, then
    ``df-fired`` (``fired_at``: the fire time in ms, ASCII) and ``df-src``
    (``source``, see :func:`source_of`; ``None`` when the headers carry it
    already, as a cron occurrence's do). Appends to ``headers`` in place (the
    emitter's hot path) and returns them."""
    headers.append((FIRED, fired_at))
    if source is not None:
        headers.append((SOURCE, source))
    return headers


def replace(
    headers: Sequence[tuple[str, bytes | None]] | None,
    updates: Iterable[tuple[str, str | int | bytes | None]],
) -> Headers:
    """A copy of ``headers`` with the names in ``updates`` set (``None`` removes)."""
    new = list(updates)
    names = {k for k, _ in new}
    kept: Headers = [(k, v) for k, v in (headers or []) if k not in names and v is not None]
    return kept + encode(new)
