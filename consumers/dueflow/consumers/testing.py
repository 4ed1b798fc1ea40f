"""Write exec records exactly as the emitter does, for tests, benchmarks and demos.

The emitter fires a timer by writing its value bytes unchanged to
``<prefix>.exec.<queue>``, keyed by the idempotency key (the murmur2
partitioner picks the partition) with the timer's headers plus ``df-fired``
and ``df-src``. :class:`ExecWriter` writes the same records without a wheel.

These helpers need a broker: they are for dueflow's own integration tests,
benchmarks and demo. To test your own handlers without Kafka, use
:mod:`dueflow.testing` (the pipeline in memory), which neither re-exports nor
replaces this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.model import Backoff, Job
from dueflow.records import codec
from dueflow.wall_clock import wall_ms


def make_job(
    task: str,
    payload: Any = None,
    *,
    queue: str = "default",
    key: str | None = None,
    job_id: str | None = None,
    due_ms: int | None = None,
    max_attempts: int = 4,
    backoff: Backoff | None = None,
    timeout_ms: int | None = None,
    raw_payload: bytes | None = None,
    content_type: str = "application/json",
) -> Job:
    """A job due now (or at ``due_ms``); ``payload`` is JSON-encoded unless ``raw_payload``."""
    now = wall_ms()
    job_id = job_id or uuid.uuid4().hex
    return Job(
        job_id=job_id,
        queue=queue,
        task=task,
        payload=raw_payload if raw_payload is not None else orjson.dumps(payload),
        due_ms=now if due_ms is None else due_ms,
        idempotency_key=key or job_id,
        created_ms=now,
        content_type=content_type,
        max_attempts=max_attempts,
        backoff=backoff,
        timeout_ms=timeout_ms,
    )


def exec_headers(job: Job, *, fired_ms: int | None = None) -> hdr.Headers:
    """The headers an exec record of ``job`` carries when the emitter fires it."""
    timer = hdr.encode(
        [
            (hdr.DUE, job.due_ms),
            (hdr.QUEUE, job.queue),
            (hdr.JOB_ID, job.job_id),
            (hdr.TASK, job.task),
            (hdr.SCHEMA, codec.schema_header("job")),
        ]
    )
    at = fired_ms if fired_ms is not None else wall_ms()
    return hdr.fired(timer, fired_at=str(at).encode(), source=hdr.source_of("timers", 0, 0))


class ExecWriter:
    """Produces exec records (idempotent producer, flushed on demand)."""

    def __init__(self, settings: Settings, **producer_config: Any) -> None:
        self._names = names(settings)
        self._producer = make_producer(settings, **producer_config)

    def write(self, jobs: Iterable[Job], *, partition: int = -1) -> int:
        """Write ``jobs`` to their queues' exec topics (to ``partition`` when given,
        else by key); returns how many."""
        count = 0
        for job in jobs:
            value = codec.encode("job", job.to_record())
            self.write_raw(
                job.queue,
                job.idempotency_key.encode(),
                value,
                exec_headers(job),
                partition=partition,
            )
            count += 1
        return count

    def write_raw(
        self,
        queue: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        *,
        partition: int = -1,
    ) -> None:
        """Write one exec record as given (for malformed-record tests)."""
        topic = self._names.exec(queue)
        while True:
            try:
                self._producer.produce(
                    topic, value, key, partition=partition, headers=list(headers or [])
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        left = self._producer.flush(timeout)
        if left:
            raise RuntimeError(f"{left} exec records not delivered within {timeout} s")
