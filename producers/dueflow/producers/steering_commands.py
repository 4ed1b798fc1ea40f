"""The commands that cancel, move and update a job, and how to read their verdicts (pure).

For a queue that was finalized (``dueflow queue finalize``), the scheduling
client steers a job by writing one command record to the job's exec
partition (:mod:`dueflow.records.command`); the worker that owns it applies
it and answers with an outcome carrying the command's id. This module plans
those records and reads a verdict out of that outcome; the client writes the
records and waits (:mod:`dueflow.producers.verdicts`).

- a ``cancel`` goes to the key's partition and, for a cron occurrence, to its
  schedule's partition too (an occurrence of a schedule with an overlap
  policy may be delivered there, as :func:`~dueflow.producers.cancel.cancel_records`);
- a move to a time at or after the current due time is a lazy ``move``;
  earlier, a ``replace`` with the job's value read from its timer;
- an update of the payload is a ``patch`` (optionally with a new due time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord
from dueflow.records.command import (
    check_command,
    command_headers,
    command_key,
    encode_command,
)
from dueflow.rules.partitioning import partition_for_key
from dueflow.steering_model import Command


def command_records(
    names: TopicNames,
    cmd: Command,
    *,
    partitions: int,
    schedule_id: str | None = None,
    partition: int | None = None,
    headers: Sequence[tuple[str, bytes]] = (),
) -> list[OutgoingRecord]:
    """The record(s) of ``cmd``: on the job's exec partition (``partition`` when it is
    known, else its key's; and, for a cancel of a cron occurrence, its schedule's
    too); ``headers``: added to the command's (``df-unique`` of a job replaced, which
    the owner keeps on its new timer). :class:`~dueflow.errors.InvalidInput` names a
    field the worker would refuse."""
    check_command(cmd)
    key = cmd.idempotency_key.encode()
    where = [partition_for_key(key, partitions) if partition is None else partition]
    if cmd.op == "cancel" and schedule_id is not None:
        by_schedule = partition_for_key(schedule_id.encode(), partitions)
        if by_schedule not in where:
            where.append(by_schedule)
    value = encode_command(cmd)
    return [
        OutgoingRecord(
            names.exec(cmd.queue), command_key(key), value, [*command_headers(cmd), *headers], p
        )
        for p in where
    ]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The owner's answer to a command (an outcome with its ``command_id``)."""

    state: str  # cancelled, rescheduled, updated, refused
    code: str  # refused: dueflow.rules.steering's code ("" when applied)
    reason: str  # refused: why, for people
    due_ms: int | None
    version: str | None
    at_ms: int
    first_job_id: str | None = None  # deduplicated: the job that holds the unique key

    @property
    def applied(self) -> bool:
        return self.state != "refused"


def verdict_of(outcome: Mapping[str, Any]) -> Verdict:
    """The verdict an outcome record (decoded) holds."""
    error = str(outcome.get("error") or "")
    code, _, reason = error.partition(": ")
    state = str(outcome["state"])
    return Verdict(
        state=state,
        code=code if state == "refused" else "",
        reason=reason if state == "refused" else "",
        due_ms=outcome.get("due_ms"),
        version=outcome.get("version"),
        at_ms=int(outcome.get("at_ms") or 0),
        first_job_id=outcome.get("first_job_id"),
    )
