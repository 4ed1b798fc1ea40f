"""Steering a pending job at any horizon: the rule of the partition's owner (pure).

A client cancels, moves or updates a job by appending a command to the
job's exec partition (:mod:`dueflow.records.command`); the worker that owns
that partition is the only writer of the partition's steering state
(:mod:`dueflow.records.steering_state`; the values:
:mod:`dueflow.steering_model`) and decides with the functions here.
Kafka cannot take a timer back out of the wheel, so every timer of a job
carries a *version token* (``df-version``: the id of the command that made
it; none: the job as scheduled). The state names the current token and the
tokens still in the wheel (``outstanding``); any other delivery is
superseded. New timers are written by the owner, in the transaction that
commits the command's offset, never by the client.

- :func:`apply`: a command against the job's state and key -> the state
  after, the outcome (``cancelled``, ``rescheduled``, ``updated`` or
  ``refused`` with a reason), whether the key is to be marked ``cancelled``,
  a timer to write now (``replace``);
- :func:`judge`: a delivery of the job (its token, attempt) -> run as
  usual, skip it (superseded, cancelled, a duplicate), or *redirect* it:
  the current timer fired while a move or update waits, so the job's timer
  is written again with it instead of running (a move later and a payload
  update need no copy of the job before then: lazy, at any horizon);
- :func:`ended`: the job's delivery ended somehow (done, dead, cancelled,
  expired, or an attempt handed on to a retry) -> the state after;
- :func:`sweep`: tokens that can only arrive after an outage longer than
  ``grace_ms`` are forgotten.

A state exists from the first command until every timer of the job has been
delivered and the job has ended: then it is removed (``None``: a
tombstone). Its lifetime is bounded by the job's timers in the wheel, not by
time; nothing is kept for jobs never steered.

The key's view (``key``) is what the worker knows besides the state:
``None`` (no attempt ran, the key is not final), ``"running"`` (an attempt
runs in this process), ``"retrying"`` (an attempt failed and was handed on),
``"done"``, ``"dead"`` or ``"cancelled"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from dueflow.steering_model import ORIGINAL, Command, JobSteering, Outstanding, Patch
from dueflow.timeutil import format_utc

RUNNING = "running"
RETRYING = "retrying"
FINAL_KEYS = frozenset({"done", "dead", "cancelled"})

# Stable codes of a refusal (the outcome's error is "<code>: <why>").
FINISHED = "finished"
STARTED = "started"
CANCELLED = "cancelled"
CHANGED = "changed"
NEEDS_VALUE = "needs_value"
DUE_ALREADY = "due_already"
UNSUPPORTED = "unsupported"
UNKNOWN = "unknown"
INVALID = "invalid"  # a field of the command is not accepted (the worker's check)
REFUSALS = (
    FINISHED,
    STARTED,
    CANCELLED,
    CHANGED,
    NEEDS_VALUE,
    DUE_ALREADY,
    UNSUPPORTED,
    UNKNOWN,
    INVALID,
)


@dataclass(frozen=True, slots=True)
class NewTimer:
    """A timer the owner writes: the job's version ``token``, due at ``due_ms``."""

    token: str
    due_ms: int | None  # None: the due time of the delivery it is made from


@dataclass(frozen=True, slots=True)
class Applied:
    """What one command does."""

    outcome: str  # cancelled | rescheduled | updated | refused
    state: JobSteering | None  # the job's state after (None: none kept)
    changed: bool  # a state record (or a tombstone, when ``state`` is None) is written
    code: str = ""  # refused: one of REFUSALS
    reason: str = ""  # refused: why, for people
    cancel_key: bool = False  # mark the key cancelled too (idempotency record)
    timer: NewTimer | None = None  # replace: the timer to write now
    due_ms: int | None = None  # the due time the outcome reports

    @property
    def error(self) -> str:
        """The outcome's error text of a refusal: ``<code>: <reason>``."""
        return f"{self.code}: {self.reason}" if self.code else ""


class Step(Enum):
    """What a delivery of a steered job gets."""

    PASS = "pass"  # decide as for any job (it may run)
    SUPERSEDED = "superseded"  # not the current version: skipped (outcome rescheduled)
    CANCELLED = "cancelled"  # the job is cancelled: skipped
    DUPLICATE = "duplicate"  # the current version after the job ended: skipped
    REDIRECT = "redirect"  # the current timer with a move or update waiting: written again


