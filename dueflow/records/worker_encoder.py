"""Hand-written Avro encoding of the Outcome and IdempotencyRecord values a worker writes.

A worker writes one of each per job (hot path): these functions take a few
microseconds where fastavro takes several times that, and write byte for byte
what fastavro writes (the unit tests compare them on generated records).

Outcome versions 1 and 2 have the same layout (2 adds enum symbols):
:func:`outcome_header` says which to send. Version 3 appends optional fields,
so its value is the version 2 bytes followed by those
(:func:`encode_outcome_v3`, :func:`result_tail`); writers keep writing
version 1 or 2 when nothing of version 3 is used.
"""

from __future__ import annotations

import struct
from typing import Any

from dueflow.records.varint import varint
from dueflow.records.worker_schemas import (
    JOB_STATES,
    KEY_STATES,
    OUTCOME_V1,
    OUTCOME_V2,
    OUTCOME_V3,
    V2_STATES,
    V3_STATES,
)

_JOB_STATE_INDEX = {s: i for i, s in enumerate(JOB_STATES)}
_KEY_STATE_INDEX = {s: i for i, s in enumerate(KEY_STATES)}
_DOUBLE = struct.Struct("<d")


def outcome_header(state: str) -> bytes:
    """The ``df-schema`` header of an Outcome in ``state`` written by :func:`encode_outcome`:
    version 1 (what every reader knows) unless the state is new in version 2. The
    two versions have the same layout, so the bytes are the same. A state new in
    version 3 is written with :func:`encode_outcome_v3` (header :data:`OUTCOME_V3`)."""
    if state in V3_STATES:
        return OUTCOME_V3
    return OUTCOME_V2 if state in V2_STATES else OUTCOME_V1


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
