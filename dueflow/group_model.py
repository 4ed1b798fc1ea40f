"""Domain values of fan-in: a group's state as its owner keeps it, and how a member
ended (plain data; the rule is :mod:`dueflow.rules.fan_in`, the wire codec
:mod:`dueflow.records.group_state`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# How a member can end: the states its group's callback sees.
MEMBER_ENDS = ("succeeded", "dead", "cancelled", "expired")


@dataclass(frozen=True, slots=True)
class MemberEnd:
    """A member of a group ended: its job id, how, and its result (JSON) or error."""

    job_id: str
    state: str  # one of MEMBER_ENDS
    result: bytes | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GroupState:
    """One group, as the owner of partition murmur2(group id) of its callback's queue
    keeps it. ``ended`` and ``results`` are never changed in place: a change is a
    new state with new mappings."""

    group_id: str
    then_job: bytes | None = None  # the callback's dueflow.Job value (group_open)
    size: int | None = None  # how many members (group_seal); None: not sealed yet
    ended: dict[str, str] = field(default_factory=dict)  # member job id -> its end
    results: dict[str, bytes] = field(default_factory=dict)  # member job id -> JSON
    results_truncated: bool = False
    opened_ms: int = 0
    completed_ms: int | None = None

    @property
    def results_bytes(self) -> int:
        return sum(len(v) for v in self.results.values())


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member as a group's callback sees it (``ctx.group.members``)."""

    job_id: str
    state: str  # one of MEMBER_ENDS
    result: Any = None  # its handler's return value (JSON), when results are carried


@dataclass(frozen=True, slots=True)
class GroupResults:
    """What a group's callback receives (``ctx.group``): every member, in the order
    they ended."""

    group_id: str
    size: int
    members: tuple[GroupMember, ...]
    results_truncated: bool = False

    def states(self) -> dict[str, str]:
        """Member job id -> how it ended."""
        return {m.job_id: m.state for m in self.members}

    def count(self, state: str) -> int:
        """How many members ended ``state``."""
        return sum(1 for m in self.members if m.state == state)

    @classmethod
    def from_json(cls, raw: bytes) -> GroupResults:
        """From the callback's ``df-group-results`` header."""
        doc = json.loads(raw)
        return cls(
            group_id=str(doc["group_id"]),
            size=int(doc.get("size") or 0),
            members=tuple(
                GroupMember(str(m["job_id"]), str(m["state"]), m.get("result"))
                for m in doc.get("members") or ()
            ),
            results_truncated=bool(doc.get("results_truncated")),
        )