@dataclass(frozen=True, slots=True)
class Judgement:
    """A delivery's step, and the state after it (when ``changed``)."""

    step: Step
    state: JobSteering | None
    changed: bool = False
    timer: NewTimer | None = None  # REDIRECT: the timer to write instead of running
    patch: Patch | None = None  # REDIRECT: what the new timer changes
    cancel_key: bool = False  # CANCELLED: mark the key cancelled (its retries skip)


PASS = Judgement(Step.PASS, None)
_SUPERSEDED = Judgement(Step.SUPERSEDED, None)


def refused(state: JobSteering | None, code: str, reason: str) -> Applied:
    """A command not applied: ``code`` (one of :data:`REFUSALS`) and why."""
    return Applied("refused", state, False, code=code, reason=reason)


def _refused(state: JobSteering | None, code: str, reason: str) -> Applied:
    return Applied("refused", state, False, code=code, reason=reason)


def _settle(state: JobSteering) -> JobSteering | None:
    """``None`` once the job has ended and no timer of it is left in the wheel."""
    return None if state.ended is not None and not state.outstanding else state


def _without(outstanding: tuple[Outstanding, ...], token: str) -> tuple[Outstanding, ...]:
    return tuple(o for o in outstanding if o.token != token)


def _due_text(due_ms: int | None) -> str:
    return "an unknown time" if due_ms is None else format_utc(due_ms)


def apply(
    state: JobSteering | None,
    cmd: Command,
    *,
    key: str | None,
    now_ms: int,
    grace_ms: int,
    exec_partition: int,
) -> Applied:
    """The effect of ``cmd`` (op cancel, move, patch or replace) on the job whose
    state is ``state`` (None: never steered) and whose key the worker sees as
    ``key`` (see the module doc), at ``now_ms`` (the owner's broker-time clock).

    ``grace_ms``: a job never steered whose due time is further than this in the
    past and that the key store does not know has run (its records are past the
    retention): a command about it is refused rather than kept for ever.
    """
    op = cmd.op
    command = _COMMANDS.get(op)
    if command is None:
        return _refused(state, UNSUPPORTED, f"command {op!r} is not supported by this worker")
    ended = _ended_refusal(state, key)
    if ended is not None:
        return ended
    started = key in (RUNNING, RETRYING)
    if state is None:
        if not started and cmd.known_due_ms is not None and cmd.known_due_ms < now_ms - grace_ms:
            return _refused(
                None,
                UNKNOWN,
                f"it was due at {format_utc(cmd.known_due_ms)}, longer ago than the steering "
                "grace, and this worker has no record of it: it has run (its records expired)",
            )
        base = _first_state(cmd, started=started, exec_partition=exec_partition)
    else:
        base = state
    base = replace(base, last_command_id=cmd.command_id, updated_ms=now_ms)
    return command(_Request(state, base, cmd, key, started))


@dataclass(frozen=True, slots=True)
class _Request:
    """One command about to be applied: the job's ``state`` before (None: never
    steered), ``base`` (the state the command changes, stamped with it), and the key."""

    state: JobSteering | None
    base: JobSteering
    cmd: Command
    key: str | None
    started: bool  # an attempt runs, or failed and its retry is due


def _ended_refusal(state: JobSteering | None, key: str | None) -> Applied | None:
    """The refusal of any command about a job that has ended or is cancelled; None else."""
    if state is not None and state.ended is not None:
        if state.ended == "cancelled":
            return _refused(state, CANCELLED, "the job is cancelled")
        return _refused(state, FINISHED, f"the job has ended ({state.ended})")
    if key in FINAL_KEYS:
        what = "is cancelled" if key == "cancelled" else f"has ended ({key})"
        return _refused(state, CANCELLED if key == "cancelled" else FINISHED, f"the job {what}")
    if state is not None and state.cancelled:
        return _refused(state, CANCELLED, "the job is cancelled (its running attempt ends it)")
    return None


def _first_state(cmd: Command, *, started: bool, exec_partition: int) -> JobSteering:
    """The state of a job never steered, as its first command finds it."""
    return JobSteering(
        job_id=cmd.job_id,
        idempotency_key=cmd.idempotency_key,
        current=ORIGINAL,
        current_due_ms=cmd.known_due_ms,
        # a job that has started was delivered: no timer of it is left
        outstanding=() if started else (Outstanding(ORIGINAL, cmd.known_due_ms),),
        exec_partition=exec_partition,
    )


