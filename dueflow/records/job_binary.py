"""A hand-written Avro binary encoder for ``dueflow.Job`` (schemas/dueflow/schemas/job.avsc).

The scheduling client writes one Job record per scheduled job; fastavro's
generic writer costs several microseconds a record, this one about a fifth of
that. It produces exactly the bytes ``codec.encode("job", job.to_record())``
does (tests/unit/test_job_binary.py checks that on tables and with
hypothesis), so any Avro reader decodes it with schemas/dueflow/schemas/job.avsc.

Avro binary in short: ``long``/``int`` are zig-zag varints; ``string`` and
``bytes`` are a length (long) then the bytes; a union is the branch index
(long) then the value; a map is blocks of ``count, entries`` ended by a zero
count; a ``double`` is 8 bytes little-endian; a ``boolean`` is one byte.

When job.avsc changes, change this encoder with it (the equivalence test
fails until both agree).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Protocol

from dueflow.model import Backoff, BackoffKind
from dueflow.records.varint import VARINTS, long_varint, varint

_NULL = b"\x00"  # union branch 0 (null), and also an empty map's end block
_BRANCH_1 = b"\x02"  # union branch 1: zig-zag of 1
_DOUBLE = struct.Struct("<d").pack
_BACKOFF_KIND = {kind: VARINTS[i << 1] for i, kind in enumerate(BackoffKind)}


class JobFields(Protocol):
    """What the encoder reads: :class:`dueflow.model.Job` has these attributes."""

    @property
    def job_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def content_type(self) -> str: ...
    @property
    def due_ms(self) -> int: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff(self) -> Backoff | None: ...
    @property
    def timeout_ms(self) -> int | None: ...
    @property
    def jitter_ms(self) -> int: ...
    @property
    def created_ms(self) -> int: ...
    @property
    def trace(self) -> Mapping[str, str]: ...
    @property
    def schedule_id(self) -> str | None: ...
    @property
    def schedule_version(self) -> int | None: ...
    @property
    def content_hash(self) -> str | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


# The fields of a Job in the order of job.avsc.
JobValues = tuple[
    str,  # job_id
    str,  # queue
    str,  # task
    bytes,  # payload
    str,  # content_type
    int,  # due_ms
    str,  # idempotency_key
    int,  # max_attempts
    "Backoff | None",  # backoff
    "int | None",  # timeout_ms
    int,  # jitter_ms
    int,  # created_ms
    Mapping[str, str],  # trace
    "str | None",  # schedule_id
    "int | None",  # schedule_version
    "str | None",  # content_hash
    Mapping[str, str],  # labels
]


def _int(n: int) -> bytes:
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"{n} does not fit an Avro int")
    return varint(n)


def _text(s: str) -> bytes:
    raw = s.encode()
    n = len(raw)
    return (VARINTS[n << 1] if n < 8192 else varint(n)) + raw


def _map(m: Mapping[str, str]) -> bytes:
    if not m:
        return _NULL
    parts = [varint(len(m))]
    for k, v in m.items():
        parts.append(_text(k))
        parts.append(_text(v))
    parts.append(_NULL)
    return b"".join(parts)


def _backoff(b: Backoff) -> bytes:
    kind = b.kind if isinstance(b.kind, BackoffKind) else BackoffKind(b.kind)
    return b"".join(
        (
            _BRANCH_1,
            _BACKOFF_KIND[kind],
            varint(b.base_ms),
            varint(b.max_ms),
            _DOUBLE(b.multiplier),
            b"\x01" if b.jitter else b"\x00",
        )
    )


# Encoded pieces that repeat from job to job, keyed by the values they encode:
# (queue, task), content type, and the block max_attempts..jitter_ms. Bounded.
_CACHE_LIMIT = 4096
_QUEUE_TASK: dict[tuple[str, str], bytes] = {}
_CONTENT_TYPE: dict[str, bytes] = {}
_OPTIONS: dict[tuple[int, Backoff | None, int | None, int], bytes] = {}
# The tail when there is no trace, schedule or labels: trace {}, schedule_id
# null, schedule_version null, content_hash branch 1 (then the text), and
# labels {} after it.
_PLAIN_TAIL = b"\x00\x00\x00\x02"


def _queue_task(queue: str, task: str) -> bytes:
    found = _QUEUE_TASK.get((queue, task))
    if found is None:
        found = _text(queue) + _text(task)
        if len(_QUEUE_TASK) < _CACHE_LIMIT:
            _QUEUE_TASK[queue, task] = found
    return found


def _content_type(content_type: str) -> bytes:
    found = _CONTENT_TYPE.get(content_type)
    if found is None:
        found = _text(content_type)
        if len(_CONTENT_TYPE) < _CACHE_LIMIT:
            _CONTENT_TYPE[content_type] = found
    return found


def _options(max_attempts: int, backoff: Backoff | None, timeout: int | None, jitter: int) -> bytes:
    """max_attempts, backoff, timeout_ms and jitter_ms: adjacent in the schema."""
    cache_key = (max_attempts, backoff, timeout, jitter)
    found = _OPTIONS.get(cache_key)
    if found is None:
        found = b"".join(
            (
                _int(max_attempts),
                _NULL if backoff is None else _backoff(backoff),
                _NULL if timeout is None else _BRANCH_1 + varint(timeout),
                varint(jitter),
            )
        )
        if len(_OPTIONS) < _CACHE_LIMIT:
            _OPTIONS[cache_key] = found
    return found


# max_attempts followed by a null backoff, a null timeout and jitter 0.
_PLAIN_OPTIONS: dict[int, bytes] = {}

# For callers that assemble plain jobs themselves (schedule_many's bulk
# planner): lengths below 8192 as ``SHORT_LENGTHS[n]``, the schema-order pieces
# below, and PLAIN_TAIL + text(content_hash) + b"\x00" to end the record.
SHORT_LENGTHS = VARINTS[0::2][:8192]
PLAIN_TAIL = _PLAIN_TAIL
text = _text


def queue_task(queue: str, task: str) -> bytes:
    """The encoded ``queue`` and ``task`` fields (adjacent in the schema)."""
    return _queue_task(queue, task)


def content_type_text(content_type: str) -> bytes:
    """The encoded ``content_type`` field."""
    return _content_type(content_type)


def plain_options(max_attempts: int) -> bytes:
    """The fields ``max_attempts`` to ``jitter_ms`` of a job without backoff,
    timeout or jitter."""
    options = _PLAIN_OPTIONS.get(max_attempts)
    if options is None:
        options = _options(max_attempts, None, None, 0)
        if len(_PLAIN_OPTIONS) < _CACHE_LIMIT:
            _PLAIN_OPTIONS[max_attempts] = options
    return options


def encode_plain_job(values: JobValues, job_id: bytes, key: bytes) -> bytes:
    """:func:`encode_job_values` for a job with no backoff, timeout, jitter, trace,
    schedule or labels, and a content hash (what ``schedule_many`` writes most)."""
    payload = values[3]
    n = len(payload)
    nid = len(job_id)
    nkey = len(key)
    options = plain_options(values[7])
    content_hash = values[15]
    assert content_hash is not None
    return b"".join(
        (
            VARINTS[nid << 1] if nid < 8192 else varint(nid),
            job_id,
            _queue_task(values[1], values[2]),
            VARINTS[n << 1] if n < 8192 else varint(n),
            payload,
            _content_type(values[4]),
            long_varint(values[5]),
            VARINTS[nkey << 1] if nkey < 8192 else varint(nkey),
            key,
            options,
            long_varint(values[11]),
            _PLAIN_TAIL,
            _text(content_hash),
            _NULL,
        )
    )


def encode_job(job: JobFields) -> bytes:
    """Avro binary of ``job`` with job.avsc, byte-identical to fastavro's."""
    values = job_values(job)
    return encode_job_values(values, values[0].encode(), values[6].encode())


