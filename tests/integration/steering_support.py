"""Helpers of the steering tests: a ledger of runs with their payload and version,
firing timer records into exec topics as the emitter would, reading the steering
topic's last state per key."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from dueflow import __version__
from dueflow import headers as hdr
from dueflow.apps.ops.finalize import finalize_queue, group_members
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.testing import ExecWriter
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topics import names
from dueflow.records.features import steering_capable
from dueflow.records.steering_state import SCHEMA, decode_job_state, job_of
from dueflow.steering_model import JobSteering
from tests.integration.steering_app import RunLedger
from tests.integration.worker_support import Record, read_topic, wait_for

__all__ = ["RunLedger"]

_NOT_READY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


def ledger_task(ledger: RunLedger, *, queue: str, name: str = "steered") -> TaskRegistry:
    @task(name, queue=queue)
    def steered(payload: Any, ctx: TaskContext) -> None:
        ledger.add(payload, ctx)

    return TaskRegistry([steered])


def finalize_when_workers_joined(settings: Settings, queue: str, workers: int = 1) -> None:
    """Finalize ``queue`` once ``workers`` members that apply commands are in its group."""
    admin = make_admin(settings)
    group = names(settings).worker_group(queue)

    def joined() -> bool:
        try:
            members = group_members(admin, group, 10)
        except KafkaOperationError as exc:  # a fresh broker's coordinator: not ready yet
            cause = exc.cause
            err = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
            if isinstance(err, KafkaError) and (err.retriable() or err.code() in _NOT_READY):
                return False
            raise
        return len(members) >= workers and all(steering_capable(c) for c, _ in members)

    wait_for(f"{workers} worker(s) of {queue} in their group", joined, 60)
    done = finalize_queue(settings, queue, by="test", now_ms=int(time.time() * 1000))
    assert done.written or not done.workers, done
    assert __version__


def fire(
    settings: Settings,
    timers: Sequence[Record],
    *,
    due_now: bool = False,
    writer: ExecWriter | None = None,
) -> None:
    """Write timer records to their queue's exec topic as the emitter fires them: the
    value unchanged, the timer's headers plus ``df-fired``/``df-src``, on
    ``df-partition`` or the key's partition. ``due_now``: as if their due time had
    come (``df-due`` now: the test cannot wait years)."""
    own = writer is None
    writer = writer or ExecWriter(settings)
    now = int(time.time() * 1000)
    for t in timers:
        headers = [(k, v) for k, v in t.headers.items()]
        if due_now:
            headers = hdr.replace(headers, [(hdr.DUE, now)])
        queue = t.headers[hdr.QUEUE].decode()
        partition = int(t.headers[hdr.PARTITION]) if hdr.PARTITION in t.headers else -1
        fired = hdr.fired(
            list(headers),
            fired_at=str(now).encode(),
            source=hdr.source_of(t.topic, t.partition, t.offset),
        )
        writer.write_raw(queue, t.key, t.value, fired, partition=partition)
    if own:
        writer.flush()


def timers_of(settings: Settings, job_id: str, records: Sequence[Record]) -> list[Record]:
    return [r for r in records if r.headers.get(hdr.JOB_ID) == job_id.encode()]


def steering_states(settings: Settings, queue: str) -> dict[bytes, JobSteering | None]:
    """The last record of every job key in the queue's steering topic (None: a tombstone)."""
    out: dict[bytes, JobSteering | None] = {}
    for r in read_topic(settings, names(settings).steering(queue)):
        key = job_of(r.key or b"")
        if key is None:
            continue
        out[key] = None if r.value is None else decode_job_state(r.value, SCHEMA)
    return out
