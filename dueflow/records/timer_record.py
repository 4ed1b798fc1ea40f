"""The timer record of a job: partition, key, value and headers (pure).

What the scheduling client writes to ``<prefix>.timers`` and what any other
Kafka client must write to schedule a job (docs/wire-format.md):

- partition: chosen explicitly by :func:`dueflow.rules.wheel.place_timer` from the
  due time and the time of writing (:class:`TimerPlacer` is the same function
  with per-level numbers precomputed); ``spread`` (CRC-32 of the key) picks
  the shard (:func:`dueflow.rules.wheel.shard_for`, its upper half) and the near
  partition for timers due now (its lower bits);
- key: the idempotency key, UTF-8;
- value: the Avro ``dueflow.Job`` record;
- headers: ``df-due`` (the value's ``due_ms``), ``df-queue``, ``df-kind``,
  ``df-job``, ``df-task``, ``df-schema`` and, for cron occurrences,
  ``df-schedule``/``df-sv`` (see :mod:`dueflow.headers`). The emitter reads
  only the headers, so they always agree with the value.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple

from dueflow import headers as hdr
from dueflow.records.codec import schema_header
from dueflow.records.framing import frame_confluent, framed_header
from dueflow.records.job_binary import JobFields, JobValues, encode_job_values, job_values
from dueflow.records.record_size import (
    BATCH_HEADER,
    RECORD_FIXED,
    record_size,
    sized,
    varint_size,
)
from dueflow.rules.wheel import WheelGeometry

JOB_SCHEMA = schema_header("job")
_KIND_JOB = hdr.KIND_JOB.encode()
_KIND_CRON = hdr.KIND_CRON.encode()

# NamedTuple's generated __new__ is a Python function; the scheduling client
# builds one record per job, so it builds the tuple directly.
_new_tuple = tuple.__new__


class TimerRecord(NamedTuple):
    """One record for the timer topic, and its size as the broker counts it
    (:func:`dueflow.records.record_size.record_size`)."""

    partition: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    size: int


def spread_of(key: bytes) -> int:
    """The stable integer that picks a near partition: CRC-32 of the key."""
    return zlib.crc32(key)


class TimerPlacer:
    """:func:`dueflow.rules.wheel.place_timer` for one geometry, with the per-level numbers
    computed once (the scheduling client places every job; a test checks that
    both agree on every input)."""

    __slots__ = (
        "_levels",
        "_near",
        "_near_window",
        "_shards",
        "_stride",
        "_top",
        "levels",
        "near_partitions",
        "near_window_ms",
        "shards",
        "stride",
    )

    def __init__(self, geometry: WheelGeometry) -> None:
        geometry = geometry.of_shard(0)
        self._near = self.near_partitions = geometry.near_partitions
        self._near_window = self.near_window_ms = geometry.near_window_ms
        # per level (reach_ms, width_ms, first partition, slots) in shard 0: a timer
        # due in at most reach_ms goes to partition first + (due_ms // width_ms) % slots
        self._levels = self.levels = [
            (geometry.reach_ms(k), lv.width_ms, geometry.level_base(k), lv.slots)
            for k, lv in enumerate(geometry.levels)
        ]
        self._top = self._levels[-1]
        # Shard s is shard 0 moved by s * stride partitions (shard_for picks s).
        self._shards = self.shards = geometry.shards
        self._stride = self.stride = geometry.shard_partitions

    def partition(self, *, due_ms: int, now_ms: int, spread: int) -> int:
        """The timer-topic partition of a timer due at ``due_ms`` written at ``now_ms``."""
        delta = due_ms - now_ms
        base = ((spread >> 16) % self._shards) * self._stride if self._shards > 1 else 0
        if delta <= self._near_window:
            return base + spread % self._near
        return base + self.far_partition(due_ms, now_ms)

    def shard_base(self, spread: int) -> int:
        """First partition of the shard of a timer with ``spread`` (:func:`shard_for`)."""
        return ((spread >> 16) % self._shards) * self._stride if self._shards > 1 else 0

    def far_partition(self, due_ms: int, now_ms: int) -> int:
        """:meth:`partition` in shard 0 of a timer due after the near window
        (``due_ms - now_ms > near_window_ms``), which does not depend on the spread
        (add :meth:`shard_base` for its shard)."""
        delta = due_ms - now_ms
        for reach, width, base, slots in self._levels:
            if delta <= reach:
                return base + (due_ms // width) % slots
        reach, width, base, slots = self._top
        return base + ((now_ms + reach) // width) % slots


KIND_JOB_HEADER = (hdr.KIND, _KIND_JOB)
SCHEMA_HEADER = (hdr.SCHEMA, JOB_SCHEMA)
# The bytes of a plain job's timer record (its six headers) that do not vary:
# the record's fixed part, the header count, the six names, df-kind's and
# df-schema's values, and the length of df-due's value (at most 19 digits). The
# record's body is this, the names' values (name_headers) and the key, value,
# df-due and job id with their lengths (plain_record_size).
PLAIN_FIXED_BODY = (
    RECORD_FIXED
    + 1
    + sum(sized(len(n)) for n in (hdr.DUE, hdr.QUEUE, hdr.KIND, hdr.JOB_ID, hdr.TASK, hdr.SCHEMA))
    + sized(len(_KIND_JOB))
    + sized(len(JOB_SCHEMA))
    + 1
)


def plain_record_size(key: int, value: int, job_id: int, names: int, due: int) -> int:
    """:func:`~dueflow.records.record_size.record_size` of a plain job's timer record
    from the lengths of its key, value, job id, df-due and (``names``) its queue and
    task headers' values with their lengths."""
    body = (
        PLAIN_FIXED_BODY
        + names
        + due
        + (key + 1 if key < 64 else key + 2 if key < 8192 else sized(key))
        + (job_id + 1 if job_id < 64 else job_id + 2 if job_id < 8192 else sized(job_id))
        + (value + 1 if value < 64 else value + 2 if value < 8192 else sized(value))
    )
    return (
        BATCH_HEADER + (2 if body < 8192 else 3 if body < 1_048_576 else varint_size(body)) + body
    )


