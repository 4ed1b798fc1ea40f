"""Follow-up jobs: what a handler schedules with ``ctx.schedule`` (pure).

A follow-up is an ordinary job (a timer record in ``<prefix>.timers``), but
the worker writes it in the transaction that completes the attempt that asked
for it, next to the attempt's idempotency ``done`` record, outcome and
offsets: the follow-up exists if and only if the attempt's success was
committed. An attempt that fails, is retried or dead-lettered writes none of
its follow-ups; an attempt that ran but was not committed (the process died)
runs again and asks again.

Its record is built as the scheduling client builds one:
:func:`~dueflow.records.job_request.prepare_job` checks the request (task name,
payload encoding and NaN refusal, queue, due-time limits, ...) and
:func:`~dueflow.records.timer_record.timer_record` makes the record, whose size is
checked against the size budget of its queue (every hop of the job must fit,
:mod:`dueflow.records.size_budget`). Only its partition is chosen again
when the batch is written (:func:`place_follow_up`): placement depends on the
time of writing, and a handler may run on for a long time after the call.

Ids are deterministic, so an attempt that runs again asks for the same jobs:
the job id and idempotency key of the n-th follow-up (0-based) of the job
with key ``K`` are ``K/n`` (:func:`follow_up_key`), unless the call names its
own ``idempotency_key`` (then the job id defaults to it) or ``job_id``.
Only a committed attempt's records ever exist; were two attempts ever
committed (a key forgotten after its retention, a replay), the second
follow-up has the same key and is skipped as a duplicate by the worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import NamedTuple

from dueflow import headers as hdr
from dueflow.control_chars import escape_text
from dueflow.errors import InvalidInput
from dueflow.records.job_request import (
    MAX_NAME_CHARS,
    JobRequest,
    JobRules,
    bad_name,
    is_name,
    prepare_job,
)
from dueflow.records.size_budget import JobBudget, job_shape
from dueflow.records.timer_record import (
    TimerPlacer,
    TimerRecord,
    spread_of,
    timer_record,
)
from dueflow.timeutil import from_utc_ms

_HASH_HEX = 16  # hex digits of the parent key's hash in a shortened key


def follow_up_key(parent_key: str, index: int) -> str:
    """The default job id and idempotency key of follow-up ``index`` (0-based, in
    call order) of the job whose idempotency key is ``parent_key``.

    ``<parent_key>/<index>``; a result longer than a key may be (255
    characters) keeps the start of the parent key and a hash of all of it:
    ``<start>~<16 hex>/<index>``, so a chain of any length has bounded keys.
    A parent key that is no usable name (control characters: written by a
    client without dueflow's checks) gives ``<start, escaped>~<16 hex>/<index>``,
    so its follow-ups still get a key the doors accept.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidInput("index", index, "an integer >= 0")
    suffix = f"/{index}"
    key = parent_key + suffix
    usable = is_name(parent_key)
    if usable and len(key) <= MAX_NAME_CHARS:
        return key
    raw = parent_key.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(raw, digest_size=_HASH_HEX // 2).hexdigest()
    tail = f"~{digest}{suffix}"
    start = parent_key if usable else escape_text(parent_key)
    return start[: MAX_NAME_CHARS - len(tail)] + tail


class FollowUp(NamedTuple):
    """A job a handler scheduled with ``ctx.schedule``: written to the timer topic
    with the attempt's success, not before (and never if the attempt fails)."""

    job_id: str
    idempotency_key: str
    queue: str
    task: str
    due_ms: int
    call_index: int  # the call's position among this attempt's follow-ups (0-based)
    content_hash: str

    @property
    def due(self) -> datetime:
        """The due time as a tz-aware UTC datetime."""
        return from_utc_ms(self.due_ms)


class PlannedFollowUp(NamedTuple):
    """A checked follow-up and its timer record (partition as of the call);
    ``pass_result``: it receives its parent's result (``df-parent-result``)."""

    follow_up: FollowUp
    record: TimerRecord
    pass_result: bool = False

    def same_job(self, other: PlannedFollowUp) -> bool:
        """Whether ``other`` asks for the same job (a repeat of the call)."""
        a, b = self.follow_up, other.follow_up
        return (a.content_hash, a.due_ms, a.queue, a.task, a.idempotency_key) == (
            b.content_hash,
            b.due_ms,
            b.queue,
            b.task,
            b.idempotency_key,
        )


def plan_follow_up(
    req: JobRequest,
    *,
    parent_job_id: str,
    parent_key: str,
    index: int,
    now_ms: int,
    rules: JobRules,
    placer: TimerPlacer,
    budget: Callable[[str], JobBudget],
    trace_headers: Sequence[tuple[str, bytes]] = (),
) -> PlannedFollowUp:
    """Check follow-up ``index`` of the job ``parent_job_id`` (key ``parent_key``)
    and build its timer record as of ``now_ms``; :class:`InvalidInput` names the
    first bad field. A request without a queue goes where the task is routed
    (``rules.router``: ``[routes]``, the task's ``@task(queue=...)``, ``default``),
    as the scheduling client routes it.

    ``trace_headers`` (``traceparent``/``tracestate``) continue the parent's
    trace: they go on the record and into the job's ``trace`` field.
    ``budget(queue)``: the size budget of the follow-up's queue
    (:class:`~dueflow.records.size_budget.RecordTooLarge` when a hop would not fit).
    """
    key = req.idempotency_key
    job_id = req.job_id
    id_from_key = job_id is None and key is not None
    if key is None and job_id is None:
        job_id = key = follow_up_key(parent_key, index)
    elif job_id is None:
        job_id = key
    elif key is None:
        key = job_id  # as the scheduling client does
    if key == parent_key:
        raise InvalidInput(
            "idempotency_key",
            parent_key,
            "a key other than the scheduling job's own (that key is final once the "
            "job succeeds: the follow-up would be skipped as a duplicate)",
        )
    req = replace(req, job_id=job_id, idempotency_key=key)
    trace = {k: v.decode("ascii", "replace") for k, v in trace_headers}
    try:
        job = prepare_job(req, now_ms=now_ms, rules=rules, new_job_id=_unused, trace=trace)
    except InvalidInput as exc:
        if exc.field == "job_id" and id_from_key:
            raise bad_name("idempotency_key", key) from None  # the caller gave the key
        raise
    record = timer_record(
        job,
        now_ms=now_ms,
        placer=placer,
        trace_headers=[*trace_headers, (hdr.PARENT, parent_job_id.encode())],
    )
    refusal = budget(job.queue).refusal(
        job_shape(record.key, record.value, record.headers, payload=len(job.payload))
    )
    if refusal is not None:
        raise refusal
    follow_up = FollowUp(
        job.job_id,
        job.idempotency_key,
        job.queue,
        job.task,
        job.due_ms,
        index,
        job.content_hash or "",
    )
    return PlannedFollowUp(follow_up, record)


def place_follow_up(planned: PlannedFollowUp, *, now_ms: int, placer: TimerPlacer) -> int:
    """The timer-topic partition of a follow-up written at ``now_ms`` (the wheel's
    rule, as for any timer: a follow-up due now or overdue goes to a near
    partition and fires at once, never before its due time)."""
    return placer.partition(
        due_ms=planned.follow_up.due_ms, now_ms=now_ms, spread=spread_of(planned.record.key)
    )


def _unused(now_ms: int) -> str:  # every follow-up request carries its job id
    raise AssertionError("a follow-up's job id is derived, never drawn")