def job_values(job: JobFields) -> JobValues:
    """The fields of ``job`` as a tuple in schema order (a prepared job already is one)."""
    if isinstance(job, tuple):
        return job
    return (
        job.job_id,
        job.queue,
        job.task,
        job.payload,
        job.content_type,
        job.due_ms,
        job.idempotency_key,
        job.max_attempts,
        job.backoff,
        job.timeout_ms,
        job.jitter_ms,
        job.created_ms,
        job.trace,
        job.schedule_id,
        job.schedule_version,
        job.content_hash,
        job.labels,
    )


def encode_job_values(values: JobValues, job_id: bytes, key: bytes) -> bytes:
    """:func:`encode_job` of a schema-order tuple whose UTF-8 job id and key the
    caller has already (reading a tuple is cheaper than 17 attribute reads)."""
    (
        _job_id,
        queue,
        task,
        payload,
        content_type,
        due_ms,
        _key,
        max_attempts,
        backoff,
        timeout_ms,
        jitter_ms,
        created_ms,
        trace,
        schedule_id,
        schedule_version,
        content_hash,
        labels,
    ) = values
    n = len(payload)
    nid = len(job_id)
    nkey = len(key)
    head = (
        VARINTS[nid << 1] if nid < 8192 else varint(nid),
        job_id,
        _queue_task(queue, task),
        VARINTS[n << 1] if n < 8192 else varint(n),
        payload,
        _content_type(content_type),
        long_varint(due_ms),
        VARINTS[nkey << 1] if nkey < 8192 else varint(nkey),
        key,
        _options(max_attempts, backoff, timeout_ms, jitter_ms),
        long_varint(created_ms),
    )
    if not trace and schedule_id is None and schedule_version is None and content_hash:
        if labels:
            return b"".join((*head, _PLAIN_TAIL, _text(content_hash), _map(labels)))
        return b"".join((*head, _PLAIN_TAIL, _text(content_hash), _NULL))
    return b"".join(
        (
            *head,
            _map(trace) if trace else _NULL,
            _NULL if schedule_id is None else _BRANCH_1 + _text(schedule_id),
            _NULL if schedule_version is None else _BRANCH_1 + varint(schedule_version),
            _NULL if content_hash is None else _BRANCH_1 + _text(content_hash),
            _map(labels) if labels else _NULL,
        )
    )


def leading_strings(data: bytes, count: int = 2) -> list[str]:
    """The first ``count`` string fields of an Avro record (of a Job: job id and
    queue), read without decoding the rest. Raises ``ValueError`` on bad bytes."""
    out: list[str] = []
    pos = 0
    for _ in range(count):
        shift = z = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise ValueError("truncated varint")
            b = data[pos]
            pos += 1
            z |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        n = (z >> 1) ^ -(z & 1)
        if n < 0 or pos + n > len(data):
            raise ValueError("bad string length")
        out.append(data[pos : pos + n].decode())
        pos += n
    return out
