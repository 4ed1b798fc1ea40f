"""Fan-in: the group owner's fold of a group's commands and its members' ends (pure).

A group is a set of member jobs and a callback job (``then``) that runs once
every member has ended: succeeded, dead, cancelled or expired. Its *owner* is
the worker that owns partition murmur2(group id) of the callback's queue; it
is the only writer of the group's state (``g\\x00<group id>`` in that queue's
steering topic) and decides with the functions here:

- :func:`opened`: ``group_open`` (the callback's job) -> a new state;
- :func:`sealed`: ``group_seal`` (how many members there are);
- :func:`member_ended`: a member's end (idempotent by member id: the first
  end of a member counts, a repeat changes nothing);
- :func:`expired_unsealed`: a group not sealed within the seal timeout is
  given up (its callback is answered ``dead``, not run).

Each returns a :class:`Folded`: the state after (``None``: removed), and
``complete`` when the callback is to be written now, in the transaction that
commits the command that completed the group. The state is removed in that
same transaction: an end that arrives after it (a redriven member that ends
again) finds no group and is ignored, so the callback never runs twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from dueflow.group_model import MEMBER_ENDS, GroupState, MemberEnd

# A group's members, at most: the callback's record carries every member's state.
MAX_MEMBERS = 5_000
# Members' results carried to the callback, in all; beyond it, states only
# (``results_truncated``).
RESULTS_MAX_BYTES = 256 * 1024
# A group not sealed this long after it was opened is given up.
SEAL_TIMEOUT_MS = 3_600_000

# Codes of a refused group command (the outcome's error is "<code>: <why>").
UNKNOWN_GROUP = "unknown_group"
SIZE_CHANGED = "size_changed"
TOO_LARGE = "too_large"
NOT_SEALED = "not_sealed"


@dataclass(frozen=True, slots=True)
class Folded:
    """What a group command or a member's end does."""

    state: GroupState | None  # after (None: removed)
    changed: bool
    complete: GroupState | None = None  # the group as the callback sees it: write it now
    refused: str = ""  # "<code>: <why>" when a command was not applied
    ignored: bool = False  # a member's end for no group (completed and removed, or never)


def opened(state: GroupState | None, *, group_id: str, then_job: bytes, now_ms: int) -> Folded:
    """``group_open``: the group exists from now, with its callback's job. Applied
    again (a repeat of the command), it changes nothing."""
    if state is not None:
        if state.then_job is None:
            return Folded(replace(state, then_job=then_job), True)
        return Folded(state, False)
    return Folded(GroupState(group_id=group_id, then_job=then_job, opened_ms=now_ms), True)


def sealed(state: GroupState | None, *, size: int, now_ms: int) -> Folded:
    """``group_seal``: the group has ``size`` members; complete if they all ended."""
    if state is None:
        return Folded(None, False, refused=f"{UNKNOWN_GROUP}: no open group to seal")
    if not 1 <= size <= MAX_MEMBERS:
        return Folded(state, False, refused=f"{TOO_LARGE}: {size} members (1 to {MAX_MEMBERS})")
    if state.size is not None:
        if state.size != size:
            why = f"{SIZE_CHANGED}: sealed with {state.size} members, not {size}"
            return Folded(state, False, refused=why)
        return Folded(state, False)
    return _completed(replace(state, size=size), now_ms)


def member_ended(
    state: GroupState | None,
    end: MemberEnd,
    *,
    now_ms: int,
    results_max_bytes: int = RESULTS_MAX_BYTES,
) -> Folded:
    """A member ended: counted once by its job id; the group completes when it is
    sealed and its last member ended."""
    if state is None:
        return Folded(None, False, ignored=True)
    if end.job_id in state.ended or end.state not in MEMBER_ENDS:
        return Folded(state, False)
    ended = {**state.ended, end.job_id: end.state}
    results = state.results
    truncated = state.results_truncated
    if end.result is not None:
        if state.results_bytes + len(end.result) <= results_max_bytes:
            results = {**results, end.job_id: end.result}
        else:
            truncated = True
    after = replace(state, ended=ended, results=results, results_truncated=truncated)
    return _completed(after, now_ms)


def expired_unsealed(
    state: GroupState, *, now_ms: int, seal_timeout_ms: int = SEAL_TIMEOUT_MS
) -> Folded:
    """A group whose client never sealed it (it died while adding members): given up
    ``seal_timeout_ms`` after it was opened. Its callback is not run."""
    if state.size is not None or now_ms < state.opened_ms + seal_timeout_ms:
        return Folded(state, False)
    return Folded(None, True, refused=f"{NOT_SEALED}: the group was not sealed in time")


def seal_due(state: GroupState, *, seal_timeout_ms: int = SEAL_TIMEOUT_MS) -> int | None:
    """When :func:`expired_unsealed` may give ``state`` up (None: sealed, never)."""
    return None if state.size is not None else state.opened_ms + seal_timeout_ms


def _completed(state: GroupState, now_ms: int) -> Folded:
    if state.size is None or len(state.ended) < state.size or state.then_job is None:
        return Folded(state, True)
    done = replace(state, completed_ms=now_ms)
    return Folded(None, True, complete=done)


def summary(state: GroupState) -> dict[str, Any]:
    """What the callback receives (``ctx.group``): the group id, every member's job
    id and end (and result, JSON-decoded, while they fit), in the order they ended."""
    members: list[dict[str, Any]] = []
    for job_id, how in state.ended.items():
        member: dict[str, Any] = {"job_id": job_id, "state": how}
        raw = state.results.get(job_id)
        if raw is not None:
            member["result"] = json.loads(raw)
        members.append(member)
    return {
        "group_id": state.group_id,
        "size": state.size,
        "members": members,
        "results_truncated": state.results_truncated,
    }


def summary_bytes(state: GroupState) -> bytes:
    """:func:`summary` as compact JSON (the callback's ``df-group-results`` header)."""
    return json.dumps(summary(state), separators=(",", ":")).encode()
