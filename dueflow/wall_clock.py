"""The wall clock, read as UTC epoch milliseconds.

The rules take ``now_ms`` as an argument and never read the clock; the
processes at the edges (clients, worker, emitter, status view, CLI) read it
here and pass it in. The worker and the emitter correct it to the broker's
clock where that matters (:mod:`dueflow.rules.clock_offset`).
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Wall-clock UTC epoch milliseconds."""
    return time.time_ns() // 1_000_000
