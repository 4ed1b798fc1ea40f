"""What a worker accepts of a job record read from an exec or retry topic (pure).

Every header and field a worker acts on is read here, before the record
takes a concurrency slot, holds its partition or reaches a log line. A value
outside its range raises :class:`~dueflow.errors.FieldOutOfRange` (field,
value, what is accepted): the worker dead-letters the record at once with
reason ``out_of_range``, where an operator can read why and redrive it
(a redrive writes attempt 1 and ``df-due`` now).

- :func:`check_job`: the Avro value's fields (``dueflow.Job``).
- :func:`attempt_of`: ``df-attempt``.
- :func:`exec_not_before`, :func:`retry_not_before`: the record's "not
  before" (``df-due``, else the value's ``due_ms``), bounded so that no
  record can hold its partition for longer than a real one could:

  * an exec record is written when its job is due (the emitter fires a timer
    at its due time; a redrive writes ``df-due`` = now), so its ``df-due`` is
    no later than the time it was written (``df-redriven-at``, else
    ``df-fired``, else the reader's now) plus the clock skew allowed between
    processes; and that time is not in the future either;
  * a retry record is due its backoff after the failure that made it, so its
    ``df-due`` is no later than ``df-last-failure`` (else now) plus the
    longest retry delay the queue and the job allow
    (:func:`longest_retry_delay_ms`) plus the skew.

- :func:`expires_of`, :func:`overlap_of`: ``df-expires``, ``df-overlap``.

``now_ms`` and the skew are arguments: nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dueflow import headers as hdr
from dueflow.errors import FieldOutOfRange
from dueflow.model import Backoff, BackoffKind
from dueflow.rules.wire_bounds import (
    ATTEMPT_ACCEPTED,
    MAX_DUE_MS,
    MAX_ID_CHARS,
    MAX_INT32,
    MAX_LONG,
    MAX_NAME_CHARS,
    MIN_TIME_MS,
    MS_ACCEPTED,
    check_backoff,
    decimal,
    header_ms,
    in_range,
    name,
)

_JSON = "application/json"
CONTENT_TYPE_ACCEPTED = f"1 to {MAX_NAME_CHARS} printable ASCII characters"
TIMEOUT_ACCEPTED = f"null (the worker's default) or an integer from 1 to {MAX_LONG} ms"
OVERLAP_POLICIES = (b"allow", b"skip", b"buffer_one")


# ------------------------------------------------------------------------ value


def check_job(f: Sequence[Any]) -> None:
    """Check the fields of a decoded Job (the tuple of
    :func:`dueflow.records.worker_codec.decode_job_fields`, in :class:`~dueflow.model.Job`
    order); :class:`FieldOutOfRange` names the first one out of range."""
    # One expression for the common case (this runs for every job); the slow
    # path below finds the field and says why.
    job_id, queue, _task, _payload, due, key, created, ctype, attempts = f[:9]
    if (
        type(job_id) is str
        and 0 < len(job_id) <= MAX_ID_CHARS
        and type(queue) is str
        and 0 < len(queue) <= MAX_NAME_CHARS
        and type(key) is str
        and 0 < len(key) <= MAX_ID_CHARS
        and type(due) is int
        and MIN_TIME_MS <= due <= MAX_DUE_MS
        and type(created) is int
        and MIN_TIME_MS <= created <= MAX_DUE_MS
        and (ctype == _JSON or _content_type_ok(ctype))
        and type(attempts) is int
        and 0 < attempts <= MAX_INT32
        and f[9] is None
        and f[10] is None
        and f[11] == 0
        and f[13] is None
        and f[14] is None
        and (f[15] is None or (type(f[15]) is str and len(f[15]) <= MAX_NAME_CHARS))
    ):
        return
    _explain(f)


def _content_type_ok(value: object) -> bool:
    return (
        type(value) is str
        and 0 < len(value) <= MAX_NAME_CHARS
        and value.isascii()
        and value.isprintable()
    )


def _explain(f: Sequence[Any]) -> None:
    """Raise :class:`FieldOutOfRange` for the first field of ``f`` out of range."""
    (
        job_id,
        queue,
        _task,
        _payload,
        due,
        key,
        created,
        ctype,
        attempts,
        backoff,
        timeout,
        jitter,
        _trace,
        schedule_id,
        schedule_version,
        content_hash,
        _labels,
    ) = f
    name(job_id, "job_id", most=MAX_ID_CHARS)
    name(queue, "queue")
    name(key, "idempotency_key", most=MAX_ID_CHARS)
    in_range(due, "due_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED)
    in_range(created, "created_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED)
    if not _content_type_ok(ctype):
        raise FieldOutOfRange("content_type", ctype, CONTENT_TYPE_ACCEPTED)
    in_range(attempts, "max_attempts", low=1, high=MAX_INT32, accepted=ATTEMPT_ACCEPTED)
    if backoff is not None:
        check_backoff(backoff)
    if timeout is not None:
        in_range(timeout, "timeout_ms", low=1, high=MAX_LONG, accepted=TIMEOUT_ACCEPTED)
    in_range(jitter, "jitter_ms", low=0, high=MAX_DUE_MS, accepted=f"0 to {MAX_DUE_MS} ms")
    if schedule_id is not None:
        name(schedule_id, "schedule_id", most=MAX_ID_CHARS)
    if schedule_version is not None:
        in_range(
            schedule_version,
            "schedule_version",
            low=0,
            high=MAX_LONG,
            accepted=f"null or an integer from 0 to {MAX_LONG}",
        )
    if content_hash is not None and (
        type(content_hash) is not str or len(content_hash) > MAX_NAME_CHARS
    ):
        raise FieldOutOfRange(
            "content_hash", content_hash, f"null or at most {MAX_NAME_CHARS} characters"
        )


# ---------------------------------------------------------------------- headers


def attempt_of(hmap: Mapping[str, bytes]) -> int:
    """``df-attempt`` (1 when absent): an integer from 1 to an Avro int's largest."""
    raw = hmap.get(hdr.ATTEMPT)
    if raw is None:
        return 1
    if raw == b"2":
        return 2
    return decimal(raw, hdr.ATTEMPT, low=1, high=MAX_INT32, accepted=ATTEMPT_ACCEPTED)


