"""The records that cancel a job (pure): an idempotency record and an outcome.

The idempotency record (state ``cancelled``) goes to
``<prefix>.idempotency.<queue>`` keyed by the job's idempotency key, on the
partition murmur2 picks for that key (explicitly when the queue's partition
count is given, else by the producer's murmur2 partitioner): the same
partition as the job's exec record, because the exec and idempotency topics
of a queue are co-partitioned and the emitter keys exec records by the same
key. The worker that owns that partition therefore sees the cancellation and
skips the job. A cron occurrence may instead be delivered on its schedule's
partition (a schedule with an overlap policy, see ``dueflow.rules.cron_overlap``):
for one, the cancellation goes there too. The outcome (state ``cancelled``)
goes to the outcomes topic keyed by job id, for the status view.

Both are written in version 1 of their schemas, which every reader knows (a
reader resolves only the versions it knows).
"""

from __future__ import annotations

from dataclasses import dataclass

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.kafka.topics import TopicNames
from dueflow.records.job_request import MAX_NAME_CHARS
from dueflow.records.worker_codec import (
    IDEMPOTENCY_V1,
    OUTCOME_V1,
    encode_key_state,
    encode_outcome,
)
from dueflow.rules.partitioning import partition_for_key


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A record to produce; ``partition`` None lets the partitioner choose."""

    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone
    headers: list[tuple[str, bytes]]
    partition: int | None = None


def cancel_records(
    *,
    names: TopicNames,
    job_id: str,
    queue: str,
    idempotency_key: str,
    at_ms: int,
    task: str = "",
    due_ms: int | None = None,
    content_hash: str | None = None,
    schedule_id: str | None = None,
    partitions: int | None = None,
) -> list[OutgoingRecord]:
    """The idempotency record(s) and, last, the outcome that cancel ``job_id``.

    ``partitions``: the queue's partition count, to write on an explicit
    partition (and, for a cron occurrence, on its schedule's partition too)."""
    for field, given in (("job_id", job_id), ("idempotency_key", idempotency_key)):
        if not isinstance(given, str) or not given or len(given) > MAX_NAME_CHARS:
            raise InvalidInput(
                field, given, f"a non-empty string of at most {MAX_NAME_CHARS} chars"
            )
    key = idempotency_key.encode()
    value = encode_key_state(
        idempotency_key=idempotency_key,
        job_id=job_id,
        state="cancelled",
        at_ms=at_ms,
        attempts=0,
        content_hash=content_hash,
    )
    headers = [
        (hdr.JOB_ID, job_id.encode()),
        (hdr.QUEUE, queue.encode()),
        (hdr.SCHEMA, IDEMPOTENCY_V1),
    ]
    topic = names.idempotency(queue)
    where = [None if partitions is None else partition_for_key(key, partitions)]
    if schedule_id is not None and partitions is not None:
        by_schedule = partition_for_key(schedule_id.encode(), partitions)
        if by_schedule != where[0]:
            where.append(by_schedule)
    idem = [OutgoingRecord(topic, key, value, list(headers), p) for p in where]
    outcome = OutgoingRecord(
        names.outcomes,
        job_id.encode(),
        encode_outcome(
            job_id=job_id,
            queue=queue,
            task=task,
            idempotency_key=idempotency_key,
            state="cancelled",
            attempt=0,
            at_ms=at_ms,
            due_ms=due_ms,
            schedule_id=schedule_id,
        ),
        [
            (hdr.JOB_ID, job_id.encode()),
            (hdr.QUEUE, queue.encode()),
            (hdr.SCHEMA, OUTCOME_V1),
        ],
    )
    return [*idem, outcome]
