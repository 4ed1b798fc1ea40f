"""The worker's watchdog: its decisions (pure), the claim on a blocked attempt, and the
thread's dispatch, with fakes (no broker, no real blocking but where it is the point)."""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest

from dueflow.consumers.loop_watch import LoopWatch, Step
from dueflow.consumers.restart import RESTART_EXIT_CODE
from dueflow.consumers.supervisor import early_deaths_after
from dueflow.consumers.watchdog import Act, Limits, Watchdog, WatchdogRules

LIMITS = Limits(interval_s=0.5, stall_s=30.0, restart_s=10.0)
MiB = 2**20


def step(deadline: float, job: Any = "job") -> Step:
    return Step(job, "task", deadline, timeout_s=3.0)


class Looks:
    """Feeds :class:`WatchdogRules` a look every interval, as the thread does."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.rules = WatchdogRules(limits)
        self.at: float | None = None

    def until(self, now: float, **seen: Any) -> list[Act]:
        """Look every interval up to ``now`` (the loop as in ``seen`` all along);
        the acts of all those looks."""
        acts: list[Act] = []
        step_s = self.rules.limits.interval_s
        t = now if self.at is None else min(now, self.at + step_s)
        while True:
            acts += self.rules.judge(now=t, **seen)
            self.at = t
            if t >= now:
                return acts
            t = min(now, t + step_s)

    @property
    def restart_reason(self) -> str:
        return self.rules.restart_reason


def test_a_loop_that_turns_is_fine_whatever_runs_on_it() -> None:
    rules = WatchdogRules(LIMITS)
    running = step(deadline=100.0)
    for now in (99.0, 100.0, 200.0, 1000.0):
        # the loop turned 0.1 s ago: the loop's own timer ends the attempt
        assert rules.judge(now=now, turned_at=now - 0.1, step=running) == []


def test_a_step_blocking_past_its_deadline_is_taken_once_then_the_process_restarts() -> None:
    looks = Looks()
    blocking = step(deadline=103.0)  # started at 100 with a 3 s timeout
    seen = {"turned_at": 100.0, "step": blocking}
    assert looks.until(100.0, **seen) == []
    assert looks.until(102.9, **seen) == []  # its own timeout governs
    assert looks.until(103.2, **seen) == [Act.TAKE]  # the first look past the deadline
    assert looks.until(113.1, **seen) == []  # told once; 9.9 s after the take
    assert looks.until(113.3, **seen) == [Act.RESTART]
    assert looks.restart_reason == "blocked_loop"
    assert looks.until(200.0, **seen) == []  # told once


def test_a_step_past_its_deadline_is_taken_only_once_the_loop_missed_an_interval() -> None:
    rules = WatchdogRules(LIMITS)
    late = step(deadline=100.0)
    # past its deadline, but the loop turned 0.3 s ago: it can still time it out itself
    assert rules.judge(now=100.1, turned_at=99.8, step=late) == []
    assert rules.judge(now=100.4, turned_at=99.8, step=late) == [Act.TAKE]


def test_a_long_timeout_governs_a_long_block() -> None:
    looks = Looks()
    patient = step(deadline=400.0)  # a 300 s timeout
    seen = {"turned_at": 100.0, "step": patient}
    assert looks.until(399.5, **seen) == []  # long past stall_s: its own timeout governs
    assert looks.until(400.0, **seen) == [Act.TAKE]


def test_a_loop_blocked_with_no_handler_stalls_then_restarts() -> None:
    looks = Looks()
    seen = {"turned_at": 100.0, "step": None}
    assert looks.until(100.0, **seen) == []
    assert looks.until(129.5, **seen) == []
    assert looks.until(130.0, **seen) == [Act.STALLED]
    assert looks.until(139.5, **seen) == []
    assert looks.until(140.0, **seen) == [Act.RESTART]
    assert looks.restart_reason == "blocked_loop"


def test_a_process_that_was_stopped_gets_a_turn_before_its_loop_counts_as_blocked() -> None:
    """After SIGSTOP/SIGCONT the watchdog may look before the loop has ticked: its own
    gap shows that the whole process did not run, not only the loop."""
    rules = WatchdogRules(LIMITS)
    assert rules.judge(now=100.0, turned_at=100.0, step=None) == []
    # stopped for 40 s: the loop's last tick is 40 s old, but so is the last look
    assert rules.judge(now=140.0, turned_at=100.0, step=None) == []
    assert rules.judge(now=140.5, turned_at=140.1, step=None) == []  # the loop turned
    blocking = step(deadline=141.0)
    assert rules.judge(now=141.0, turned_at=140.4, step=blocking) == [Act.TAKE]


def test_a_loop_that_turns_again_forgets_the_block() -> None:
    looks = Looks()
    first = step(deadline=103.0, job="a")
    assert looks.until(100.0, turned_at=100.0, step=first) == []
    assert looks.until(104.0, turned_at=100.0, step=first) == [Act.TAKE]
    assert looks.until(105.0, turned_at=104.9, step=None) == []  # it came back
    assert looks.until(200.0, turned_at=199.9, step=None) == []  # and turned on
    second = step(deadline=203.0, job="b")
    assert looks.until(203.0, turned_at=200.0, step=second) == [Act.TAKE]
    assert looks.until(212.5, turned_at=200.0, step=second) == []
    assert looks.until(213.0, turned_at=200.0, step=second) == [Act.RESTART]


def test_steps_blocking_in_turn_are_each_taken_the_restart_counting_from_the_first() -> None:
    looks = Looks()
    first, second = step(deadline=103.0, job="a"), step(deadline=104.0, job="b")
    assert looks.until(100.0, turned_at=100.0, step=first) == []
    assert looks.until(103.5, turned_at=100.0, step=first) == [Act.TAKE]
    # the first handler returned, the next one blocks before the loop could tick
    assert looks.until(106.0, turned_at=100.0, step=second) == [Act.TAKE]
    assert looks.until(113.5, turned_at=100.0, step=second) == [Act.RESTART]


@pytest.mark.parametrize(
    ("rss", "acts"),
    [
        (299 * MiB, []),
        (300 * MiB, [Act.DRAIN]),
        (599 * MiB, [Act.DRAIN]),
        (600 * MiB, [Act.CEILING]),
        (None, []),  # not known (no /proc): nothing
    ],
)
def test_the_memory_rule(rss: int | None, acts: list[Act]) -> None:
    rules = WatchdogRules(
        Limits(interval_s=0.5, stall_s=30, restart_s=10, max_memory=300 * MiB, ceiling=600 * MiB)
    )
    assert rules.judge(now=1.0, turned_at=1.0, step=None, rss=rss) == acts


def test_memory_is_told_once_and_a_ceiling_the_loop_did_not_act_on_restarts() -> None:
    looks = Looks(
        Limits(interval_s=0.5, stall_s=30, restart_s=10, max_memory=300 * MiB, ceiling=600 * MiB)
    )
    assert looks.until(1.0, turned_at=1.0, step=None, rss=400 * MiB) == [Act.DRAIN]
    assert looks.until(2.0, turned_at=2.0, step=None, rss=500 * MiB) == []  # draining
    assert looks.until(2.5, turned_at=2.5, step=None, rss=700 * MiB) == [Act.CEILING]
    assert looks.until(12.0, turned_at=12.0, step=None, rss=700 * MiB) == []
    # the loop turns but did not end the process: the watchdog does
    assert looks.until(12.5, turned_at=12.5, step=None, rss=700 * MiB) == [Act.RESTART]
    assert looks.restart_reason == "memory_ceiling"


def test_no_memory_limit_means_no_memory_act() -> None:
    rules = WatchdogRules(LIMITS)
    assert rules.judge(now=1.0, turned_at=1.0, step=None, rss=64 * 2**30) == []


# --------------------------------------------------------------------------- the claim


def test_a_claim_succeeds_only_while_the_step_runs_and_the_loop_sees_it() -> None:
    watch = LoopWatch(now=0.0)
    running = step(deadline=1.0)
    attached: list[str] = []
    watch.begin(running)
    assert watch.claim(running, lambda: attached.append("taken"))
    assert attached == ["taken"]  # inside the claim
    assert not watch.claim(running, lambda: attached.append("again"))  # once
    assert watch.end(running) is True  # the loop learns it at the end of the step
    assert watch.step is None


def test_a_step_that_ended_cannot_be_claimed() -> None:
    watch = LoopWatch(now=0.0)
    ended = step(deadline=1.0)
    watch.begin(ended)
    assert watch.end(ended) is False
    assert not watch.claim(ended, lambda: pytest.fail("attached to an ended step"))
    other = step(deadline=1.0, job="other")
    watch.begin(other)
    assert not watch.claim(ended, lambda: pytest.fail("attached to another step"))


def test_claims_and_step_ends_race_to_exactly_one_winner() -> None:
    """Many steps end on one thread while another claims them: each is either claimed
    (and the loop sees it) or ended unclaimed (and the claim fails), never both."""
    watch = LoopWatch(now=0.0)
    steps = [step(deadline=0.0, job=i) for i in range(20_000)]
    claimed: set[int] = set()
    seen_by_loop: set[int] = set()
    current: list[Step | None] = [None]
    done = threading.Event()

    def claimer() -> None:
        while not done.is_set():
            s = current[0]
            if s is not None:
                watch.claim(s, functools.partial(claimed.add, s.job))

    thread = threading.Thread(target=claimer)
    thread.start()
    try:
        for s in steps:
            watch.begin(s)
            current[0] = s
            sum(range(200))  # the step's "work": a window for the claimer
            if watch.end(s):
                seen_by_loop.add(s.job)
    finally:
        done.set()
        thread.join()
    assert claimed == seen_by_loop
    assert 0 < len(claimed) < len(steps)  # both outcomes happened


# --------------------------------------------------------------------------- the thread


class Owner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def loop_blocked(self, step: Step, blocked_s: float) -> None:
        self.calls.append(("blocked", (step.job, blocked_s)))

    def loop_stalled(self, blocked_s: float) -> None:
        self.calls.append(("stalled", blocked_s))

    def memory_exceeded(self, act: Act, rss: int) -> None:
        self.calls.append((act.value, rss))

    def restart_process(self, reason: str, blocked_s: float) -> None:
        self.calls.append(("restart", reason))


def test_the_thread_tells_its_owner_what_it_decided() -> None:
    clock = [100.0]
    rss = [10 * MiB]
    watch = LoopWatch(now=100.0)
    owner = Owner()
    dog = Watchdog(
        watch,
        Limits(interval_s=0.5, stall_s=30, restart_s=10, max_memory=300 * MiB),
        owner,
        read_rss=lambda: rss[0],
        clock=lambda: clock[0],
        on_rss=lambda value: owner.calls.append(("rss", value)),
    )
    blocking = step(deadline=103.0, job="j")
    watch.begin(blocking)
    clock[0] = 103.5
    assert dog.look() == [Act.TAKE]
    assert owner.calls == [("rss", 10 * MiB), ("blocked", ("j", 3.5))]
    for _ in range(19):  # 9.5 s of looks, still blocked
        clock[0] += 0.5
        assert dog.look() == []
    owner.calls.clear()
    rss[0] = 301 * MiB
    clock[0] += 0.5
    assert dog.look() == [Act.DRAIN, Act.RESTART]
    assert owner.calls == [("rss", 301 * MiB), ("drain", 301 * MiB), ("restart", "blocked_loop")]


def test_the_thread_looks_every_interval_until_closed() -> None:
    looked = threading.Event()
    dog = Watchdog(
        LoopWatch(),
        Limits(interval_s=0.01, stall_s=30, restart_s=10),
        Owner(),
        read_rss=lambda: None,
    )
    real_look = dog.look

    def look() -> list[Act]:
        looked.set()
        return real_look()

    dog.look = look  # type: ignore[method-assign]
    dog.start()
    try:
        assert looked.wait(5)
    finally:
        dog.close()


# --------------------------------------------------------------------------- supervisor


@pytest.mark.parametrize(
    ("exitcode", "lived_s", "before", "after"),
    [
        (1, 2.0, 0, 1),  # an early death
        (1, 2.0, 2, 3),  # the third in a row: the supervisor gives up
        (1, 60.0, 2, 0),  # lived long: the count starts over
        (RESTART_EXIT_CODE, 2.0, 2, 2),  # asked to restart: not a death
        (RESTART_EXIT_CODE, 60.0, 2, 2),
    ],
)
def test_a_restart_asked_for_never_counts_as_a_death(
    exitcode: int, lived_s: float, before: int, after: int
) -> None:
    assert early_deaths_after(exitcode, lived_s=lived_s, before=before) == after
