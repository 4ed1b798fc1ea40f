"""The per-job planning of ``schedule_many``: :class:`BulkPlanner` (no I/O).

``schedule_many`` plans up to 100k jobs a second in one thread, so for the
common request (task, payload, delay, queue, ids and attempts only) this does
what :meth:`TimerPlanner.plan <dueflow.producers.core.TimerPlanner.plan>` does
with what repeats from job to job computed once per call:

- per (queue, task): the checks, the encoded names and their header pairs;
  per content type also the content hash's prefix (a hasher to copy);
- per millisecond: the time part of job ids and the encoded ``created_ms``;
- per batch of ids: their random parts (:meth:`JobIds.tails`).

A job id drawn here is new, so it cannot conflict with anything this client
scheduled: it skips the recent-jobs claim and is remembered in batches
(:meth:`BulkPlanner.remember`), which the caller runs at least before it
reports results. Requests with a caller's job id are claimed at once, as
:meth:`TimerPlanner.plan` does; other requests go through it.

Checks, errors, bytes, headers and partitions equal the planner's
(tests/unit/test_bulk_plan.py compares both on random requests).
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow.errors import ConflictError, InvalidInput
from dueflow.ids import uuid7_head
from dueflow.producers.core import PlannedTimer, TimerPlanner
from dueflow.producers.recent import Entry
from dueflow.producers.results import Scheduled
from dueflow.records.job_binary import (
    PLAIN_TAIL,
    SHORT_LENGTHS,
    content_type_text,
    plain_options,
    queue_task,
)
from dueflow.records.job_request import (
    JSON,
    MAX_INT32,
    OCTET_STREAM,
    JobRequest,
    bad_attempts,
    bad_name,
    bad_payload,
    bad_task,
    check_finite,
    content_hash_prefix,
    due_after,
    encode_payload,
    is_name,
    unknown_queue,
)
from dueflow.records.timer_record import (
    FIXED_RECORD_SIZE,
    KIND_JOB_HEADER,
    SCHEMA_HEADER,
    name_headers,
)
from dueflow.records.varint import LOW_GROUPS, VARINTS, long_varint, varint
from dueflow.task_name import is_task_name

# What the bulk loop needs of a planned job: job_id, due_ms, queue, task,
# idempotency_key, partition, then the record's key, value and headers.
Plan = tuple[str, int, str, str, str, int, bytes, bytes, list[tuple[str, bytes]]]

_dumps = orjson.dumps
_SORT_KEYS = orjson.OPT_SORT_KEYS
_JSON_ERRORS = (TypeError, orjson.JSONEncodeError)
_crc32 = zlib.crc32
_DUE, _JOB_ID = hdr.DUE, hdr.JOB_ID
# The end of a plain job record: no trace, schedule or labels, a content hash
# of 32 hex digits (length 32 is the byte 0x40), then the empty labels map.
_HASH_START = PLAIN_TAIL + SHORT_LENGTHS[32]
_END = b"\x00"
_GROUPS, _VARINTS = LOW_GROUPS, VARINTS
_NAMES_LIMIT = 4096
_LENGTH_32 = SHORT_LENGTHS[32]


class _Names:
    """What a checked (queue, task) pair contributes to each of its jobs."""

    __slots__ = ("json", "octet", "queue_header", "size", "task_header", "text")

    def __init__(self, queue: str, task: str) -> None:
        self.text = queue_task(queue, task)
        self.queue_header, self.task_header, self.size = name_headers(queue, task)
        # per content type: (hasher holding the hash prefix, encoded content type)
        self.json = (content_hash_prefix(task, JSON), content_type_text(JSON))
        self.octet = (content_hash_prefix(task, OCTET_STREAM), content_type_text(OCTET_STREAM))


class BulkPlanner:
    """Plans the jobs of one ``schedule_many`` call (one thread at a time)."""

    def __init__(self, planner: TimerPlanner) -> None:
        self.planner = planner
        self.pending: list[tuple[str, Entry]] = []  # drawn ids, not yet remembered
        self._names: dict[tuple[str, str], _Names] = {}
        self._rules = planner.rules
        self._route = planner.rules.router.queue_for
        self._unknown: set[str] = set()  # queues looked up in vain during this call
        self._default_options = plain_options(planner.rules.default_max_attempts)
        self._placer = planner.placer
        self._near = planner.placer.near_partitions
        self._levels = planner.placer.levels
        self._near_window = planner.placer.near_window_ms
        self._sharded = planner.placer.shards > 1
        self._max_bytes = planner.max_record_bytes
        self._tails: list[str] = []
        self._ms = -1  # the millisecond of _head and _created
        self._head = ""
        self._created = b""

    def plan(self, req: JobRequest, now_ms: int) -> Plan | Scheduled:
        """:meth:`TimerPlanner.plan` of ``req`` as a :data:`Plan` (or the earlier
        result of an idempotent repeat); raises what it raises."""
        if (
            req.run_at is not None
            or req.jitter is not None
            or req.backoff is not None
            or req.timeout is not None
            or req.labels is not None
            or req.expires is not None
            or req.max_lateness is not None
        ):
            return self.general(self.planner.plan(req, now_ms=now_ms))
        # The checks in the order of TimerPlanner._plan_plain (so that the
        # first bad field is the one named, and ids are drawn alike).
        try:
            task = req.task
            queue = req.queue
            if queue is None:
                queue = self._route(task)
            try:
                names = self._names[queue, task]
            except (KeyError, TypeError):
                names = self._check_names(queue, task)
            payload = req.payload
            if type(payload) is dict:
                given = payload
                try:
                    payload = _dumps(given, option=_SORT_KEYS)
                except _JSON_ERRORS as exc:
                    raise bad_payload(given, exc) from None
                if b"null" in payload:  # NaN and Infinity come out as null
                    check_finite(given)
                hasher, content_type = names.json
            elif type(payload) is bytes:
                hasher, content_type = names.octet
            else:
                payload, ctype = encode_payload(payload)
                hasher, content_type = names.json if ctype == JSON else names.octet
            if now_ms != self._ms:
                self._ms = now_ms
                self._head = uuid7_head(now_ms)
                self._created = long_varint(now_ms)
            job_id = req.job_id
            if job_id is None:
                tails = self._tails
                if not tails:
                    tails = self._tails = self.planner.ids.tails()
                job_id = self._head + tails.pop()
                id_bytes = job_id.encode()
                id_length = _LENGTH_32
                drawn = True
            elif not is_name(job_id):
                raise bad_name("job_id", job_id)
            else:
                id_bytes = job_id.encode()
                id_length = _length(len(id_bytes))
                drawn = False
            key = req.idempotency_key
            if key is None:
                key, key_bytes, key_length = job_id, id_bytes, id_length
            elif not is_name(key):
                raise bad_name("idempotency_key", key)
            else:
                key_bytes = key.encode()
                key_length = _length(len(key_bytes))
            delay = req.delay
            due_ms = now_ms if delay is None else due_after(delay, now_ms=now_ms)
            attempts = req.max_attempts
            if attempts is None:
                options = self._default_options
            elif type(attempts) is not int or not 1 <= attempts <= MAX_INT32:
                raise bad_attempts(attempts)
            else:
                options = plain_options(attempts)
            z = due_ms << 1
            if 268_435_456 <= z < 4_398_046_511_104:  # 2**28 <= z < 2**42: see LOW_GROUPS
                due_low, due_mid, due_high = (
                    _GROUPS[z & 0x3FFF],
                    _GROUPS[(z >> 14) & 0x3FFF],
                    _VARINTS[z >> 28],
                )
            else:
                due_low, due_mid, due_high = long_varint(due_ms), b"", b""
            h = hasher.copy()
            h.update(payload)
            chash = h.hexdigest()
            n = len(payload)
            value = b"".join(
                (
                    id_length,
                    id_bytes,
                    names.text,
                    SHORT_LENGTHS[n] if n < 8192 else varint(n),
                    payload,
                    content_type,
                    due_low,
                    due_mid,
                    due_high,
                    key_length,
                    key_bytes,
                    options,
                    self._created,
                    _HASH_START,
                    chash.encode(),
                    _END,
                )
            )
            due = b"%d" % due_ms
            size = FIXED_RECORD_SIZE + names.size + len(key_bytes) + len(value) + len(due)
            if size + len(id_bytes) > self._max_bytes:
                raise self.planner.too_large(n, size + len(id_bytes))
            delta = due_ms - now_ms
            if delta <= self._near_window:
                spread = _crc32(key_bytes)
                partition = spread % self._near
            else:  # TimerPlacer.far_partition, inline
                spread = -1
                for reach, width, base, slots in self._levels:
                    if delta <= reach:
                        partition = base + (due_ms // width) % slots
                        break
                else:
                    partition = self._placer.far_partition(due_ms, now_ms)
            if self._sharded:
                if spread < 0:
                    spread = _crc32(key_bytes)
                partition += self._placer.shard_base(spread)
            entry = (chash, due_ms, queue, task, key, partition)
            if drawn:
                self.pending.append((job_id, entry))
            else:
                if self.pending:
                    self.remember()
                earlier = self.planner.recent.claim(job_id, entry, task)
                if earlier is not None:
                    return earlier
            headers = [
                (_DUE, due),
                names.queue_header,
                KIND_JOB_HEADER,
                (_JOB_ID, id_bytes),
                names.task_header,
                SCHEMA_HEADER,
            ]
            return (job_id, due_ms, queue, task, key, partition, key_bytes, value, headers)
        except (InvalidInput, ConflictError):
            self.planner.count_error(self.planner.rules.queue_of(req))
            raise

    def general(self, planned: PlannedTimer | Scheduled) -> Plan | Scheduled:
        """A plan of :meth:`TimerPlanner.plan` as a :data:`Plan`."""
        if type(planned) is Scheduled:
            return planned
        assert type(planned) is PlannedTimer
        job, rec = planned
        return (
            job.job_id,
            job.due_ms,
            job.queue,
            job.task,
            job.idempotency_key,
            rec.partition,
            rec.key,
            rec.value,
            rec.headers,
        )

    def _check_names(self, queue: Any, task: Any) -> _Names:
        if not is_task_name(task):
            raise bad_task(task)
        if queue not in self._rules.queues:
            if queue in self._unknown:
                raise unknown_queue(queue, self._rules.queues)
            try:
                self.planner.check_queue(queue)  # may read the registry once
            except InvalidInput:
                if isinstance(queue, str):
                    self._unknown.add(queue)
                raise
            self._rules = self.planner.rules
        names = _Names(queue, task)
        if len(self._names) < _NAMES_LIMIT:  # a call with very many task names
            self._names[queue, task] = names
        return names

    def remember(self) -> None:
        """Put the jobs planned with drawn ids into the recent-jobs memory."""
        pending, self.pending = self.pending, []
        self.planner.recent.remember(pending)

    def failed(self, job_id: str, queue: str) -> None:
        """Forget a plan whose write failed (see :meth:`TimerPlanner.failed`)."""
        pending = self.pending
        if pending and pending[-1][0] == job_id:
            pending.pop()
        self.planner.recent.forget(job_id)
        self.planner.count_error(queue)


def _length(n: int) -> bytes:
    return SHORT_LENGTHS[n] if n < 8192 else varint(n)
