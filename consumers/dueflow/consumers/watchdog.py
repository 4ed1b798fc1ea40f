"""The worker's watchdog: a thread that watches the event loop and the process's memory.

It needs no event loop, so it sees what the loop cannot: a loop that does not
turn. Every ``worker.watchdog_interval_s`` it looks (:class:`WatchdogRules`,
pure; the thread around it is :class:`Watchdog`):

- **a handler blocks the loop**: an async attempt's step still runs past the
  attempt's deadline while the loop has not turned for an interval -> *take*
  it: the owner claims the attempt from the loop and records it as timed out
  (:mod:`dueflow.consumers.loop_watch` for the claim);
- **the loop is blocked with no handler step on it** for ``watchdog_stall_s``
  -> *stalled*: logged and counted;
- **still blocked** ``watchdog_restart_s`` after either -> *restart* the process;
- **resident memory** at ``max_memory`` -> *drain* (finish the jobs, restart);
  at the hard ceiling -> *ceiling* (restart at once), and *restart* from here
  when the loop has not done it ``watchdog_restart_s`` later.

Each act is told once per block (or once per process, for memory). A look
that comes long after the one before (the whole process was stopped or
starved, not only its loop) gives the loop a turn before it counts it as
blocked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from dueflow.consumers.loop_watch import LoopWatch, Step
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")


class Act(Enum):
    """What the watchdog does after a look."""

    TAKE = "take"  # claim the attempt blocking the loop, record it timed out
    STALLED = "stalled"  # the loop is blocked and no handler step runs: report it
    RESTART = "restart"  # blocked (or past the ceiling) for too long: restart the process
    DRAIN = "drain"  # memory at max_memory: finish the jobs, then restart
    CEILING = "ceiling"  # memory at the hard ceiling: restart now


@dataclass(frozen=True, slots=True)
class Limits:
    interval_s: float  # how often it looks; a loop that did not turn this long is blocked
    stall_s: float  # blocked with no handler step this long: stalled
    restart_s: float  # still blocked this long after the first act: restart
    max_memory: int | None = None  # bytes of resident memory: drain and restart
    ceiling: int | None = None  # bytes: restart at once


def _missed_after(lim: Limits) -> float:
    """A gap between two looks longer than this: the watchdog did not run either."""
    return max(2 * lim.interval_s, lim.interval_s + 1.0)


class WatchdogRules:
    """The watchdog's decisions (pure: the caller reads clock, loop and memory)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._taken: Step | None = None  # the step taken in this block
        self._stalled = False  # the stall of this block was reported
        self._acted_at: float | None = None  # the first act of this block
        self._ceiling_at: float | None = None
        self._drained = False
        self._restarting = False
        self._looked_at: float | None = None

    def judge(
        self, *, now: float, turned_at: float, step: Step | None, rss: int | None = None
    ) -> list[Act]:
        """The acts for this look: ``turned_at`` is the loop's last turn, ``step``
        the attempt whose handler code runs on the loop, ``rss`` the resident bytes."""
        lim = self.limits
        acts: list[Act] = []
        blocked_s = now - turned_at
        missed = self._looked_at is not None and now - self._looked_at > _missed_after(lim)
        self._looked_at = now
        if missed:
            # The watchdog itself did not run: the whole process was stopped (SIGSTOP,
            # a paused VM) or starved, not only its loop. Give the loop a turn first.
            blocked_s = 0.0
        if blocked_s < max(lim.interval_s, 1e-9):
            self._taken, self._stalled, self._acted_at = None, False, None  # it turns
            self._restarting = self._restarting and self._ceiling_at is not None
        elif step is not None:
            # The attempt's own timeout governs: past it, nothing on the loop can end it.
            if step is not self._taken and now >= step.deadline:
                self._taken = step
                acts.append(Act.TAKE)
                self._acted_at = self._acted_at if self._acted_at is not None else now
        elif not self._stalled and blocked_s >= lim.stall_s:
            self._stalled = True
            acts.append(Act.STALLED)
            self._acted_at = self._acted_at if self._acted_at is not None else now
        if rss is not None:
            if lim.ceiling is not None and rss >= lim.ceiling and self._ceiling_at is None:
                self._ceiling_at = now
                acts.append(Act.CEILING)
            elif (
                lim.max_memory is not None
                and rss >= lim.max_memory
                and not self._drained
                and self._ceiling_at is None
            ):
                self._drained = True
                acts.append(Act.DRAIN)
        if not self._restarting and Act.TAKE not in acts and Act.CEILING not in acts:
            # (a take's own record goes first: it is committed before any restart)
            since = [t for t in (self._acted_at, self._ceiling_at) if t is not None]
            if since and now - min(since) >= lim.restart_s:
                self._restarting = True
                acts.append(Act.RESTART)
        return acts

    @property
    def restart_reason(self) -> str:
        """Why the last :data:`Act.RESTART` was told: ``blocked_loop`` or ``memory_ceiling``."""
        return "blocked_loop" if self._acted_at is not None else "memory_ceiling"


class WatchdogOwner(Protocol):
    """What the watchdog tells (the worker); every call is on the watchdog's thread."""

    def loop_blocked(self, step: Step, blocked_s: float) -> None: ...

    def loop_stalled(self, blocked_s: float) -> None: ...

    def memory_exceeded(self, act: Act, rss: int) -> None: ...

    def restart_process(self, reason: str, blocked_s: float) -> None: ...


def process_rss() -> int | None:
    """Resident bytes of this process (Linux ``/proc/self/statm``); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            fields = fh.read().split()
        return int(fields[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Watchdog:
    """The thread: looks every ``limits.interval_s`` and tells ``owner``."""

    def __init__(
        self,
        watch: LoopWatch,
        limits: Limits,
        owner: WatchdogOwner,
        *,
        on_rss: Callable[[int], None] | None = None,
        read_rss: Callable[[], int | None] = process_rss,
        clock: Callable[[], float] = time.perf_counter,  # LoopWatch's clock
    ) -> None:
        self._watch = watch
        self._rules = WatchdogRules(limits)
        self._owner = owner
        self._on_rss = on_rss
        self._read_rss = read_rss
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="dueflow-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _main(self) -> None:
        interval = self._rules.limits.interval_s
        while not self._stop.wait(interval):
            try:
                self.look()
            except Exception as exc:  # the watchdog must outlive whatever it tells
                event(_LOG, "watchdog look failed", logging.ERROR, error=repr(exc))

    def look(self) -> list[Act]:
        """One look: judge, then tell the owner (returns the acts, for tests)."""
        watch = self._watch
        step = watch.step
        turned_at = watch.turned_at
        rss = self._read_rss()
        if rss is not None and self._on_rss is not None:
            self._on_rss(rss)
        now = self._clock()
        acts = self._rules.judge(now=now, turned_at=turned_at, step=step, rss=rss)
        blocked_s = now - turned_at
        for act in acts:
            if act is Act.TAKE:
                assert step is not None
                self._owner.loop_blocked(step, blocked_s)
            elif act is Act.STALLED:
                self._owner.loop_stalled(blocked_s)
            elif act is Act.DRAIN or act is Act.CEILING:
                assert rss is not None
                self._owner.memory_exceeded(act, rss)
            elif act is Act.RESTART:
                self._owner.restart_process(self._rules.restart_reason, blocked_s)
        return acts
