"""Hand-written Avro decoding of Outcome records (versions 1 to 3).

The status view decodes every outcome of the cluster: with fastavro's
schemaless reader (and its schema resolution for older writers) that is
about a quarter of the view's CPU per outcome. :func:`decode_outcome` reads
the three released layouts directly (version 2 only adds enum symbols to 1;
version 3 appends optional fields) into the same dict fastavro gives with the
current schema as the reader: every field, those an older writer lacks as
None. Anything it cannot read, and any other version, goes through
:func:`dueflow.records.codec.decode`, which resolves versions and names what
is wrong, so errors are the codec's (the unit tests compare both on
generated records).
"""

from __future__ import annotations

import struct
from typing import Any

from dueflow.records import codec
from dueflow.records.worker_codec import JOB_STATES, _bytes, _str, _varint

FAST_VERSIONS = (1, 2, 3)
_SYMBOLS = {1: 9, 2: 12, 3: len(JOB_STATES)}  # enum symbols of `state` per version
_DOUBLE = struct.Struct("<d")
# The reader schema this decoder stands for: a newer current version adds fields.
_READS_AS_CURRENT = codec.SCHEMAS["outcome"][2] == 3


def decode_outcome(data: bytes, version: int | None) -> dict[str, Any]:
    """The Outcome dict of ``data`` written with ``version`` (the ``df-schema``
    header's; None: the current one), as :func:`codec.decode` returns it."""
    v = codec.SCHEMAS["outcome"][2] if version is None else version
    if _READS_AS_CURRENT and v in _SYMBOLS:
        try:
            return _outcome(data, v)
        except (ValueError, IndexError, UnicodeDecodeError, struct.error):
            pass  # the codec says what is wrong
    return codec.decode("outcome", data, writer_version=version)


def _opt_str(data: bytes, pos: int) -> tuple[str | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"union branch {branch}")
    return _str(data, pos + 1)


def _opt_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"union branch {branch}")
    return _bytes(data, pos + 1)


def _opt_long(data: bytes, pos: int) -> tuple[int | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"union branch {branch}")
    return _varint(data, pos + 1)


def _opt_double(data: bytes, pos: int) -> tuple[float | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"union branch {branch}")
    (value,) = _DOUBLE.unpack_from(data, pos + 1)
    return value, pos + 9


def _outcome(data: bytes, version: int) -> dict[str, Any]:
    job_id, pos = _str(data, 0)
    queue, pos = _str(data, pos)
    task, pos = _str(data, pos)
    idempotency_key, pos = _str(data, pos)
    symbol, pos = _varint(data, pos)
    if not 0 <= symbol < _SYMBOLS[version]:
        raise ValueError(f"state symbol {symbol}")
    attempt, pos = _varint(data, pos)
    at_ms, pos = _varint(data, pos)
    due_ms, pos = _opt_long(data, pos)
    duration_ms, pos = _opt_double(data, pos)
    error_type, pos = _opt_str(data, pos)
    error, pos = _opt_str(data, pos)
    worker, pos = _opt_str(data, pos)
    trace_id, pos = _opt_str(data, pos)
    schedule_id, pos = _opt_str(data, pos)
    result = result_error = progress = progress_detail = exec_partition = None
    written_version = command_id = first_job_id = group_id = None
    if version >= 3:
        result, pos = _opt_bytes(data, pos)
        result_error, pos = _opt_str(data, pos)
        progress, pos = _opt_double(data, pos)
        progress_detail, pos = _opt_bytes(data, pos)
        exec_partition, pos = _opt_long(data, pos)
        written_version, pos = _opt_str(data, pos)
        command_id, pos = _opt_str(data, pos)
        first_job_id, pos = _opt_str(data, pos)
        group_id, pos = _opt_str(data, pos)
    if pos != len(data):
        raise ValueError("trailing bytes")
    return {
        "job_id": job_id,
        "queue": queue,
        "task": task,
        "idempotency_key": idempotency_key,
        "state": JOB_STATES[symbol],
        "attempt": attempt,
        "at_ms": at_ms,
        "due_ms": due_ms,
        "duration_ms": duration_ms,
        "error_type": error_type,
        "error": error,
        "worker": worker,
        "trace_id": trace_id,
        "schedule_id": schedule_id,
        "result": result,
        "result_error": result_error,
        "progress": progress,
        "progress_detail": progress_detail,
        "exec_partition": exec_partition,
        "version": written_version,
        "command_id": command_id,
        "first_job_id": first_job_id,
        "group_id": group_id,
    }
