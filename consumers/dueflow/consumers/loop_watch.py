"""What the watchdog thread sees of the event loop, and the claim on a blocked attempt.

The loop writes, the watchdog thread reads:

- ``turned_at``: the time (``time.perf_counter()``, the clock of every time
  here) of the loop's last tick (every ``TICK_S``); a loop that does not tick
  does not turn.
- ``step``: the async attempt whose handler code runs on the loop right now
  (set around each step of it: the eager first step and every resumption), or
  ``None`` between steps.

An attempt whose step still runs past the attempt's deadline blocks the loop,
so the loop cannot time it out: the watchdog **claims** it
(:meth:`LoopWatch.claim`) and records it as timed out itself. The claim and
the end of a step are atomic with respect to each other (one lock): either the
watchdog claimed the attempt while its step ran, and the loop sees the claim
when the step ends and reports the attempt as timed out, whatever the handler
returned (the watchdog's record stands; the late result is discarded), or the
step ended first, the claim fails and the loop reports the attempt as usual.
So an attempt is recorded once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

TICK_S = 0.1  # how often the loop marks that it turns


class Step:
    """One async attempt as the watchdog sees it (the same object for all its steps)."""

    __slots__ = ("claimed", "deadline", "job", "task", "timeout_s")

    def __init__(self, job: Any, task: str, deadline: float, timeout_s: float) -> None:
        self.job = job
        self.task = task
        self.deadline = deadline  # time.perf_counter() when the attempt times out
        self.timeout_s = timeout_s
        self.claimed = False


class LoopWatch:
    """Shared by the event loop (which writes) and the watchdog thread (which reads)."""

    def __init__(self, now: float | None = None) -> None:
        self.turned_at = time.perf_counter() if now is None else now
        self.step: Step | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the loop

    def turn(self) -> None:
        """The loop's tick: it turns."""
        self.turned_at = time.perf_counter()

    def begin(self, step: Step) -> None:
        """``step``'s handler code is about to run on the loop."""
        self.step = step

    def end(self, step: Step) -> bool:
        """``step``'s handler code returned control to the loop; True when the
        watchdog claimed the attempt meanwhile (report it as timed out)."""
        with self._lock:
            self.step = None
            return step.claimed

    # ------------------------------------------------------------------ the watchdog

    def claim(self, step: Step, attach: Callable[[], None]) -> bool:
        """Take ``step``'s attempt from the loop if its handler code still runs;
        ``attach()`` runs inside the claim (the owner marks the attempt taken
        there, so the loop sees the mark as soon as it sees the claim)."""
        with self._lock:
            if self.step is not step or step.claimed:
                return False
            step.claimed = True
            attach()
            return True