def expires_of(hmap: Mapping[str, bytes]) -> int | None:
    """``df-expires``, the job's deadline (None when absent)."""
    raw = hmap.get(hdr.EXPIRES)
    return None if raw is None else header_ms(raw, hdr.EXPIRES)


def overlap_of(hmap: Mapping[str, bytes]) -> bytes | None:
    """``df-overlap``, a cron occurrence's overlap policy (None when absent)."""
    raw = hmap.get(hdr.OVERLAP)
    if raw is not None and raw not in OVERLAP_POLICIES:
        raise FieldOutOfRange(hdr.OVERLAP, raw, "allow, skip or buffer_one")
    return raw


def _past(hmap: Mapping[str, bytes], header: str, *, latest_ms: int) -> int | None:
    """A time header that says when something happened: in range, and not after
    ``latest_ms`` (now plus the skew)."""
    raw = hmap.get(header)
    if raw is None:
        return None
    at = header_ms(raw, header)
    if at > latest_ms:
        raise FieldOutOfRange(
            header, raw, f"a time in the past: at most {latest_ms} (now plus the clock skew)"
        )
    return at


def _failures(hmap: Mapping[str, bytes], latest_ms: int) -> int | None:
    """``df-first-failure`` and ``df-last-failure`` (in the past); the last one."""
    if hdr.FIRST_FAILURE in hmap:
        _past(hmap, hdr.FIRST_FAILURE, latest_ms=latest_ms)
    return _past(hmap, hdr.LAST_FAILURE, latest_ms=latest_ms)


