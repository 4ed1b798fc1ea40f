"""What a worker does with one delivered exec or retry record (pure).

:func:`decide` is the worker's exactly-once rule for the record at the head
of its partition, in this order (the first that applies wins):

0. a command to the partition's owner (:mod:`dueflow.records.command`) ->
   :attr:`Kind.COMMAND`: applied before any record behind it is judged;
1. not due yet (``df-due``, a retry's "not before") -> :attr:`Kind.HOLD`
   until then: a record never runs early (a record that failed its checks,
   :mod:`dueflow.records.job_checks`, is due at once: it never holds its
   partition, and no check can hold it for longer than a real record could);
1b. fired ahead of its due time and the partition's lead fence
   (:mod:`dueflow.consumers.lead_fence`) not at its due time less the margin
   (``worker.steering_margin_ms``) -> :attr:`Kind.FENCE`: the commands
   appended before then are handled first;
2. its key is final or handed on (the key store, or what this process
   finished and has not committed yet, which is newer) and
   :func:`~dueflow.consumers.store.skips` this attempt ->
   :attr:`Kind.CANCELLED` for a cancelled key, else :attr:`Kind.DUPLICATE`
   (done, dead, or an attempt already handed on to a retry); but a redriven
   record (``df-redriven-at``) not rechecked yet -> :attr:`Kind.RECHECK`
   first: the redrive cleared ``dead`` in the transaction that wrote it, so
   the store must read that far before the record is judged;
2b. the job is steered (:func:`dueflow.rules.steering.judge`: its state, the
   delivery's version token): an older version -> :attr:`Kind.RESCHEDULED`,
   cancelled -> :attr:`Kind.CANCELLED`, the current version after the job
   ended -> :attr:`Kind.DUPLICATE`, the current timer while a move or update
   waits -> :attr:`Kind.REDIRECT` (written again instead of run); the verdict
   carries the judgement, whose state change the caller records;
3. a reschedule of the key (:mod:`dueflow.records.reschedule`) to another due time
   -> :attr:`Kind.RESCHEDULED`, for a delivery without a version token only (one
   with a token is a timer the owner wrote, judged by step 2b: a job rescheduled
   by a client of the release before and then moved by a command runs at the
   command's time);
4. an attempt of the same key runs in this process (a replay) ->
   :attr:`Kind.WAIT` until it ends, then decided again;
5. undecodable value or payload, a header or field out of range, unknown
   task -> :attr:`Kind.DEAD_LETTER`;
6. a first attempt past its deadline (``df-expires``,
   :mod:`dueflow.rules.deadline`) -> :attr:`Kind.EXPIRED`;
7. a cron occurrence of a schedule with an overlap policy while another of
   its occurrences runs (:mod:`dueflow.rules.cron_overlap`) ->
   :attr:`Kind.SKIP_OCCURRENCE` or :attr:`Kind.BUFFER_OCCURRENCE`;
8. otherwise :attr:`Kind.RUN`.

Nothing here reads the clock (``now_ms`` is an argument), writes, or changes
its arguments; the caller (:mod:`dueflow.consumers.dispatch`) does what
the verdict says: holds the partition, records the outcome, buffers the
occurrence.
Rate limits are not part of it: a token bucket is consumed by asking, on
the monotonic clock, and only decides *when* a :attr:`Kind.RUN` starts.

Verdicts without data are shared instances (this runs for every record).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from dueflow import headers as hdr
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery
from dueflow.consumers.store import CANCELLED, DEAD, DONE, KeyStore, skips
from dueflow.records.reschedule import superseded
from dueflow.records.worker_codec import F_DUE_MS
from dueflow.rules.cron_overlap import Admission
from dueflow.rules.deadline import expired
from dueflow.rules.steering import Judgement, Step


class Kind(Enum):
    """What to do with a delivery."""

    RUN = "run"  # start an attempt (once a slot and the rate limits allow)
    HOLD = "hold"  # not due: the partition waits until ``until_ms``
    RECHECK = "recheck"  # redriven: bring the key store up to date, then decide again
    DUPLICATE = "duplicate"  # key done, dead, or this attempt already handed on
    CANCELLED = "cancelled"  # key cancelled
    RESCHEDULED = "rescheduled"  # a reschedule says another due time runs
    WAIT = "wait"  # the key runs here now: decide again when it ends
    EXPIRED = "expired"  # a first attempt past its deadline
    DEAD_LETTER = "dead_letter"  # undecodable or unknown task
    SKIP_OCCURRENCE = "skip_occurrence"  # overlap policy: not run (key final, cancelled)
    BUFFER_OCCURRENCE = "buffer_occurrence"  # overlap policy buffer_one: waits its turn
    COMMAND = "command"  # a command to this partition's owner: apply it
    REDIRECT = "redirect"  # a steered job's timer with a move or update waiting: write it again
    FENCE = "fence"  # fired ahead: waits until what was appended before its due time is handled


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision and the data its caller needs to carry it out."""

    kind: Kind
    until_ms: int = 0  # HOLD: the record's "not before" (epoch ms)
    state: int | None = None  # DUPLICATE, CANCELLED: the key's stored state
    run_only_due_ms: int | None = None  # RESCHEDULED: the due time that may run
    reason: str = ""  # DEAD_LETTER: the dead-letter reason
    failure: Failure | None = None  # DEAD_LETTER: what is recorded
    judgement: Judgement | None = None  # set by the steering step (2b)


