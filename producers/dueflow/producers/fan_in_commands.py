"""The commands that make a group of jobs with a callback (fan-in), planned (pure).

``Scheduler.group(members, then=...)`` writes three kinds of command to the
partition murmur2(group id) of the callback's exec topic, in this order (the
worker that owns it applies them in offset order, see
:mod:`dueflow.consumers.fan_in_owner`):

1. ``group_open``: the callback's job (a ``dueflow.Job`` value);
2. ``group_add``: the members' job values, in chunks of at most
   :data:`CHUNK_BYTES`; the worker writes each chunk's timers in the
   transaction that applies it, so a member exists once its chunk is committed;
3. ``group_seal``: how many members there are.

A client that dies before the seal leaves a group that is never complete: the
members it added run, the callback does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dueflow.errors import InvalidInput
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord
from dueflow.records.command import (
    check_command,
    command_headers,
    command_key,
    encode_command,
)
from dueflow.records.timer_record import JOB_SCHEMA
from dueflow.rules.fan_in import MAX_MEMBERS
from dueflow.rules.partitioning import partition_for_key
from dueflow.steering_model import Command

# The members' job values one group_add carries, at most (bytes).
CHUNK_BYTES = 512 * 1024


@dataclass(frozen=True, slots=True)
class GroupScheduled:
    """A group was written: its id, its members' job ids, and its callback's."""

    group_id: str
    member_ids: tuple[str, ...]
    then_job_id: str
    queue: str  # the callback's queue (where the group's owner is)
    partition: int  # the owner's partition of that queue's exec topic


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """The records of a group, in the order they must be written."""

    open: OutgoingRecord
    adds: tuple[OutgoingRecord, ...]
    seal: OutgoingRecord
    result: GroupScheduled


def plan_group(
    names: TopicNames,
    *,
    group_id: str,
    members: Sequence[tuple[str, bytes]],
    then: tuple[str, str, bytes],
    partitions: int,
    now_ms: int,
    new_id: Callable[[int], str],
    chunk_bytes: int = CHUNK_BYTES,
) -> GroupPlan:
    """The commands of a group: ``members`` are ``(job id, dueflow.Job value)`` (the
    values of their timer records), ``then`` is ``(job id, queue, value)`` of the
    callback. Raises :class:`InvalidInput` naming what is not accepted."""
    if not members:
        raise InvalidInput("members", "[]", "at least one job")
    if len(members) > MAX_MEMBERS:
        raise InvalidInput("members", f"{len(members)} jobs", f"at most {MAX_MEMBERS}")
    ids = [job_id for job_id, _ in members]
    seen: set[str] = set()
    for job_id in ids:
        if job_id in seen:
            raise InvalidInput("members", job_id, "jobs with distinct job ids")
        seen.add(job_id)
    then_id, queue, then_value = then
    if then_id in seen:
        raise InvalidInput("then", then_id, "a job that is not a member")
    key = group_id.encode()
    partition = partition_for_key(key, partitions)

    def record(op: str, group: dict[str, object]) -> OutgoingRecord:
        cmd = Command(
            command_id=new_id(now_ms),
            op=op,
            job_id=then_id,
            idempotency_key=group_id,
            queue=queue,
            at_ms=now_ms,
            job_schema=JOB_SCHEMA.decode(),
            group={"group_id": group_id, "size": None, "members": [], "then": None, **group},
        )
        check_command(cmd)
        value = encode_command(cmd)
        return OutgoingRecord(
            names.exec(queue), command_key(key), value, command_headers(cmd), partition
        )

    chunks: list[list[bytes]] = [[]]
    size = 0
    for _job, value in members:
        if chunks[-1] and size + len(value) > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(value)
        size += len(value)
    return GroupPlan(
        open=record("group_open", {"then": then_value}),
        adds=tuple(record("group_add", {"members": chunk}) for chunk in chunks),
        seal=record("group_seal", {"size": len(members)}),
        result=GroupScheduled(
            group_id=group_id,
            member_ids=tuple(ids),
            then_job_id=then_id,
            queue=queue,
            partition=partition,
        ),
    )
