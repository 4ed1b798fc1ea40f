"""What starts when: the ready partitions' head records, each carried to its verdict.

:class:`Dispatcher` takes the ready partitions round robin while slots are
free; for each head record it asks :func:`~dueflow.consumers.decision.decide`
once and does what the verdict's kind says (``_ACTIONS``, a table from
:class:`~dueflow.consumers.decision.Kind` to an action; one that ends the
delivery without running it records what :mod:`dueflow.consumers.verdict_ends`
says). Rate limits decide
only *when* a run starts: no token now, and the partitions pause until one
is due.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

from dueflow import reasons
from dueflow.config.sections import FIRE_AHEAD_MAX_MS
from dueflow.consumers.commands import CommandApplier, SteeringBook
from dueflow.consumers.decision import Kind, Verdict, decide
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.intake import Intake
from dueflow.consumers.lead_fence import LeadFence
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.quarantine import Quarantine
from dueflow.consumers.ratelimit import QueueRates
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.run_state import RunState
from dueflow.consumers.slots import Slots
from dueflow.consumers.verdict_ends import SETTLE
from dueflow.observability.metrics import Metrics

# What an action tells the dispatch loop.
_NEXT = 0  # the head record is taken care of: on to the next one
_RAN = 1  # the head record started: on to the next one, one less of this turn's budget
_STOP = 2  # nothing more starts from this partition now
_AGAIN = 3  # not due at the turn's clock, maybe due by now: read the clock, decide again
_TURN = 256  # records started from one partition before the others have a turn
# A record due within this is set aside rather than holding its partition (an
# emitter fires at most emitter.fire_ahead_ms ahead).
_ASIDE_MS = FIRE_AHEAD_MAX_MS

Action = Callable[["Dispatcher", PartitionFeed, Delivery, Verdict, int], int]


class Dispatcher:
    """Starts the queue's jobs from its ready partitions and carries out every verdict."""

    def __init__(
        self,
        *,
        queue: str,
        life: RunState,
        intake: Intake,
        doubt: MembershipDoubt,
        slots: Slots,
        recorder: BatchRecorder,
        running: dict[bytes, Delivery],
        overlap: OverlapGuard,
        registry: TaskRegistry,
        rates: QueueRates,
        book: SteeringBook,
        steer: CommandApplier,
        quarantine: Quarantine,
        metrics: Metrics,
        limits: WireLimits,
        due_now: Callable[[], int],
        start: Callable[[Delivery], None],
        recheck: Callable[[PartitionFeed], None],
        fence: LeadFence,
        margin_ms: int = 0,
    ) -> None:
        self._queue = queue
        self._life = life
        self._intake = intake
        self._ready = intake.ready
        self._doubt = doubt
        self._slots = slots
        self._recorder = recorder
        self._running = running
        self._overlap = overlap
        self._registry = registry
        self._rates = rates
        self._limited = rates.limited  # fixed when the queue starts
        self._book = book
        self._steer = steer
        self._quarantine = quarantine
        self._metrics = metrics
        self._limits = limits
        self._due_now = due_now
        self._start = start
        self._recheck = recheck
        self._fence = fence
        self._margin = margin_ms  # worker.steering_margin_ms
        self._loop = asyncio.get_running_loop()
        self._pump_scheduled = False

    def stalled(self) -> bool:
        """Nothing starts: not running, the queue's rate limit, paused, or in doubt."""
        intake = self._intake
        return (
            not self._life.running
            or intake.queue_held
            or intake.operator_paused
            or self._doubt.in_doubt
        )

    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self.pump)

    def pump(self) -> None:
        """Start jobs from the ready partitions, round robin, while slots are free."""
        self._pump_scheduled = False
        doubt = self._doubt
        if time.monotonic() - doubt.alive_at > doubt.stall_s:
            doubt.alive()  # the process was stopped or starved: first, doubt
        if self.stalled():
            return
        ready = self._ready
        slots = self._slots
        batch = self._recorder
        while ready:
            if slots.free <= 0:
                slots.wait(self.pump)
                return
            if batch.full():
                batch.wait_for_cut(self.pump)
                return
            feed = ready[0]
            finished = self._dispatch(feed)
            fenced = feed.fenced or feed.fence_goal is not None
            if self.stalled():  # (a queue rate limit): the feed stays first in line
                if fenced:
                    self._fence.check(feed)
                return
            if finished:
                if ready and ready[0] is feed:
                    ready.popleft()
                feed.in_ready = False
            else:
                ready.rotate(-1)
            if fenced:
                self._fence.check(feed)  # the records handled may have moved its fence

    def _dispatch(self, feed: PartitionFeed) -> bool:
        """Start what can start from ``feed``; True when it has nothing startable now."""
        backlog = feed.backlog
        slots = self._slots
        pending_final = self._recorder.pending_final
        running = self._running
        store = feed.keys
        overlap = self._overlap
        registry = self._registry
        book = self._book
        limits = self._limits
        actions = _ACTIONS
        margin = self._margin
        now_ms = self._due_now()
        budget = _TURN
        batch = self._recorder
        while backlog:
            if slots.free <= 0 or budget <= 0 or feed.gone:
                self._intake.sync_pause(feed)
                return feed.gone
            d = backlog[0]
            if d.fields is None and d.bad is None:
                prepare(d, registry, now_ms=now_ms, limits=limits)
            verdict = decide(
                d,
                store=store,
                pending=pending_final,
                running=running,
                occurrences=overlap,
                now_ms=now_ms,
                steering=book,
                margin_ms=margin,
            )
            # keyed by the kind's value: an Enum member's own hash is Python code
            step = actions[verdict.kind._value_](self, feed, d, verdict, now_ms)
            if step == _NEXT:
                continue
            if step == _RAN:
                budget -= 1
                if batch.full():  # (the pump asked before this turn)
                    budget = 0
            elif step == _STOP:
                return True
            else:  # _AGAIN: the turn's clock was read at its start
                now_ms = self._due_now()
        self._intake.sync_pause(feed)
        return True

    # ------------------------------------------------------------------ actions

    def _run(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        if self._limited and not self._take_token(feed, d):
            return _STOP
        feed.backlog.popleft()
        self._start(d)
        return _RAN

    def _not_due(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        """The head record is not due at the turn's clock. Due soon (a fire ahead of
        its time): set aside until it is, and on to the records behind it; later:
        the partition waits until it is. Unless it is due by now."""
        now = self._due_now()
        until = verdict.until_ms
        if until <= now:
            return _AGAIN
        if until - now > _ASIDE_MS:
            self._hold(feed, until, now)
            return _STOP
        feed.backlog.popleft()
        aside = feed.aside
        heapq.heappush(aside, (until, d.offset, d))
        if aside[0][2] is d:  # the first due of those set aside: the wake-up moves
            self._arm_aside(feed, until, now)
        return _NEXT

    def _fenced(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        """Due, fired ahead: waits for the partition's lead fence, and the records behind
        it (the commands acknowledged before its due time among them) go on."""
        feed.backlog.popleft()
        heapq.heappush(feed.fenced, (d.not_before - self._margin, d.offset, d))
        self._fence.want(feed)
        return _NEXT

    def fence_reached(self, feed: PartitionFeed) -> None:
        """``feed``'s lead fence moved on: the jobs it covers are decided again, first in
        the backlog in offset order; the others wait for it to move again."""
        fenced = feed.fenced
        if feed.gone or feed.revoked or not fenced:
            return
        fence_ms = feed.fence_ms
        back: list[Delivery] = []
        while fenced and fenced[0][0] <= fence_ms:
            back.append(heapq.heappop(fenced)[2])
        if fenced:
            self._fence.want(feed)
        if not back:
            return
        back.sort(key=_offset)
        feed.backlog.extendleft(reversed(back))
        if feed.rate_held or feed.checking:
            return  # dispatched when that hold ends
        self._intake.make_ready(feed)
        self.schedule_pump()

    def _recheck_keys(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now: int) -> int:
        d.rechecked = True
        self._recheck(feed)
        return _STOP

    def _wait_key(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        """A replay of a running key: decided again when that attempt ends."""
        feed.backlog.popleft()
        self._intake.held.setdefault(d.key, []).append(d)
        return _NEXT

    def _buffer(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        """An occurrence that waits for the running one (overlap policy buffer_one)."""
        feed.backlog.popleft()
        self._overlap.buffer(d)
        return _NEXT

    def _command(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        feed.backlog.popleft()
        bad = self._steer.command(d, now_ms, running=self._running)
        if bad is not None:
            self._quarantine.put(d.msg, reasons.with_detail(reasons.UNDECODABLE_COMMAND, bad))
        feed.tracker.finish(d.offset)
        return _NEXT

    def _settle(self, feed: PartitionFeed, d: Delivery, verdict: Verdict, now_ms: int) -> int:
        """A verdict that ends the delivery without running it: what it records is
        :data:`~dueflow.consumers.verdict_ends.SETTLE`'s."""
        feed.backlog.popleft()
        SETTLE[verdict.kind](self._recorder, self._steer, d, verdict, now_ms)
        feed.tracker.finish(d.offset)
        return _NEXT

    # ------------------------------------------------------------------ holds

    def _take_token(self, feed: PartitionFeed, d: Delivery) -> bool:
        """Rate limits: False (and the partitions pause) when no token is available now."""
        now = time.monotonic()
        rates = self._rates
        intake = self._intake
        task_bucket = rates.task(d.task.spec.name) if d.task is not None else None
        if task_bucket is not None:
            wait = task_bucket.try_take(now)
            if wait > 0:
                self._metrics.rate_limited.labels(self._queue).inc()
                feed.rate_held = True
                intake.sync_pause(feed)
                feed.timer = self._loop.call_later(wait, self.release, feed)
                return False
        if rates.queue is not None:
            wait = rates.queue.try_take(now)
            if wait > 0:
                if task_bucket is not None:
                    task_bucket.refund()
                self._metrics.rate_limited.labels(self._queue).inc()
                intake.queue_held = True
                intake.sync_all()
                self._loop.call_later(wait, self._queue_release)
                return False
        return True

    def _hold(self, feed: PartitionFeed, until_ms: int, now_ms: int) -> None:
        """The head record is not due: the partition waits (paused) until it is."""
        feed.held_until = until_ms
        self._intake.sync_pause(feed)
        if feed.timer is not None:
            feed.timer.cancel()
        feed.timer = self._loop.call_later((until_ms - now_ms) / 1000, self.release, feed)

    def _arm_aside(self, feed: PartitionFeed, until_ms: int, now_ms: int) -> None:
        if feed.aside_timer is not None:
            feed.aside_timer.cancel()
        feed.aside_timer = self._loop.call_later((until_ms - now_ms) / 1000, self._aside_due, feed)

    def _aside_due(self, feed: PartitionFeed) -> None:
        """Records set aside came due: back to the head of the backlog, in offset
        order, decided again there."""
        feed.aside_timer = None
        if feed.gone or feed.revoked:
            return
        aside = feed.aside
        now = self._due_now()
        back: list[Delivery] = []
        while aside and aside[0][0] <= now:
            back.append(heapq.heappop(aside)[2])
        if aside:
            self._arm_aside(feed, aside[0][0], now)
        if not back:
            return
        back.sort(key=_offset)
        feed.backlog.extendleft(reversed(back))
        if feed.rate_held or feed.checking:
            return  # dispatched when that hold ends (a later head's "not due" gives way)
        self._intake.make_ready(feed)
        self.pump()

    def release(self, feed: PartitionFeed) -> None:
        """A partition's hold (not due, rate limit) is over."""
        feed.timer = None
        feed.held_until = 0
        feed.rate_held = False
        if feed.gone:
            return
        self._intake.sync_pause(feed)
        self._intake.make_ready(feed)
        self.pump()

    def _queue_release(self) -> None:
        self._intake.queue_held = False
        self._intake.sync_all()
        self.pump()


def _offset(d: Delivery) -> int:
    return d.offset


# The action for each verdict kind (decision.py says what each means).
_ACTIONS: dict[str, Action] = {
    Kind.RUN.value: Dispatcher._run,
    Kind.HOLD.value: Dispatcher._not_due,
    Kind.FENCE.value: Dispatcher._fenced,
    Kind.RECHECK.value: Dispatcher._recheck_keys,
    Kind.WAIT.value: Dispatcher._wait_key,
    Kind.BUFFER_OCCURRENCE.value: Dispatcher._buffer,
    Kind.COMMAND.value: Dispatcher._command,
    **{kind.value: Dispatcher._settle for kind in SETTLE},
}