RUN = Verdict(Kind.RUN)
FENCE = Verdict(Kind.FENCE)
COMMAND = Verdict(Kind.COMMAND)
RECHECK = Verdict(Kind.RECHECK)
WAIT = Verdict(Kind.WAIT)
EXPIRED = Verdict(Kind.EXPIRED)
SKIP_OCCURRENCE = Verdict(Kind.SKIP_OCCURRENCE)
BUFFER_OCCURRENCE = Verdict(Kind.BUFFER_OCCURRENCE)
_FINAL = {
    DONE: Verdict(Kind.DUPLICATE, state=DONE),
    DEAD: Verdict(Kind.DUPLICATE, state=DEAD),
    CANCELLED: Verdict(Kind.CANCELLED, state=CANCELLED),
}


class Steering(Protocol):
    """What :func:`decide` asks of the steered jobs (a
    :class:`~dueflow.consumers.commands.SteeringBook`)."""

    def judge(self, d: Delivery) -> Judgement | None:
        """The steering step of ``d``; None when it is no steered job's. Changes nothing."""
        ...


_STEPS = {
    Step.SUPERSEDED: Kind.RESCHEDULED,
    Step.CANCELLED: Kind.CANCELLED,
    Step.DUPLICATE: Kind.DUPLICATE,
    Step.REDIRECT: Kind.REDIRECT,
}


class Occurrences(Protocol):
    """What :func:`decide` asks of the running cron occurrences (an
    :class:`~dueflow.consumers.overlap.OverlapGuard`)."""

    def admission(self, d: Delivery) -> Admission:
        """Whether occurrence ``d`` may start now; changes nothing."""
        ...


def decide(
    d: Delivery,
    *,
    store: KeyStore,
    pending: Mapping[bytes, int],
    running: Container[bytes],
    occurrences: Occurrences,
    now_ms: int,
    steering: Steering | None = None,
    margin_ms: int = 0,
) -> Verdict:
    """The verdict for delivery ``d`` (decoded: :func:`~dueflow.consumers.feeds.prepare`)
    at ``now_ms`` (epoch ms, the broker's clock as near as it is known).

    ``store``: the key states of ``d``'s partition; ``pending``: key states this
    process finished and has not committed yet; ``running``: keys with an attempt
    executing in this process; ``occurrences``: the running and waiting cron
    occurrences of schedules with an overlap policy; ``steering``: the steered
    jobs of the partition; ``margin_ms``: a job fired ahead waits for the
    partition's lead fence to reach its due time less this.
    """
    if d.command:
        return COMMAND
    if d.not_before > now_ms:
        return Verdict(Kind.HOLD, until_ms=d.not_before)
    if d.ahead and d.feed.fence_ms < d.not_before - margin_ms:
        return FENCE
    key = d.key
    hmap = d.hmap
    if key:
        state = pending.get(key)
        if state is None:
            state = store.get(key)
        if state is not None and skips(state, d.attempt):
            if not d.rechecked and hdr.REDRIVEN_AT in hmap:
                return RECHECK
            return _FINAL.get(state) or Verdict(Kind.DUPLICATE, state=state)
        if steering is not None:
            judged = steering.judge(d)
            if judged is not None and judged.step is not Step.PASS:
                kind = _STEPS[judged.step]
                held = CANCELLED if kind is Kind.CANCELLED else DONE
                return Verdict(kind, state=held, judgement=judged)
        # A timer with a version token was written by the owner and judged above; a
        # reschedule record (of clients before steering) governs the timers without one.
        run_only = None if hdr.VERSION in hmap else store.run_only_due(key)
        # (most keys have no reschedule: the test first keeps the call off the hot path)
        if (
            run_only is not None
            and d.fields is not None
            and superseded(run_only, d.fields[F_DUE_MS])
        ):
            return Verdict(Kind.RESCHEDULED, run_only_due_ms=run_only)
        if key in running:
            return WAIT
    if d.bad is not None:
        reason, failure = d.bad
        return Verdict(Kind.DEAD_LETTER, reason=reason, failure=failure)
    # (most jobs have no deadline: the test first keeps the call off the hot path)
    if d.expires is not None and expired(d.expires, attempt=d.attempt, now_ms=now_ms):
        return EXPIRED
    if hdr.OVERLAP in hmap:
        admission = occurrences.admission(d)
        if admission is Admission.SKIP:
            return SKIP_OCCURRENCE
        if admission is Admission.BUFFER:
            return BUFFER_OCCURRENCE
    return RUN