def _cancel(req: _Request) -> Applied:
    base = req.base
    cancelled = replace(
        base,
        cancelled=True,
        patch=None,
        # a running attempt finishes: its end ends the job
        ended=None if req.started else "cancelled",
    )
    return Applied(
        "cancelled",
        _settle(cancelled),
        True,
        cancel_key=True,
        due_ms=base.current_due_ms,
    )


def _unchangeable(req: _Request) -> Applied | None:
    """The refusal of a move, update or replace of a job that has started, or whose
    version is not the one the command expects; None when it can be changed."""
    if req.started:
        why = "it is running" if req.key == RUNNING else "an attempt failed and its retry is due"
        return _refused(
            req.state, STARTED, f"{why}: only a job that has not started can be moved or updated"
        )
    expect = req.cmd.expect_version
    if expect is not None and expect != req.base.version:
        return _refused(
            req.state,
            CHANGED,
            f"its version is {req.base.version or 'the original'!r}, not "
            f"{expect or 'the original'!r} (changed meanwhile)",
        )
    return None


def _replace(req: _Request) -> Applied:
    refusal = _unchangeable(req)
    if refusal is not None:
        return refusal
    base, cmd = req.base, req.cmd
    token = cmd.command_id
    new = replace(
        base,
        current=token,
        current_due_ms=cmd.due_ms,
        outstanding=(*base.outstanding, Outstanding(token, cmd.due_ms)),
        patch=None,
    )
    return Applied("rescheduled", new, True, timer=NewTimer(token, cmd.due_ms), due_ms=cmd.due_ms)


def _not_later(req: _Request) -> Applied | None:
    """The refusal of a move or update to a due time before the job's (or, for a
    move, the same); None when the new due time is accepted."""
    base, target = req.base, req.cmd.due_ms
    due_now = base.patch.due_ms if base.patch and base.patch.due_ms is not None else None
    effective = due_now if due_now is not None else base.current_due_ms
    if target is None or effective is None:
        return None
    if target < effective:
        return _refused(
            req.state,
            NEEDS_VALUE,
            f"{format_utc(target)} is before its due time {format_utc(effective)}: "
            "moving a job earlier needs its value (replace)",
        )
    if req.cmd.op == "move" and target == effective:
        return _refused(req.state, DUE_ALREADY, f"it is due then already ({format_utc(target)})")
    return None


def _move(req: _Request) -> Applied:
    refusal = _unchangeable(req) or _not_later(req)
    if refusal is not None:
        return refusal
    prev, cmd = req.base.patch, req.cmd
    patch = Patch(
        token=cmd.command_id,
        due_ms=cmd.due_ms,
        payload=prev.payload if prev else None,
        content_type=prev.content_type if prev else None,
        command_id=cmd.command_id,
    )
    return _patched(req.base, patch, "rescheduled")


def _patch(req: _Request) -> Applied:
    refusal = _unchangeable(req) or _not_later(req)
    if refusal is not None:
        return refusal
    prev, cmd = req.base.patch, req.cmd
    target = cmd.due_ms
    patch = Patch(
        token=cmd.command_id,
        due_ms=target if target is not None else (prev.due_ms if prev else None),
        payload=cmd.payload,
        content_type=cmd.content_type
        if cmd.content_type is not None
        else (prev.content_type if prev else None),
        command_id=cmd.command_id,
    )
    return _patched(req.base, patch, "updated")


def _patched(base: JobSteering, patch: Patch, outcome: str) -> Applied:
    """A move or update waiting in the state (applied when the current timer fires)."""
    new_due = patch.due_ms if patch.due_ms is not None else base.current_due_ms
    return Applied(outcome, replace(base, patch=patch), True, due_ms=new_due)


# What each command op does (any other is refused as unsupported).
_COMMANDS: dict[str, Callable[[_Request], Applied]] = {
    "cancel": _cancel,
    "move": _move,
    "patch": _patch,
    "replace": _replace,
}


