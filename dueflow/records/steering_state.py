"""Steering state records: what the owner of an exec partition keeps about steered jobs (pure).

``<prefix>.steering.<queue>`` is compacted and co-partitioned with the exec
topic. Only the worker that owns exec partition p writes partition p, in the
transaction that commits the exec offsets of what changed it, so its copy in
memory (plus what it has not committed yet) is the truth while it owns p.
Keys are namespaced: ``j\\x00<idempotency key>`` (a job), ``u\\x00<unique key>``,
``g\\x00<group id>``; the value is Avro ``dueflow.SteeringState`` with one
section set. A tombstone removes an entry once nothing of it is pending.

:class:`JobSteering` is the job section as the rule
(:mod:`dueflow.rules.steering`) sees it; :func:`encode_job_state` and
:func:`decode_state` are the codec.
"""

from __future__ import annotations

from typing import Any

from dueflow.errors import UndecodableRecord
from dueflow.records import codec
from dueflow.steering_model import ORIGINAL, JobSteering, Outstanding, Patch, UniqueEntry

__all__ = ["ORIGINAL", "JobSteering", "Outstanding", "Patch", "UniqueEntry"]

# What a steering store holds under a key: a job's state (key: its idempotency key),
# or a unique key's entry (key: the steering-topic key, u\x00<unique key>).
Entry = JobSteering | UniqueEntry

JOB_PREFIX = b"j\x00"
UNIQUE_PREFIX = b"u\x00"
GROUP_PREFIX = b"g\x00"
SCHEMA = codec.schema_header("steering_state", 1)


def job_key(idempotency_key: bytes) -> bytes:
    """The steering-topic key of a job's state."""
    return JOB_PREFIX + idempotency_key


def job_of(state_key: bytes) -> bytes | None:
    """The idempotency key a job state record is about; None for other entries."""
    return state_key[len(JOB_PREFIX) :] if state_key.startswith(JOB_PREFIX) else None


def encode_job_state(state: JobSteering) -> bytes:
    """Avro binary of a ``SteeringState`` holding ``state`` (version 1)."""
    patch = state.patch
    return codec.encode(
        "steering_state",
        {
            "job": {
                "job_id": state.job_id,
                "idempotency_key": state.idempotency_key,
                "current": state.current,
                "current_due_ms": state.current_due_ms,
                "cancelled": state.cancelled,
                "ended": state.ended,
                "outstanding": [{"token": o.token, "due_ms": o.due_ms} for o in state.outstanding],
                "patch": None
                if patch is None
                else {
                    "token": patch.token,
                    "due_ms": patch.due_ms,
                    "payload": patch.payload,
                    "content_type": patch.content_type,
                    "command_id": patch.command_id,
                },
                "exec_partition": state.exec_partition,
                "last_command_id": state.last_command_id,
                "updated_ms": state.updated_ms,
            },
            "unique": None,
            "group": None,
        },
        version=1,
    )


def decode_state(data: bytes, schema: bytes | None) -> dict[str, Any]:
    """The ``SteeringState`` record of a value (``schema``: its ``df-schema`` header);
    :class:`UndecodableRecord` when it is none."""
    version = codec.parse_schema_header(schema, expected="steering_state")
    rec = codec.decode("steering_state", data, writer_version=version)
    if sum(rec.get(s) is not None for s in ("job", "unique", "group")) != 1:
        raise UndecodableRecord("a steering state needs exactly one of job, unique, group")
    return rec


def decode_job_state(data: bytes, schema: bytes | None) -> JobSteering:
    """The job section of a state value; :class:`UndecodableRecord` when it has none."""
    job = decode_state(data, schema).get("job")
    if job is None:
        raise UndecodableRecord("the steering state has no job section")
    return job_state_of(job)


def job_state_of(job: dict[str, Any]) -> JobSteering:
    patch = job.get("patch")
    return JobSteering(
        job_id=job["job_id"],
        idempotency_key=job["idempotency_key"],
        current=job.get("current") or ORIGINAL,
        current_due_ms=job.get("current_due_ms"),
        cancelled=bool(job.get("cancelled")),
        ended=job.get("ended"),
        outstanding=tuple(
            Outstanding(o["token"], o.get("due_ms")) for o in job.get("outstanding") or ()
        ),
        patch=None
        if patch is None
        else Patch(
            token=patch["token"],
            due_ms=patch.get("due_ms"),
            payload=patch.get("payload"),
            content_type=patch.get("content_type"),
            command_id=patch["command_id"],
        ),
        exec_partition=int(job.get("exec_partition", -1)),
        last_command_id=job.get("last_command_id"),
        updated_ms=int(job.get("updated_ms") or 0),
    )


def unique_key(key: str) -> bytes:
    """The steering-topic key of a unique key's entry (also its steering store key)."""
    return UNIQUE_PREFIX + key.encode()


def encode_unique_state(entry: UniqueEntry) -> bytes:
    """Avro binary of a ``SteeringState`` holding the unique section ``entry`` (version 1)."""
    return codec.encode(
        "steering_state",
        {
            "job": None,
            "unique": {
                "unique_key": entry.unique_key,
                "job_id": entry.job_id,
                "idempotency_key": entry.idempotency_key,
                "window_until_ms": entry.window_until_ms,
                "until": entry.until,
                "state": entry.state,
                "version": entry.version,
            },
            "group": None,
        },
        version=1,
    )


def unique_state_of(rec: dict[str, Any]) -> UniqueEntry:
    return UniqueEntry(
        unique_key=rec["unique_key"],
        job_id=rec["job_id"],
        idempotency_key=rec["idempotency_key"],
        window_until_ms=rec.get("window_until_ms"),
        until=rec.get("until") or "end",
        state=rec.get("state") or "pending",
        version=rec.get("version") or ORIGINAL,
    )


def encode_entry(entry: Entry) -> bytes:
    """Avro binary of a store entry, whichever section it is."""
    if isinstance(entry, UniqueEntry):
        return encode_unique_state(entry)
    return encode_job_state(entry)


def decode_entry(data: bytes, schema: bytes | None) -> Entry:
    """The job state or unique entry a value holds; :class:`UndecodableRecord` for
    anything else (a group section is not read by this release)."""
    rec = decode_state(data, schema)
    if rec.get("job") is not None:
        return job_state_of(rec["job"])
    if rec.get("unique") is not None:
        return unique_state_of(rec["unique"])
    raise UndecodableRecord("the steering state has no job or unique section")


def topic_key(store_key: bytes) -> bytes:
    """The steering-topic key of a store key: a job's idempotency key gets
    :data:`JOB_PREFIX`; an entry's key that is a topic key already (a unique key's)
    is kept. Idempotency keys never hold control characters (every door refuses
    them), so the two cannot meet."""
    return store_key if store_key.startswith(UNIQUE_PREFIX) else job_key(store_key)


def store_key(topic_record_key: bytes) -> bytes | None:
    """The store key of a steering-topic record's key (None: an entry this release
    does not keep, e.g. a group's)."""
    job = job_of(topic_record_key)
    if job is not None:
        return job
    return topic_record_key if topic_record_key.startswith(UNIQUE_PREFIX) else None
