"""Retry delays and retry tiers (pure).

A failed attempt is retried after a delay; the retry record goes to the
retry-tier topic chosen for that delay and waits there until it is due.

Two ways to get the delay, by what the job (or its task) says:

- No backoff policy (``policy=None``): the queue's tiers, in order. Attempt 1
  fails -> the first tier's delay, attempt 2 -> the second, ... the last tier
  repeats. No jitter: a tier topic then holds its records in due order, so a
  record never waits behind one that is due later.
- A :class:`~dueflow.model.Backoff` policy: ``exponential`` is
  ``base_ms * multiplier**(attempt-1)``, ``fixed`` is ``base_ms``, both capped
  at ``max_ms``; with ``jitter`` the delay is drawn uniformly from
  ``[0, capped]`` ("full jitter", which spreads a herd of jobs that failed
  together over the whole window). ``none`` retries at once (delay 0).

Where a retry waits (:func:`retry_route`): tier T holds the delays from T up
to the next tier, so a record waits behind another one in its tier topic at
most the gap to the next tier. The top tier holds only its own delay; a
longer one goes back through the timer wheel (``WHEEL``), which fires it into
the exec topic at its due time instead of holding every shorter retry of the
top tier's partition behind it.

The random draw ``rand`` (uniform in [0, 1)) is an argument: this module
never reads a clock or a random source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

from dueflow.errors import InvalidInput
from dueflow.model import Backoff, BackoffKind


def compute_backoff(
    *, attempt: int, policy: Backoff | None, tiers_ms: Sequence[int], rand: float
) -> int:
    """Delay in ms before retrying after failed attempt ``attempt`` (1-based)."""
    if attempt < 1:
        raise InvalidInput("attempt", attempt, "an attempt number >= 1")
    if not 0.0 <= rand < 1.0:
        raise InvalidInput("rand", rand, "a number in [0, 1)")
    if policy is None:
        if not tiers_ms:
            raise InvalidInput("tiers_ms", tiers_ms, "one or more retry tiers")
        return int(tiers_ms[min(attempt, len(tiers_ms)) - 1])
    if policy.kind is BackoffKind.NONE:
        return 0
    if policy.kind is BackoffKind.FIXED:
        capped = float(min(policy.base_ms, policy.max_ms))
    else:
        # log-space guard: base * multiplier**k overflows floats long before the cap matters
        exponent = attempt - 1
        if policy.multiplier > 1 and exponent * math.log(policy.multiplier) > 700:
            capped = float(policy.max_ms)
        else:
            capped = min(float(policy.max_ms), policy.base_ms * policy.multiplier**exponent)
    capped = max(capped, 0.0)
    if policy.jitter:
        return int(rand * capped)
    return int(capped)


def choose_tier(delay_ms: int, tiers_ms: Sequence[int]) -> int:
    """The retry tier (its delay in ms) a record with ``delay_ms`` waits in.

    The largest tier <= ``delay_ms`` (the smallest tier when the delay is
    shorter than every tier). A record in tier T is due within
    ``[T, next tier)`` of the records before it, so head-of-line waiting in
    a tier topic is bounded by the gap to the next tier; the record never
    runs before its own due time.
    """
    if not tiers_ms:
        raise InvalidInput("tiers_ms", tiers_ms, "one or more retry tiers")
    chosen = tiers_ms[0]
    for tier in tiers_ms:
        if tier <= delay_ms:
            chosen = tier
        else:
            break
    return int(chosen)


WHEEL: Final = "wheel"
"""Route of a retry longer than the top tier: a timer record in the timer topic."""


def retry_route(delay_ms: int, tiers_ms: Sequence[int]) -> int | Literal["wheel"]:
    """Where a retry with ``delay_ms`` waits: a tier (its delay in ms), or :data:`WHEEL`.

    Delays up to the top tier wait in :func:`choose_tier`'s tier; longer ones go
    through the timer wheel, so no tier holds a record due later than the next
    tier's delay after the records before it: for tier T_k below the top the
    wait behind another record is at most T_k+1 - T_k, for the top tier zero.
    """
    if not tiers_ms:
        raise InvalidInput("tiers_ms", tiers_ms, "one or more retry tiers")
    if delay_ms > tiers_ms[-1]:
        return WHEEL
    return choose_tier(delay_ms, tiers_ms)
