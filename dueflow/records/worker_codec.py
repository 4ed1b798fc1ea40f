"""Hand-written Avro binary for the records a worker handles per job.

A worker decodes one Job and encodes one Outcome and one IdempotencyRecord
per job: with fastavro that is ~20 us of a ~30 us budget per job. These
functions do the same for version 1 of those schemas in a few
microseconds, byte for byte what fastavro writes (the unit tests compare
them on generated records). Any other schema version goes through
:mod:`dueflow.records.codec`, which resolves versions.

Outcome versions 1 and 2 have the same layout (2 adds enum symbols);
version 3 appends optional fields, so a version 3 value is the version 2
bytes followed by those fields (:func:`encode_outcome_v3`). Writers keep
writing version 1 or 2 when nothing of version 3 is used.
"""

from __future__ import annotations

import struct
from typing import Any

from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.records import codec
from dueflow.records.framing import unframe_job
from dueflow.records.varint import varint
from dueflow.rules.job_state import OUTCOME_STATES, OUTCOME_STATES_V1, OUTCOME_STATES_V2
from dueflow.rules.wire_bounds import MAX_DUE_MS, MAX_INT32, MIN_TIME_MS, MS_ACCEPTED, in_range

JOB_V1 = b"dueflow.Job/1"
OUTCOME_V1 = b"dueflow.Outcome/1"
OUTCOME_V2 = b"dueflow.Outcome/2"  # adds the states rescheduled, expired, skipped
# adds the states updated, refused, deduplicated and the fields after schedule_id
OUTCOME_V3 = b"dueflow.Outcome/3"
IDEMPOTENCY_V1 = b"dueflow.IdempotencyRecord/1"
# Version 2 added the state `retrying` (the same bytes as version 1 otherwise).
IDEMPOTENCY_V2 = b"dueflow.IdempotencyRecord/2"

_BACKOFF_KINDS = (BackoffKind.EXPONENTIAL, BackoffKind.FIXED, BackoffKind.NONE)
JOB_STATES = OUTCOME_STATES  # the outcome schema's `state` symbols, by index
_JOB_STATE_INDEX = {s: i for i, s in enumerate(JOB_STATES)}
V2_STATES = frozenset(OUTCOME_STATES_V2[len(OUTCOME_STATES_V1) :])
V3_STATES = frozenset(OUTCOME_STATES[len(OUTCOME_STATES_V2) :])
KEY_STATES = ("done", "dead", "cancelled", "retrying")
KEY_STATES_V1 = KEY_STATES[:3]
_KEY_STATE_INDEX = {s: i for i, s in enumerate(KEY_STATES)}
_DOUBLE = struct.Struct("<d")


