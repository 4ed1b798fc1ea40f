"""How long the emitter's producer waits to fill a request, given the lead (pure).

The emitter writes each job ``emitter.fire_ahead_ms`` before it is due, and
the worker starts it at its due time. With a lead of at least
:data:`LEAD_FOR_BATCHING_MS`, the emitter's producer lets a fire wait up to
:data:`BATCH_WAIT_MS` for others to share its produce request: the wait is
over long before the job is due, and fewer, fuller requests cost the broker
less CPU per job. A job due at once (one scheduled for now) can be seen that
much later. With a shorter lead (0: written when due) the wait would add to
every job's lateness, so fires go out at once.

The workers' fetches do not wait to fill up: a steering command acknowledged
within ``worker.steering_margin_ms`` of a job's due time wins only if it
reaches the worker before the job fired ahead of it starts (see the steering
guarantees in docs/workers.md).
"""

from __future__ import annotations

LEAD_FOR_BATCHING_MS = 100
BATCH_WAIT_MS = 10
# Without a lead: the producer's linger.
_PROMPT_LINGER_MS = 2


def batching(ahead_ms: int) -> bool:
    """Whether a lead of ``ahead_ms`` hides :data:`BATCH_WAIT_MS` of waiting."""
    return ahead_ms >= LEAD_FOR_BATCHING_MS


def fire_linger_ms(ahead_ms: int) -> int:
    """The emitter producer's ``linger.ms`` for a lead of ``ahead_ms``."""
    return BATCH_WAIT_MS if batching(ahead_ms) else _PROMPT_LINGER_MS
