"""What each verdict that ends a delivery without running it records in the batch.

One table, :data:`SETTLE`, for the worker's dispatcher
(:mod:`dueflow.consumers.dispatch`) and for every other caller of
:func:`~dueflow.consumers.decision.decide` that carries its verdicts out: the
delivery's outcome (and key state) through the batch recorder, and the
steering state change its judgement says. The caller then finishes the
delivery's offset.
"""

from __future__ import annotations

from collections.abc import Callable

from dueflow.consumers.commands import CommandApplier
from dueflow.consumers.decision import Kind, Verdict
from dueflow.consumers.feeds import Delivery
from dueflow.consumers.recorder import BatchRecorder


def _skip(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """DUPLICATE, CANCELLED: the key (or the job's steering state) is final."""
    assert verdict.state is not None
    judged = verdict.judgement
    recorder.skipped(d, verdict.state, now_ms, steered=judged is not None)
    if judged is not None:
        steering.judged(d, judged, now_ms)


def _supersede(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """RESCHEDULED: another due time (or version) of the job runs."""
    recorder.superseded(d, now_ms)
    if verdict.judgement is not None:
        steering.judged(d, verdict.judgement, now_ms)


def _redirect(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """REDIRECT: a move or update waits: the timer is written again."""
    assert verdict.judgement is not None
    steering.judged(d, verdict.judgement, now_ms)


def _expire(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """EXPIRED: a first attempt past its deadline is not run."""
    recorder.expired(d, now_ms)


def _dead_letter(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """DEAD_LETTER: undecodable, out of range, unknown task."""
    assert verdict.failure is not None
    recorder.dead(d, verdict.reason, verdict.failure, now_ms, started=False)


def _skip_occurrence(
    recorder: BatchRecorder, steering: CommandApplier, d: Delivery, verdict: Verdict, now_ms: int
) -> None:
    """SKIP_OCCURRENCE: the schedule's overlap policy skips this occurrence."""
    recorder.skipped_occurrence(d, now_ms)


Settle = Callable[[BatchRecorder, CommandApplier, Delivery, Verdict, int], None]

# The verdicts that end a delivery without running it, and what each records.
SETTLE: dict[Kind, Settle] = {
    Kind.DUPLICATE: _skip,
    Kind.CANCELLED: _skip,
    Kind.RESCHEDULED: _supersede,
    Kind.REDIRECT: _redirect,
    Kind.EXPIRED: _expire,
    Kind.DEAD_LETTER: _dead_letter,
    Kind.SKIP_OCCURRENCE: _skip_occurrence,
}
