"""Hand-written Avro decoding of the Job and IdempotencyRecord values a worker reads.

:func:`decode_job_fields` reads version 1 of the Job schema (the worker's hot
path, one value per job) and :func:`decode_key_state` versions 1 and 2 of the
IdempotencyRecord, giving what fastavro would; any other version goes through
:mod:`dueflow.records.codec`, which resolves versions. Bad bytes raise
:class:`~dueflow.errors.UndecodableRecord`; numbers out of range
:class:`~dueflow.errors.FieldOutOfRange`.
"""

from __future__ import annotations

import struct
from typing import Any

from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.records import codec
from dueflow.records.framing import unframe_job
from dueflow.records.worker_schemas import (
    IDEMPOTENCY_V1,
    IDEMPOTENCY_V2,
    JOB_V1,
    KEY_STATES,
    KEY_STATES_V1,
)
from dueflow.rules.wire_bounds import MAX_DUE_MS, MAX_INT32, MIN_TIME_MS, MS_ACCEPTED, in_range

_BACKOFF_KINDS = (BackoffKind.EXPONENTIAL, BackoffKind.FIXED, BackoffKind.NONE)
_DOUBLE = struct.Struct("<d")


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
