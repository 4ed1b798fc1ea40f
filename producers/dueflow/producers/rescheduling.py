"""What a ``reschedule`` writes and when it refuses (pure; the rule is in
:mod:`dueflow.records.reschedule`).

- :func:`refusal`: why a job cannot be rescheduled (not found, a cron
  occurrence, started or finished already, due then already), or None;
- :func:`moved_timer`: the job's timer record again, due at the new time
  (same job id, key and value, but ``due_ms``; its trace context kept, its
  deadline moved with it: the same window after the new due time);
- :func:`reschedule_records`: the reschedule record for the job's key and the
  ``rescheduled`` outcome.
"""

from __future__ import annotations

from dataclasses import replace

from dueflow import headers as hdr
from dueflow.errors import UndecodableRecord
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.targets import Target
from dueflow.records import codec
from dueflow.records.reschedule import reschedule_key
from dueflow.records.timer_record import TimerPlacer, TimerRecord, framed_timer, timer_record
from dueflow.records.worker_codec import OUTCOME_V2, decode_job, encode_outcome
from dueflow.rules.deadline import moved_deadline
from dueflow.rules.job_status import PENDING_STATES
from dueflow.rules.partitioning import partition_for_key
from dueflow.timeutil import format_utc

# Headers of a timer that travel with the job when it moves (its trace).
KEPT_HEADERS = (hdr.TRACEPARENT, hdr.TRACESTATE, hdr.TRACE_LINK)


def refusal(target: Target, due_ms: int) -> str | None:
    """Why ``target`` cannot be moved to ``due_ms`` (None: it can)."""
    if not target.found:
        return "not found: no outcome of it, and this client did not schedule it"
    if target.schedule_id is not None:
        return (
            f"a cron occurrence of schedule {target.schedule_id!r}: change the schedule "
            "(update_schedule) or cancel the occurrence"
        )
    state = target.state
    if state is not None and state not in PENDING_STATES:
        if state == "retrying":
            return (
                "it has started (an attempt failed; its retry is due): only a job that has "
                "not started can be rescheduled (cancel it and schedule it again)"
            )
        if state == "duplicate":
            return "it ran already (a delivery of it was a duplicate: its key is done)"
        return f"it has {state} already"
    if target.due_ms == due_ms:
        return f"it is due then already ({format_utc(due_ms)})"
    return None


def moved_timer(
    value: bytes,
    headers: list[tuple[str, bytes]],
    *,
    due_ms: int,
    now_ms: int,
    placer: TimerPlacer,
    schema_id: int | None = None,
) -> TimerRecord:
    """The timer record of the job in ``value`` (a timer's or an exec record's, with
    its ``headers``), due at ``due_ms`` instead, written at ``now_ms``: plain, or
    framed with ``schema_id`` (the rescheduling client's registry option: the id
    names the schema this writes with, whatever the value it read held). Raises
    :class:`UndecodableRecord` when the value is not a job."""
    schema = hdr.header(headers, hdr.SCHEMA)
    job = decode_job(value, schema)
    if job.schedule_id is not None:
        raise UndecodableRecord("a cron occurrence, not a one-shot job")
    kept = [(k, v) for k, v in headers if k in KEPT_HEADERS]
    deadline = hdr.header(headers, hdr.EXPIRES)
    if deadline is not None and deadline.isdigit():  # the same window after the new due time
        moved = moved_deadline(int(deadline), old_due_ms=job.due_ms, new_due_ms=due_ms)
        kept.append((hdr.EXPIRES, b"%d" % moved))
    timer = timer_record(
        replace(job, due_ms=due_ms), now_ms=now_ms, placer=placer, trace_headers=kept
    )
    return timer if schema_id is None else framed_timer(timer, schema_id)


def reschedule_records(
    names: TopicNames,
    target: Target,
    *,
    due_ms: int,
    at_ms: int,
    partitions: int,
    trace_id: str | None = None,
) -> list[OutgoingRecord]:
    """The reschedule record of the job's key (on the key's partition of its queue's
    idempotency topic; schema version 3) and the ``rescheduled`` outcome."""
    key = target.idempotency_key.encode()
    record = OutgoingRecord(
        names.idempotency(target.queue),
        reschedule_key(key),
        codec.encode(
            "idempotency",
            {
                "idempotency_key": target.idempotency_key,
                "job_id": target.job_id,
                "state": "cancelled",  # every delivery but the one due at run_only_due_ms
                "at_ms": at_ms,
                "attempts": 0,
                "content_hash": target.content_hash,
                "run_only_due_ms": due_ms,
            },
        ),
        [
            (hdr.JOB_ID, target.job_id.encode()),
            (hdr.QUEUE, target.queue.encode()),
            (hdr.SCHEMA, codec.schema_header("idempotency", 3)),
        ],
        partition_for_key(key, partitions),
    )
    outcome = OutgoingRecord(
        names.outcomes,
        target.job_id.encode(),
        encode_outcome(
            job_id=target.job_id,
            queue=target.queue,
            task=target.task,
            idempotency_key=target.idempotency_key,
            state="rescheduled",
            attempt=0,
            at_ms=at_ms,
            due_ms=due_ms,
            trace_id=trace_id,
        ),
        [
            (hdr.JOB_ID, target.job_id.encode()),
            (hdr.QUEUE, target.queue.encode()),
            (hdr.SCHEMA, OUTCOME_V2),
        ],
    )
    return [record, outcome]