# (queue, task) -> their two header pairs and their size: they repeat.
_NAME_HEADERS: dict[tuple[str, str], tuple[tuple[str, bytes], tuple[str, bytes], int]] = {}


def name_headers(queue: str, task: str) -> tuple[tuple[str, bytes], tuple[str, bytes], int]:
    """The ``df-queue`` and ``df-task`` header pairs, and their values' size in a
    record (with their lengths)."""
    found = _NAME_HEADERS.get((queue, task))
    if found is None:
        q, t = queue.encode(), task.encode()
        found = ((hdr.QUEUE, q), (hdr.TASK, t), sized(len(q)) + sized(len(t)))
        if len(_NAME_HEADERS) < 4096:
            _NAME_HEADERS[queue, task] = found
    return found


def timer_record(
    job: JobFields,
    *,
    now_ms: int,
    placer: TimerPlacer,
    trace_headers: Sequence[tuple[str, bytes]] = (),
) -> TimerRecord:
    """The record that schedules ``job`` (a :class:`~dueflow.model.Job` or a prepared
    job) when written at ``now_ms``. Headers are in the order of the contract."""
    values = job_values(job)
    key = values[6].encode()
    job_id = values[0].encode()
    value = encode_job_values(values, job_id, key)
    return record_of(values, job_id, key, value, now_ms, placer, trace_headers)


def record_of(
    values: JobValues,
    job_id: bytes,
    key: bytes,
    value: bytes,
    now_ms: int,
    placer: TimerPlacer,
    trace_headers: Sequence[tuple[str, bytes]] = (),
) -> TimerRecord:
    """The timer record of a job whose value is encoded already: headers, size,
    partition. ``values`` is the job in schema order, ``job_id``/``key`` UTF-8."""
    due_ms = values[5]
    schedule_id = values[13]
    due = b"%d" % due_ms
    queue_header, task_header, names_size = name_headers(values[1], values[2])
    headers = [
        (hdr.DUE, due),
        queue_header,
        KIND_JOB_HEADER,
        (hdr.JOB_ID, job_id),
        task_header,
        SCHEMA_HEADER,
    ]
    size = plain_record_size(len(key), len(value), len(job_id), names_size, len(due))
    if schedule_id is not None or trace_headers:
        if schedule_id is not None:
            headers[2] = (hdr.KIND, _KIND_CRON)
            headers.append((hdr.SCHEDULE, schedule_id.encode()))
            if values[14] is not None:
                headers.append((hdr.SCHEDULE_VERSION, b"%d" % values[14]))
        headers.extend(trace_headers)
        size = record_size(key, value, headers)
    partition = placer.partition(due_ms=due_ms, now_ms=now_ms, spread=zlib.crc32(key))
    return _new_tuple(TimerRecord, (partition, key, value, headers, size))


FRAMED_SCHEMA_HEADER = (hdr.SCHEMA, framed_header(JOB_SCHEMA))


def framed_timer(record: TimerRecord, schema_id: int) -> TimerRecord:
    """``record`` (as :func:`timer_record` builds it) with its value in the Confluent
    wire format of registry schema ``schema_id`` and ``df-schema`` saying so
    (:mod:`dueflow.records.framing`); its size counts the framing."""
    value = frame_confluent(schema_id, record.value)
    headers = [FRAMED_SCHEMA_HEADER if h[0] == hdr.SCHEMA else h for h in record.headers]
    return _new_tuple(
        TimerRecord,
        (record.partition, record.key, value, headers, record_size(record.key, value, headers)),
    )


def retry_timer(
    *,
    key: bytes,
    value: bytes,
    headers: Sequence[tuple[str, bytes | None]] | None,
    queue: str,
    exec_partition: int,
    due_ms: int,
    now_ms: int,
    placer: TimerPlacer,
) -> TimerRecord:
    """A retry that waits in the timer wheel instead of a retry tier (see
    :func:`dueflow.rules.backoff.retry_route`): the retry record's value bytes and
    headers (``df-attempt``, ``df-due`` = its not-before, failure, origin and
    trace headers), as a job timer of ``queue`` that the emitter fires into
    partition ``exec_partition`` of the exec topic (``df-partition``), so the
    job keeps its partition. ``df-kind`` is ``job`` (a cron occurrence's retry
    is not an occurrence to plan again); the first fire's ``df-fired`` and
    ``df-src`` are dropped, the emitter sets them again.
    """
    out = hdr.replace(
        headers,
        [
            (hdr.DUE, due_ms),
            (hdr.QUEUE, queue),
            (hdr.KIND, hdr.KIND_JOB),
            (hdr.PARTITION, exec_partition),
            (hdr.FIRED, None),
            (hdr.SOURCE, None),
        ],
    )
    partition = placer.partition(due_ms=due_ms, now_ms=now_ms, spread=zlib.crc32(key))
    return _new_tuple(
        TimerRecord, (partition, key, value or b"", out, record_size(key, value, out))
    )
