"""A group's state in the steering topic, and a member's end on its way to the owner (pure).

The owner of a group keeps it under key ``g\\x00<group id>`` in
``<prefix>.steering.<queue>`` of the callback's queue, the ``group`` section of
``dueflow.SteeringState`` (:mod:`dueflow.records.steering_state`).

A member's end reaches the owner as a ``member_ended`` command
(:mod:`dueflow.records.command`) that the member's worker writes, in the
transaction of the member's end, as a *timer*: due one level-0 slot past the
near window, so the slot it lands in is not read by the emitter before that
transaction is over, and fired by the emitter (without a transaction) into the
owner's exec partition (``df-partition``). Its ``df-kind`` is ``job`` (what the
emitter fires); ``df-notice: member-ended`` tells the owner it is a command.
"""

from __future__ import annotations

from typing import Any

from dueflow import headers as hdr
from dueflow.errors import UndecodableRecord
from dueflow.group_model import GroupState
from dueflow.records import codec
from dueflow.records.command import MARK, encode_command
from dueflow.records.command import SCHEMA as COMMAND_SCHEMA
from dueflow.records.steering_state import GROUP_PREFIX
from dueflow.records.steering_state import SCHEMA as STATE_SCHEMA
from dueflow.records.timer_record import TimerPlacer, TimerRecord, retry_timer
from dueflow.steering_model import Command

NOTICE_MEMBER_ENDED = b"member-ended"


def group_key(group_id: str) -> bytes:
    """The steering-topic key of a group's state."""
    return GROUP_PREFIX + group_id.encode()


def group_of(state_key: bytes) -> str | None:
    """The group id a steering-topic key is about; None for other entries."""
    if not state_key.startswith(GROUP_PREFIX):
        return None
    return state_key[len(GROUP_PREFIX) :].decode("utf-8", "replace")


def encode_group_state(state: GroupState) -> bytes:
    """Avro binary of a ``SteeringState`` holding ``state`` (version 1)."""
    return codec.encode(
        "steering_state",
        {
            "job": None,
            "unique": None,
            "group": {
                "group_id": state.group_id,
                "size": state.size,
                "then_job": state.then_job,
                "ended": dict(state.ended),
                "results": dict(state.results),
                "results_truncated": state.results_truncated,
                "opened_ms": state.opened_ms,
                "completed_ms": state.completed_ms,
            },
        },
        version=1,
    )


def decode_group_state(data: bytes, schema: bytes | None) -> GroupState:
    """The group section of a state value; :class:`UndecodableRecord` when it has none."""
    version = codec.parse_schema_header(schema, expected="steering_state")
    rec = codec.decode("steering_state", data, writer_version=version)
    group: dict[str, Any] | None = rec.get("group")
    if group is None:
        raise UndecodableRecord("the steering state has no group section")
    return GroupState(
        group_id=group["group_id"],
        then_job=group.get("then_job"),
        size=group.get("size"),
        ended=dict(group.get("ended") or {}),
        results=dict(group.get("results") or {}),
        results_truncated=bool(group.get("results_truncated")),
        opened_ms=int(group.get("opened_ms") or 0),
        completed_ms=group.get("completed_ms"),
    )


STATE_HEADERS = [(hdr.SCHEMA, STATE_SCHEMA)]


def member_address(group_id: str, queue: str, partition: int) -> bytes:
    """``df-group`` of a member: ``<group id>@<queue>:<partition>`` of its owner."""
    return f"{group_id}@{queue}:{partition}".encode()


def parse_member_address(raw: bytes) -> tuple[str, str, int]:
    """``(group id, queue, partition)`` of a ``df-group`` value;
    :class:`UndecodableRecord` when it is none."""
    text = raw.decode("utf-8", "replace")
    group_id, at, rest = text.rpartition("@")
    queue, colon, part = rest.rpartition(":")
    if not at or not colon or not group_id or not queue or not part.isdigit():
        raise UndecodableRecord(f"df-group {text[:120]!r} is not <group id>@<queue>:<partition>")
    return group_id, queue, int(part)


def notice_due_ms(now_ms: int, placer: TimerPlacer) -> int:
    """When a member's end notice is due: past the near window by one level-0 slot,
    so it lands in a slot partition the emitter opens only after the transaction
    that writes it is over (its last stable offset never holds up a slot being read)."""
    width = placer.levels[0][1] if placer.levels else 1_000
    return now_ms + placer.near_window_ms + width


def notice_timer(
    cmd: Command,
    *,
    owner_partition: int,
    now_ms: int,
    placer: TimerPlacer,
) -> TimerRecord:
    """The timer that carries ``cmd`` (a ``member_ended``) to the group's owner."""
    key = cmd.idempotency_key.encode() + MARK
    headers: list[tuple[str, bytes | None]] = [
        (hdr.SCHEMA, COMMAND_SCHEMA),
        (hdr.JOB_ID, cmd.job_id.encode()),
        (hdr.NOTICE, NOTICE_MEMBER_ENDED),
    ]
    return retry_timer(
        key=key,
        value=encode_command(cmd),
        headers=headers,
        queue=cmd.queue,
        exec_partition=owner_partition,
        due_ms=notice_due_ms(now_ms, placer),
        now_ms=now_ms,
        placer=placer,
    )