# --------------------------------------------------------------------------- decoding


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Avro int or long) at ``pos``: ``(value, next position)``."""
    b = data[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    n = b & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = _varint(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise ValueError("bytes run past the end")
    return data[pos:end], end


def _str(data: bytes, pos: int) -> tuple[str, int]:
    size, pos = _varint(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise ValueError("string runs past the end")
    return data[pos:end].decode(), end


def _opt_index(data: bytes, pos: int) -> tuple[bool, int]:
    branch, pos = _varint(data, pos)
    if branch not in (0, 1):
        raise ValueError(f"union branch {branch}")
    return branch == 1, pos


def _str_map(data: bytes, pos: int) -> tuple[dict[str, str], int]:
    out: dict[str, str] = {}
    while True:
        count, pos = _varint(data, pos)
        if count == 0:
            return out, pos
        if count < 0:
            count = -count
            _size, pos = _varint(data, pos)
        for _ in range(count):
            key, pos = _str(data, pos)
            out[key], pos = _str(data, pos)


# Positions of the fields in the tuple of :func:`decode_job_fields` (``Job`` order).
(
    F_JOB_ID,
    F_QUEUE,
    F_TASK,
    F_PAYLOAD,
    F_DUE_MS,
    F_KEY,
    F_CREATED_MS,
    F_CONTENT_TYPE,
    F_MAX_ATTEMPTS,
    F_BACKOFF,
    F_TIMEOUT_MS,
    F_JITTER_MS,
    F_TRACE,
    F_SCHEDULE_ID,
    F_SCHEDULE_VERSION,
    F_CONTENT_HASH,
    F_LABELS,
) = range(17)

JobFields = tuple[Any, ...]  # the 17 fields of a Job, in dataclass order


def decode_job(data: bytes, schema: bytes | None = None) -> Job:
    """A :class:`Job` from its Avro value; ``schema`` is the ``df-schema`` header.

    Raises :class:`UndecodableRecord` when the bytes are not a Job.
    """
    return Job(*decode_job_fields(data, schema))


def decode_job_fields(data: bytes, schema: bytes | None = None) -> JobFields:
    """The fields of a Job value as a tuple in :class:`Job` order (``Job(*fields)``).

    The worker's hot path keeps the tuple and builds a ``Job`` only when a
    handler asks for it. A value in the Confluent wire format (registry
    framing, :mod:`dueflow.records.framing`) is read as well as a plain one.
    Raises :class:`UndecodableRecord` on bad bytes.
    """
    if schema is not None and schema != JOB_V1:
        data, schema, _ = unframe_job(data, schema)
        if schema != JOB_V1:
            version = codec.parse_schema_header(schema, expected="job")
            job = Job.from_record(codec.decode("job", data, writer_version=version))
            return tuple(getattr(job, f) for f in Job.__slots__)
    try:
        fields = _job_v1(data)
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise UndecodableRecord(
            f"value is not a valid dueflow.Job record ({type(exc).__name__}: {exc})", cause=exc
        ) from exc
    return fields


def _job_v1(data: bytes) -> JobFields:
    # One function, over 80 lines, on purpose: it runs once per job on the worker's
    # hot path, and a call per field would cost about as much as the decoding.
    # Strings shorter than 64 bytes have a one-byte length: read those inline.
    n = data[0]
    if n < 0x80 and not n & 1:
        pos = 1 + (n >> 1)
        job_id = data[1:pos].decode()
    else:
        job_id, pos = _str(data, 0)
    n = data[pos]
    if n < 0x80 and not n & 1:
        end = pos + 1 + (n >> 1)
        queue = data[pos + 1 : end].decode()
        pos = end
    else:
        queue, pos = _str(data, pos)
    n = data[pos]
    if n < 0x80 and not n & 1:
        end = pos + 1 + (n >> 1)
        task = data[pos + 1 : end].decode()
        pos = end
    else:
        task, pos = _str(data, pos)
    payload, pos = _bytes(data, pos)
    n = data[pos]
    if n < 0x80 and not n & 1:
        end = pos + 1 + (n >> 1)
        content_type = data[pos + 1 : end].decode()
        pos = end
    else:
        content_type, pos = _str(data, pos)
    due_ms, pos = _varint(data, pos)
    n = data[pos]
    if n < 0x80 and not n & 1:
        end = pos + 1 + (n >> 1)
        key = data[pos + 1 : end].decode()
        pos = end
    else:
        key, pos = _str(data, pos)
    n = data[pos]
    if n < 0x80:
        max_attempts = (n >> 1) ^ -(n & 1)
        pos += 1
    else:
        max_attempts, pos = _varint(data, pos)
    backoff = None
    n = data[pos]
    pos += 1
    if n == 2:
        kind, pos = _varint(data, pos)
        base_ms, pos = _varint(data, pos)
        max_ms, pos = _varint(data, pos)
        (multiplier,) = _DOUBLE.unpack_from(data, pos)
        jitter = data[pos + 8]
        pos += 9
        if jitter > 1 or kind < 0:
            raise ValueError("bad backoff")
        backoff = Backoff(_BACKOFF_KINDS[kind], base_ms, max_ms, multiplier, jitter == 1)
    elif n:
        raise ValueError(f"union branch of backoff {n}")
    timeout_ms = None
    n = data[pos]
    pos += 1
    if n == 2:
        timeout_ms, pos = _varint(data, pos)
    elif n:
        raise ValueError(f"union branch of timeout_ms {n}")
    n = data[pos]
    if n < 0x80:
        jitter_ms = (n >> 1) ^ -(n & 1)
        pos += 1
    else:
        jitter_ms, pos = _varint(data, pos)
    created_ms, pos = _varint(data, pos)
    if data[pos] == 0:
        trace: dict[str, str] = {}
        pos += 1
    else:
        trace, pos = _str_map(data, pos)
    schedule_id = schedule_version = content_hash = None
    n = data[pos]
    pos += 1
    if n == 2:
        schedule_id, pos = _str(data, pos)
    elif n:
        raise ValueError(f"union branch of schedule_id {n}")
    n = data[pos]
    pos += 1
    if n == 2:
        schedule_version, pos = _varint(data, pos)
    elif n:
        raise ValueError(f"union branch of schedule_version {n}")
    n = data[pos]
    pos += 1
    if n == 2:
        content_hash, pos = _str(data, pos)
    elif n:
        raise ValueError(f"union branch of content_hash {n}")
    if data[pos] == 0:
        labels: dict[str, str] = {}
        pos += 1
    else:
        labels, pos = _str_map(data, pos)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes")
    return (
        job_id,
        queue,
        task,
        payload,
        due_ms,
        key,
        created_ms,
        content_type,
        max_attempts,
        backoff,
        timeout_ms,
        jitter_ms,
        trace,
        schedule_id,
        schedule_version,
        content_hash,
        labels,
    )


def outcome_header(state: str) -> bytes:
    """The ``df-schema`` header of an Outcome in ``state`` written by :func:`encode_outcome`:
    version 1 (what every reader knows) unless the state is new in version 2. The
    two versions have the same layout, so the bytes are the same. A state new in
    version 3 is written with :func:`encode_outcome_v3` (header :data:`OUTCOME_V3`)."""
    if state in V3_STATES:
        return OUTCOME_V3
    return OUTCOME_V2 if state in V2_STATES else OUTCOME_V1


def decode_key_record(data: bytes, schema: bytes | None = None) -> tuple[str, int, int | None]:
    """``(state, at_ms, run_only_due_ms)`` of an IdempotencyRecord value: the last is
    set on a reschedule (version 3, decoded by the codec; versions 1 and 2 are never
    one)."""
    if schema is not None and schema != IDEMPOTENCY_V2 and schema != IDEMPOTENCY_V1:
        version = codec.parse_schema_header(schema, expected="idempotency")
        rec = codec.decode("idempotency", data, writer_version=version)
        due = rec.get("run_only_due_ms")
        _key_ranges(rec["at_ms"], rec.get("attempts") or 0)
        if due is not None:
            in_range(due, "run_only_due_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED)
        return str(rec["state"]), int(rec["at_ms"]), None if due is None else int(due)
    state, at_ms, _attempts = decode_key_state(data, schema)
    return state, at_ms, None


def _key_ranges(at_ms: object, attempts: object) -> None:
    """The numbers of an IdempotencyRecord: :class:`FieldOutOfRange` unless in range."""
    if type(at_ms) is not int or not MIN_TIME_MS <= at_ms <= MAX_DUE_MS:
        raise FieldOutOfRange("at_ms", at_ms, MS_ACCEPTED)
    if type(attempts) is not int or not 0 <= attempts <= MAX_INT32:
        raise FieldOutOfRange("attempts", attempts, f"an integer from 0 to {MAX_INT32}")


def decode_key_state(data: bytes, schema: bytes | None = None) -> tuple[str, int, int]:
    """``(state, at_ms, attempts)`` of an IdempotencyRecord value (state: done, dead,
    cancelled, retrying)."""
    if schema is not None and schema != IDEMPOTENCY_V2 and schema != IDEMPOTENCY_V1:
        version = codec.parse_schema_header(schema, expected="idempotency")
        rec = codec.decode("idempotency", data, writer_version=version)
        _key_ranges(rec["at_ms"], rec.get("attempts") or 0)
        return str(rec["state"]), int(rec["at_ms"]), int(rec.get("attempts") or 0)
    try:
        _key, pos = _bytes(data, 0)
        _job, pos = _bytes(data, pos)
        state, pos = _varint(data, pos)
        at_ms, pos = _varint(data, pos)
        attempts, pos = _varint(data, pos)
        present, pos = _opt_index(data, pos)
        if present:
            _hash, pos = _bytes(data, pos)
        if state < 0:
            raise IndexError(f"state {state}")
        name = (KEY_STATES_V1 if schema == IDEMPOTENCY_V1 else KEY_STATES)[state]
    except (IndexError, ValueError) as exc:
        raise UndecodableRecord(
            f"value is not a valid dueflow.IdempotencyRecord ({type(exc).__name__}: {exc})",
            cause=exc,
        ) from exc
    if pos != len(data):
        raise UndecodableRecord("value is not a valid dueflow.IdempotencyRecord: trailing bytes")
    if not MIN_TIME_MS <= at_ms <= MAX_DUE_MS or not 0 <= attempts <= MAX_INT32:
        _key_ranges(at_ms, attempts)
    return name, at_ms, attempts


# --------------------------------------------------------------------------- encoding


_SMALL = [varint(i) for i in range(128)]
_BIG: dict[int, bytes] = {}


def _zigzag(n: int) -> bytes:
    """Avro long. Large values repeat (the same millisecond for many jobs): memoized."""
    if 0 <= n < 128:
        return _SMALL[n]
    out = _BIG.get(n)
    if out is None:
        if len(_BIG) >= 4_096:
            _BIG.clear()
        out = _BIG[n] = varint(n)
    return out


_STRINGS: dict[str, bytes] = {}


def _s(text: str) -> bytes:
    """Length-prefixed UTF-8 of a string that differs per record (ids, keys, messages)."""
    raw = text.encode()
    size = len(raw)
    return (_SMALL[size] if size < 128 else _zigzag(size)) + raw


def _sc(text: str) -> bytes:
    """:func:`_s` for the few strings that repeat on every record (queue, task, worker)."""
    cached = _STRINGS.get(text)
    if cached is None:
        if len(_STRINGS) >= 1_024:
            _STRINGS.clear()
        cached = _STRINGS[text] = _s(text)
    return cached


def _l(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 128 else _zigzag(n)


def _opt_s(text: str | None) -> bytes:
    return b"\x00" if text is None else b"\x02" + _s(text)


def _opt_sc(text: str | None) -> bytes:
    return b"\x00" if text is None else b"\x02" + _sc(text)


def encode_outcome(
    *,
    job_id: str,
    queue: str,
    task: str,
    idempotency_key: str,
    state: str,
    attempt: int,
    at_ms: int,
    due_ms: int | None = None,
    duration_ms: float | None = None,
    error_type: str | None = None,
    error: str | None = None,
    worker: str | None = None,
    trace_id: str | None = None,
    schedule_id: str | None = None,
) -> bytes:
    """Avro binary of an Outcome: version 1, or 2 for the states only version 2 has
    (same layout; the header to send is :func:`outcome_header`)."""
    return b"".join(
        (
            _s(job_id),
            _sc(queue),
            _sc(task),
            _s(idempotency_key),
            _SMALL[_JOB_STATE_INDEX[state]],
            _l(attempt),
            _zigzag(at_ms),
            b"\x00" if due_ms is None else b"\x02" + _zigzag(due_ms),
            b"\x00" if duration_ms is None else b"\x02" + _DOUBLE.pack(duration_ms),
            _opt_sc(error_type),
            _opt_s(error),
            _opt_sc(worker),
            _opt_s(trace_id),
            _opt_s(schedule_id),
        )
    )


def encode_outcome_v3(
    *,
    result: bytes | None = None,
    result_error: str | None = None,
    progress: float | None = None,
    progress_detail: bytes | None = None,
    exec_partition: int | None = None,
    version: str | None = None,
    command_id: str | None = None,
    first_job_id: str | None = None,
    group_id: str | None = None,
    **fields: Any,
) -> bytes:
    """Avro binary of an Outcome of version 3 (header :data:`OUTCOME_V3`): the
    fields of :func:`encode_outcome`, then the fields version 3 adds."""
    return b"".join(
        (
            encode_outcome(**fields),
            b"\x00" if result is None else b"\x02" + _b(result),
            _opt_s(result_error),
            b"\x00" if progress is None else b"\x02" + _DOUBLE.pack(progress),
            b"\x00" if progress_detail is None else b"\x02" + _b(progress_detail),
            b"\x00" if exec_partition is None else b"\x02" + _l(exec_partition),
            _opt_s(version),
            _opt_s(command_id),
            _opt_s(first_job_id),
            _opt_s(group_id),
        )
    )


_NO_STEERING = b"\x00" * 5  # exec_partition, version, command_id, first_job_id, group_id


def result_tail(
    result: bytes | None,
    result_error: str | None,
    progress: float | None,
    progress_detail: bytes | None,
) -> bytes:
    """What follows a version 1/2 outcome's bytes to make it version 3 with a result
    and/or progress and nothing else new (hot path: a handler's result):
    ``encode_success(...)[1] + result_tail(...)`` is byte for byte
    :func:`encode_outcome_v3` of the same fields."""
    return b"".join(
        (
            b"\x00" if result is None else b"\x02" + _b(result),
            _opt_s(result_error),
            b"\x00" if progress is None else b"\x02" + _DOUBLE.pack(progress),
            b"\x00" if progress_detail is None else b"\x02" + _b(progress_detail),
            _NO_STEERING,
        )
    )


def _b(raw: bytes) -> bytes:
    size = len(raw)
    return (_SMALL[size] if size < 128 else _zigzag(size)) + raw


def encode_key_state(
    *,
    idempotency_key: str,
    job_id: str,
    state: str,
    at_ms: int,
    attempts: int = 0,
    content_hash: str | None = None,
) -> bytes:
    """Avro binary of an IdempotencyRecord (version 2)."""
    return b"".join(
        (
            _s(idempotency_key),
            _s(job_id),
            _SMALL[_KEY_STATE_INDEX[state]],
            _zigzag(at_ms),
            _l(attempts),
            _opt_s(content_hash),
        )
    )


_SCHEDULED = _SMALL[_JOB_STATE_INDEX["scheduled"]]


def encode_scheduled(
    job_id: str,
    queue: str,
    task: str,
    idempotency_key: str,
    due_ms: int,
    at_ms: int,
    trace_id: str | None,
    schedule_id: str | None,
) -> bytes:
    """The client's ``scheduled`` Outcome of a job (version 1), positional: one per
    job of ``schedule_many``. Byte for byte :func:`encode_outcome` with
    ``state="scheduled"``, ``attempt=0``."""
    return b"".join(
        (
            _s(job_id),
            _sc(queue),
            _sc(task),
            _s(idempotency_key),
            _SCHEDULED,
            b"\x00",  # attempt 0
            _zigzag(at_ms),
            b"\x02" + _zigzag(due_ms),
            b"\x00\x00\x00\x00",  # no duration, error type, error, worker
            _opt_s(trace_id),
            _opt_s(schedule_id),
        )
    )


_DONE = _SMALL[_KEY_STATE_INDEX["done"]]
_SUCCEEDED = _SMALL[_JOB_STATE_INDEX["succeeded"]]


def encode_success(
    job_id: str,
    idempotency_key: str,
    queue: str,
    task: str,
    attempt: int,
    at_ms: int,
    due_ms: int,
    duration_ms: float,
    worker: str,
    trace_id: str | None,
    schedule_id: str | None,
) -> tuple[bytes, bytes]:
    """The two records of a successful job, sharing their encoded fields (hot path).

    ``(IdempotencyRecord done, Outcome succeeded)``, byte for byte what
    :func:`encode_key_state` and :func:`encode_outcome` write.
    """
    jid = _s(job_id)
    key = _s(idempotency_key)
    at = _zigzag(at_ms)
    att = _l(attempt)
    return (
        b"".join((key, jid, _DONE, at, att, b"\x00")),
        b"".join(
            (
                jid,
                _sc(queue),
                _sc(task),
                key,
                _SUCCEEDED,
                att,
                at,
                b"\x02" + _zigzag(due_ms),
                b"\x02" + _DOUBLE.pack(duration_ms),
                b"\x00\x00",  # no error type, no error
                _opt_sc(worker),
                _opt_s(trace_id),
                _opt_s(schedule_id),
            )
        ),
    )