def judge(
    state: JobSteering | None,
    *,
    token: str,
    attempt: int,
    due_ms: int | None = None,
    redriven: bool = False,
) -> Judgement:
    """The step of a delivery with version ``token`` (``""``: the job as scheduled) and
    ``attempt`` of a job whose state is ``state``; ``due_ms``: the delivered job's due
    time (for a redirect when the state does not know it); ``redriven``: an operator
    redrove it from the dead-letter topic (it runs unless the job is cancelled).

    :attr:`Step.PASS` changes nothing: the delivery is decided as any other, and
    :func:`ended` records it when its attempt ends.
    """
    if state is None:
        # A timer the owner wrote, whose state is gone: the job ended and every
        # other timer of it was delivered (or swept). Retries (attempt > 1) go on:
        # they are the attempts of the version that ran; so does a redrive.
        return _SUPERSEDED if token and attempt == 1 and not redriven else PASS
    if redriven:
        if state.cancelled:
            return Judgement(Step.CANCELLED, state, cancel_key=True)
        return PASS
    if token != state.current:
        after = _settle(replace(state, outstanding=_without(state.outstanding, token)))
        step = Step.CANCELLED if state.cancelled else Step.SUPERSEDED
        return Judgement(step, after, changed=after != state)
    if state.cancelled:
        ended = state.ended or "cancelled"
        after = _settle(replace(state, outstanding=_without(state.outstanding, token), ended=ended))
        return Judgement(Step.CANCELLED, after, changed=after != state, cancel_key=True)
    if state.ended is not None:
        after = _settle(replace(state, outstanding=_without(state.outstanding, token)))
        return Judgement(Step.DUPLICATE, after, changed=after != state)
    patch = state.patch
    if attempt == 1 and patch is not None:
        due = patch.due_ms
        if due is None:
            due = state.current_due_ms if state.current_due_ms is not None else due_ms
        after = replace(
            state,
            current=patch.token,
            current_due_ms=due,
            outstanding=(*_without(state.outstanding, token), Outstanding(patch.token, due)),
            patch=None,
        )
        return Judgement(
            Step.REDIRECT, after, changed=True, timer=NewTimer(patch.token, due), patch=patch
        )
    return PASS


def ended(state: JobSteering, *, token: str, how: str | None) -> tuple[JobSteering | None, bool]:
    """The state after a delivery of ``token`` ended ``how`` (``done``, ``dead``,
    ``cancelled``, ``expired``; ``None``: its attempt was handed on to a retry) and
    whether it changed. The current version ending ends the job."""
    outstanding = _without(state.outstanding, token)
    end = state.ended
    if how is not None and token == state.current and end is None:
        end = how
    after = _settle(replace(state, outstanding=outstanding, ended=end))
    return after, after != state


def sweep(state: JobSteering, *, now_ms: int, grace_ms: int) -> tuple[JobSteering | None, bool]:
    """Forget what can only arrive after an outage longer than ``grace_ms``: tokens
    other than the current one due that long ago; for a cancelled job also the
    current one, and an attempt that was running when it was cancelled. The
    current version of a job that is to run is never forgotten."""
    limit = now_ms - grace_ms
    done_with_current = state.cancelled or state.ended is not None
    keep = tuple(
        o
        for o in state.outstanding
        if not (
            (o.token != state.current or done_with_current)
            and (o.due_ms if o.due_ms is not None else state.updated_ms) < limit
        )
    )
    end = state.ended
    if state.cancelled and end is None and state.updated_ms < limit:
        end = "cancelled"
    after = _settle(replace(state, outstanding=keep, ended=end))
    return after, after != state


def sweep_due(state: JobSteering, *, grace_ms: int) -> int | None:
    """The earliest time :func:`sweep` may change ``state`` (None: never by itself)."""
    done_with_current = state.cancelled or state.ended is not None
    times = [
        (o.due_ms if o.due_ms is not None else state.updated_ms) + grace_ms + 1
        for o in state.outstanding
        if o.token != state.current or done_with_current
    ]
    if state.cancelled and state.ended is None:
        times.append(state.updated_ms + grace_ms + 1)
    return min(times) if times else None


def describe(state: JobSteering) -> str:
    """One line for logs and tests."""
    parts = [f"current={state.current or 'original'} due {_due_text(state.current_due_ms)}"]
    if state.patch is not None:
        parts.append(f"patch={state.patch.token} due {_due_text(state.patch.due_ms)}")
    if state.cancelled:
        parts.append("cancelled")
    if state.ended:
        parts.append(f"ended={state.ended}")
    parts.append(f"outstanding={[o.token or 'original' for o in state.outstanding]}")
    return ", ".join(parts)
