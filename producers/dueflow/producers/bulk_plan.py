"""The per-job planning of ``schedule_many``: :class:`BulkPlanner` (no I/O).

``schedule_many`` plans up to 100k jobs a second in one thread, so for the
common request (task, payload, delay, queue, ids and attempts only) this does
what :meth:`TimerPlanner.plan <dueflow.producers.core.TimerPlanner.plan>` does
with what repeats from job to job computed once per call:

- per (queue, task): the checks, the encoded names and their header pairs;
  per content type also the content hash's prefix (a hasher to copy);
- per millisecond: the time part of job ids and the encoded ``created_ms``;
- per batch of ids: their random parts (:meth:`JobIds.tails`).

With ``outcomes``, each planned job's ``scheduled`` outcome record is built
too, from the encoded pieces its timer record already has, and kept in
:attr:`BulkPlanner.outcomes` until the caller writes it (after the timer is
acknowledged: :mod:`dueflow.producers.outcomes`).

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
from dueflow.observability.tracing import trace_id_of
from dueflow.producers.core import PlannedTimer, TimerPlanner
from dueflow.producers.outcomes import PLAIN_DUE, PLAIN_END, PLAIN_STATE
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
    KIND_JOB_HEADER,
    PLAIN_FIXED_BODY,
    SCHEMA_HEADER,
    name_headers,
)
from dueflow.records.varint import LOW_GROUPS, VARINTS, long_varint, varint
from dueflow.records.worker_codec import encode_scheduled
from dueflow.rules.wire_bounds import MAX_DUE_MS
from dueflow.task_name import is_task_name

# What the bulk loop needs of a planned job: job_id, due_ms, queue, task,
# idempotency_key, partition, then the record's key, value and headers.
Plan = tuple[str, int, str, str, str, int, bytes, bytes, list[tuple[str, bytes]], str]
# A job's ``scheduled`` outcome record: key, value and the content hash for its
# df-content-hash header (b"": none). Bytes only, so the cyclic garbage collector
# stops tracking the tuples a call holds (a list of headers each would make every
# collection walk them).
Outcome = tuple[bytes, bytes, bytes]
# A job's id and key as BulkPlanner._ids gives them: the job id, its UTF-8 bytes and
# their Avro length, whether it was drawn, then the same three of the key.
_Ids = tuple[str, bytes, bytes, bool, str, bytes, bytes]

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
# A timer record's size is at most its body's fixed part, the names, the lengths
# of key, job id, value and df-due, plus this: the batch header and the varints of
# the key, job id, value and body lengths (2 + 2 + 4 + 4 bytes at most for values
# below 128 MiB). Only a record whose bound passes the budget's fast limit is
# measured exactly (TimerPlanner.check_size).
_BOUND_EXTRA = 61 + PLAIN_FIXED_BODY + 12


class _Names:
    """What a checked (queue, task) pair contributes to each of its jobs."""

    __slots__ = (
        "json",
        "limit",
        "octet",
        "queue",
        "queue_header",
        "size",
        "task_header",
        "text",
    )

    def __init__(self, queue: str, task: str, fast_limit: int) -> None:
        self.queue = queue
        self.text = queue_task(queue, task)
        self.queue_header, self.task_header, size = name_headers(queue, task)
        self.size = size + _BOUND_EXTRA  # the record's size is at most this + the lengths
        self.limit = fast_limit  # the queue's budget (JobBudget.fast_limit)
        # per content type: (hasher holding the hash prefix, encoded content type)
        self.json = (content_hash_prefix(task, JSON), content_type_text(JSON))
        self.octet = (content_hash_prefix(task, OCTET_STREAM), content_type_text(OCTET_STREAM))


class BulkPlanner:
    """Plans the jobs of one ``schedule_many`` call (one thread at a time)."""

    def __init__(self, planner: TimerPlanner, *, outcomes: bool = False) -> None:
        self.planner = planner
        # drawn ids and their entries, not yet remembered
        self.pending_ids: list[str] = []
        self.pending: list[Entry] = []
        # The `scheduled` outcomes of the jobs planned, in order (with ``outcomes``).
        self.outcomes: list[Outcome] | None = [] if outcomes else None
        # by (queue, task), and by (None, task) for a task's route
        self._names: dict[tuple[str | None, str], _Names] = {}
        self._rules = planner.rules
        self._route = planner.rules.router.queue_for
        self._unknown: set[str] = set()  # queues looked up in vain during this call
        self._default_options = plain_options(planner.rules.default_max_attempts)
        self._placer = planner.placer
        self._near = planner.placer.near_partitions
        self._levels = planner.placer.levels
        self._near_window = planner.placer.near_window_ms
        self._sharded = planner.placer.shards > 1
        self._framed = planner.schema_ids is not None  # framed values: the planner's path
        self._tails: list[str] = []
        self._ms = -1  # the millisecond of _head and _created
        self._head = ""
        self._created = b""
        self._scheduled_at = b""  # a scheduled outcome's bytes from its state to due_ms

    def plan(self, req: JobRequest, now_ms: int) -> Plan | Scheduled:
        """:meth:`TimerPlanner.plan` of ``req`` as a :data:`Plan` (or the earlier
        result of an idempotent repeat); raises what it raises. The checks come in
        the order of :func:`~dueflow.records.job_request.prepare_job` (so that the
        first bad field is the one named, and ids are drawn alike)."""
        # About 85 lines in one frame on purpose: this runs for every job of
        # schedule_many (100k jobs/s); what is not per job is in the helpers below.
        if (
            req.run_at is not None
            or req.jitter is not None
            or req.backoff is not None
            or req.timeout is not None
            or req.labels is not None
            or req.expires is not None
            or req.max_lateness is not None
            or self._framed
        ):
            return self.general(self.planner.plan(req, now_ms=now_ms))
        try:
            task = req.task
            try:
                names = self._names[req.queue, task]
            except (KeyError, TypeError):
                names = self._check_names(req.queue, task)
            queue = names.queue
            payload, (hasher, content_type) = self._payload(req.payload, names)
            job_id, id_bytes, id_length, drawn, key, key_bytes, key_length = self._ids(req, now_ms)
            delay = req.delay
            if delay is None:
                due_ms = now_ms
            elif type(delay) is not int or delay < 0 or now_ms + delay * 1000 > MAX_DUE_MS:
                due_ms = due_after(delay, now_ms=now_ms)  # the rarer durations, and errors
            else:  # due_after's fast case, inline
                due_ms = now_ms + delay * 1000
            attempts = req.max_attempts
            if attempts is None:
                options = self._default_options
            elif type(attempts) is not int or not 1 <= attempts <= MAX_INT32:
                raise bad_attempts(attempts)
            else:
                options = plain_options(attempts)
            due_at = _due_varint(due_ms)
            h = hasher.copy()
            h.update(payload)
            chash = h.hexdigest()
            chash_bytes = chash.encode()
            n = len(payload)
            value = b"".join(
                (
                    id_length,
                    id_bytes,
                    names.text,
                    SHORT_LENGTHS[n] if n < 8192 else varint(n),
                    payload,
                    content_type,
                    due_at,
                    key_length,
                    key_bytes,
                    options,
                    self._created,
                    _HASH_START,
                    chash_bytes,
                    _END,
                )
            )
            due = b"%d" % due_ms
            headers = [
                (_DUE, due),
                names.queue_header,
                KIND_JOB_HEADER,
                (_JOB_ID, id_bytes),
                names.task_header,
                SCHEMA_HEADER,
            ]
            if names.size + len(key_bytes) + len(value) + len(due) + len(id_bytes) > names.limit:
                planner = self.planner
                planner.check_size(planner.budget_of(queue), key_bytes, value, headers, n)
            partition = self._partition(due_ms, now_ms, key_bytes)
            entry = (chash, due_ms, queue, task, key, partition)
            if drawn:
                self.pending_ids.append(job_id)
                self.pending.append(entry)
            else:
                earlier = self._claim(job_id, entry, task)
                if earlier is not None:
                    return earlier
            if self.outcomes is not None:  # at_ms: when the job was planned (its created_ms)
                ids = (id_length, id_bytes, key_length, key_bytes)
                self._add_outcome(names, ids, due_at, chash_bytes)
            return (job_id, due_ms, queue, task, key, partition, key_bytes, value, headers, chash)
        except (InvalidInput, ConflictError):
            self.planner.count_error(self.planner.rules.queue_of(req))
            raise

    def _payload(self, payload: Any, names: _Names) -> tuple[bytes, tuple[Any, bytes]]:
        """The payload's bytes, the hasher of its content hash's prefix and its
        encoded content type (a dict as JSON, bytes as they are: the common cases)."""
        if type(payload) is dict:
            try:
                raw = _dumps(payload, option=_SORT_KEYS)
            except _JSON_ERRORS as exc:
                raise bad_payload(payload, exc) from None
            if raw.find(b"null") >= 0:  # NaN and Infinity come out as null
                check_finite(payload)
            return raw, names.json
        if type(payload) is bytes:
            return payload, names.octet
        raw, content_type = encode_payload(payload)
        return raw, names.json if content_type == JSON else names.octet

    def _ids(
        self, req: JobRequest, now_ms: int
    ) -> tuple[str, bytes, bytes, bool, str, bytes, bytes]:
        """The job id (drawn when the request has none: ``drawn``), the key, each with
        its UTF-8 bytes and their Avro length; :class:`InvalidInput` names a bad one."""
        if now_ms != self._ms:
            self._ms = now_ms
            self._head = uuid7_head(now_ms)
            self._created = long_varint(now_ms)
            self._scheduled_at = PLAIN_STATE + self._created + PLAIN_DUE
        job_id = req.job_id
        if job_id is None:
            tails = self._tails
            if not tails:
                tails = self._tails = self.planner.ids.tails()
            job_id = self._head + tails.pop()
            id_bytes = job_id.encode()
            id_length = _LENGTH_32
            drawn = True
        else:
            id_bytes, id_length = _name_bytes("job_id", job_id)
            drawn = False
        key = req.idempotency_key
        if key is None:
            return job_id, id_bytes, id_length, drawn, job_id, id_bytes, id_length
        key_bytes, key_length = _name_bytes("idempotency_key", key)
        return job_id, id_bytes, id_length, drawn, key, key_bytes, key_length

    def _partition(self, due_ms: int, now_ms: int, key_bytes: bytes) -> int:
        """:meth:`TimerPlacer.partition <dueflow.records.timer_record.TimerPlacer.partition>`,
        with the placer's tables read once per call."""
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
        return partition

    def _claim(self, job_id: str, entry: Entry, task: str) -> Scheduled | None:
        """Claim a caller's job id in the recent-jobs memory (the drawn ids planned
        before it first), as :meth:`TimerPlanner.plan` does: the earlier result of
        a repeat, or None."""
        if self.pending_ids:
            self.remember()
        return self.planner.recent.claim(job_id, entry, task)

    def _add_outcome(
        self,
        names: _Names,
        ids: tuple[bytes, bytes, bytes, bytes],
        due_at: bytes,
        chash: bytes,
    ) -> None:
        """Keep the ``scheduled`` outcome of the job just planned (see the module doc):
        ``ids``: the lengths and bytes of its id and key."""
        assert self.outcomes is not None
        id_length, id_bytes, key_length, key_bytes = ids
        self.outcomes.append(
            (
                id_bytes,
                b"".join(
                    (
                        id_length,
                        id_bytes,
                        names.text,
                        key_length,
                        key_bytes,
                        self._scheduled_at,
                        due_at,
                        PLAIN_END,
                    )
                ),
                chash,
            )
        )

    def general(self, planned: PlannedTimer | Scheduled) -> Plan | Scheduled:
        """A plan of :meth:`TimerPlanner.plan` as a :data:`Plan`."""
        if type(planned) is Scheduled:
            return planned
        assert type(planned) is PlannedTimer
        job, rec = planned
        if self.outcomes is not None:
            value = encode_scheduled(
                job.job_id,
                job.queue,
                job.task,
                job.idempotency_key,
                job.due_ms,
                job.created_ms,
                trace_id_of(rec.headers),
                None,
            )
            chash = (job.content_hash or "").encode()
            self.outcomes.append((job.job_id.encode(), value, chash))
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
            job.content_hash or "",
        )

    def _check_names(self, given: Any, task: Any) -> _Names:
        """The names of ``task`` in queue ``given`` (None: the task's route), checked
        as :func:`~dueflow.records.job_request.prepare_job` checks them, in its order."""
        queue = self._route(task) if given is None else given
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
        if self._rules.known_tasks is not None:
            self._rules.check_task(task)
        names = _Names(queue, task, self.planner.budget_of(queue).fast_limit)
        if len(self._names) < _NAMES_LIMIT:  # a call with very many task names
            self._names[given, task] = names
        return names

    def remember(self) -> None:
        """Put the jobs planned with drawn ids into the recent-jobs memory."""
        job_ids, entries = self.pending_ids, self.pending
        self.pending_ids, self.pending = [], []
        self.planner.recent.remember(job_ids, entries)

    def failed(self, job_id: str, queue: str) -> None:
        """Forget the last plan, ``job_id``, whose write failed (see
        :meth:`TimerPlanner.failed`); its outcome is not written."""
        pending = self.pending_ids
        if pending and pending[-1] == job_id:
            pending.pop()
            self.pending.pop()
        outcomes = self.outcomes
        if outcomes and outcomes[-1][0] == job_id.encode():
            outcomes.pop()
        self.planner.recent.forget(job_id)
        self.planner.count_error(queue)


def _length(n: int) -> bytes:
    return SHORT_LENGTHS[n] if n < 8192 else varint(n)


def _name_bytes(field: str, name: object) -> tuple[bytes, bytes]:
    """A caller's job id or key: its UTF-8 bytes and their Avro length;
    :class:`InvalidInput` names ``field`` when it is no usable name."""
    if not is_name(name):
        raise bad_name(field, name)
    assert isinstance(name, str)
    raw = name.encode()
    return raw, _length(len(raw))


def _due_varint(due_ms: int) -> bytes:
    """The Avro long ``due_ms``: table lookups for the due times of this era
    (2**28 <= 2 * due_ms < 2**42: see LOW_GROUPS)."""
    z = due_ms << 1
    if 268_435_456 <= z < 4_398_046_511_104:
        return _GROUPS[z & 0x3FFF] + _GROUPS[(z >> 14) & 0x3FFF] + _VARINTS[z >> 28]
    return long_varint(due_ms)