def _due(hmap: Mapping[str, bytes], due_ms: int, *, latest_ms: int, why: str) -> int:
    raw = hmap.get(hdr.DUE)
    due = due_ms if raw is None else header_ms(raw, hdr.DUE)
    if due > latest_ms:
        raise FieldOutOfRange(
            hdr.DUE if raw is not None else "due_ms",
            raw if raw is not None else due,
            f"a time no later than {latest_ms}: {why}",
        )
    return due


def exec_not_before(hmap: Mapping[str, bytes], due_ms: int, *, now_ms: int, skew_ms: int) -> int:
    """The "not before" of an exec record: ``df-due`` (else the value's ``due_ms``),
    no later than when the record was written plus ``skew_ms`` (see the module doc)."""
    # The common case (a fired job, due and fire time of 13 digits) in one expression.
    fired_raw = hmap.get(hdr.FIRED)
    due_raw = hmap.get(hdr.DUE)
    if (
        fired_raw is not None
        and due_raw is not None
        and len(fired_raw) == 13
        and len(due_raw) == 13
        and fired_raw.isdigit()
        and due_raw.isdigit()
        and hdr.REDRIVEN_AT not in hmap
        and hdr.LAST_FAILURE not in hmap
        and hdr.FIRST_FAILURE not in hmap
    ):
        fired = int(fired_raw)
        due = int(due_raw)
        if fired <= now_ms + skew_ms and due <= fired + skew_ms:
            return due
    latest = now_ms + skew_ms
    written = now_ms
    if hdr.FIRED in hmap:
        written = _past(hmap, hdr.FIRED, latest_ms=latest) or 0
    if hdr.REDRIVEN_AT in hmap:
        written = _past(hmap, hdr.REDRIVEN_AT, latest_ms=latest) or 0
    if hdr.LAST_FAILURE in hmap or hdr.FIRST_FAILURE in hmap:
        _failures(hmap, latest)
    return _due(
        hmap,
        due_ms,
        latest_ms=written + skew_ms,
        why=f"an exec record is due when it is written (df-fired, df-redriven-at) "
        f"give or take the clock skew ({skew_ms} ms)",
    )


def retry_not_before(
    hmap: Mapping[str, bytes],
    due_ms: int,
    *,
    now_ms: int,
    skew_ms: int,
    longest_delay_ms: int,
) -> int:
    """The "not before" of a retry record: ``df-due`` (else ``due_ms``), no later than
    ``df-last-failure`` (else now) plus ``longest_delay_ms`` plus ``skew_ms``."""
    latest = now_ms + skew_ms
    if hdr.FIRED in hmap:
        _past(hmap, hdr.FIRED, latest_ms=latest)
    failed = _failures(hmap, latest)
    base = now_ms if failed is None else failed
    return _due(
        hmap,
        due_ms,
        latest_ms=base + longest_delay_ms + skew_ms,
        why=f"a retry is due at most {longest_delay_ms} ms (the longest retry delay of "
        f"its queue and job) after its df-last-failure, give or take the clock skew "
        f"({skew_ms} ms)",
    )


def ms_or(raw: bytes | None, default: int) -> int:
    """A time header's value, or ``default`` when it is absent or out of range (for the
    records a worker writes about a record it refused: they must encode)."""
    if raw is None:
        return default
    try:
        return header_ms(raw, "time")
    except FieldOutOfRange:
        return default


def longest_retry_delay_ms(tiers_ms: Sequence[int], *policies: Backoff | None) -> int:
    """The longest delay a failed attempt can be retried after: the queue's top tier,
    or a policy's cap (a policy's delays never pass its ``max_ms``;
    :func:`dueflow.rules.backoff.compute_backoff`)."""
    longest = max(tiers_ms) if tiers_ms else 0
    for policy in policies:
        if policy is not None and policy.kind is not BackoffKind.NONE:
            longest = max(longest, policy.max_ms)
    return min(longest, MAX_DUE_MS)
