"""How long the clients on a fired job's way wait to fill a request (pure).

The emitter writes each job ``emitter.fire_ahead_ms`` before it is due, and
the worker starts it at its due time. With a lead of at least
:data:`LEAD_FOR_BATCHING_MS`, the emitter's producer lets a fire wait up to
:data:`BATCH_WAIT_MS` for others to share its produce request, and the
worker's fetch of its exec and retry topics returns once the broker has
:data:`FETCH_MIN_BYTES` for it or that long has passed: both waits are over
long before the job is due, and fewer, fuller requests cost the broker and
the worker less CPU per job. A job due at once (one scheduled for now, a retry
due now, a redrive) can wait that much longer. With a shorter lead (0: written
when due) every wait would add to every job's lateness, so records go out and
come back at once, as without a lead.
"""

from __future__ import annotations

LEAD_FOR_BATCHING_MS = 100
BATCH_WAIT_MS = 10
FETCH_MIN_BYTES = 32_768
# Without a lead: a producer's linger, and how long a fetch with nothing to
# return waits at the broker (it returns with the first record).
_PROMPT_LINGER_MS = 2
_PROMPT_FETCH_WAIT_MS = 100


def batching(ahead_ms: int) -> bool:
    """Whether a lead of ``ahead_ms`` hides :data:`BATCH_WAIT_MS` of waiting."""
    return ahead_ms >= LEAD_FOR_BATCHING_MS


def fire_linger_ms(ahead_ms: int) -> int:
    """The emitter producer's ``linger.ms`` for a lead of ``ahead_ms``."""
    return BATCH_WAIT_MS if batching(ahead_ms) else _PROMPT_LINGER_MS


def exec_fetch_config(ahead_ms: int) -> dict[str, int]:
    """The worker consumer's fetch settings for a lead of ``ahead_ms``."""
    if batching(ahead_ms):
        return {"fetch.wait.max.ms": BATCH_WAIT_MS, "fetch.min.bytes": FETCH_MIN_BYTES}
    return {"fetch.wait.max.ms": _PROMPT_FETCH_WAIT_MS, "fetch.min.bytes": 1}
