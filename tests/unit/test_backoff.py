"""Retry delays and tier choice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.errors import InvalidInput
from dueflow.model import Backoff, BackoffKind
from dueflow.rules.backoff import WHEEL, choose_tier, compute_backoff, retry_route

TIERS = (1_000, 10_000, 60_000)
EXP = Backoff(BackoffKind.EXPONENTIAL, base_ms=1_000, max_ms=30_000, multiplier=2.0, jitter=False)


@pytest.mark.parametrize(
    ("attempt", "policy", "rand", "expected"),
    [
        # no policy: the queue's tiers in order, the last one repeats, no jitter
        (1, None, 0.99, 1_000),
        (2, None, 0.0, 10_000),
        (3, None, 0.5, 60_000),
        (9, None, 0.5, 60_000),
        # exponential without jitter: base * 2**(n-1), capped
        (1, EXP, 0.3, 1_000),
        (2, EXP, 0.3, 2_000),
        (5, EXP, 0.3, 16_000),
        (6, EXP, 0.3, 30_000),
        (500, EXP, 0.3, 30_000),
        # full jitter: uniform in [0, capped]
        (3, Backoff(base_ms=1_000, max_ms=30_000, jitter=True), 0.5, 2_000),
        (3, Backoff(base_ms=1_000, max_ms=30_000, jitter=True), 0.0, 0),
        (10_000, Backoff(base_ms=1_000, max_ms=30_000, jitter=True), 0.5, 15_000),
        # fixed and none
        (7, Backoff(BackoffKind.FIXED, base_ms=5_000, jitter=False), 0.9, 5_000),
        (7, Backoff(BackoffKind.FIXED, base_ms=5_000, jitter=True), 0.5, 2_500),
        (7, Backoff(BackoffKind.FIXED, base_ms=5_000, max_ms=1_000, jitter=False), 0.5, 1_000),
        (3, Backoff(BackoffKind.NONE), 0.5, 0),
    ],
)
def test_compute_backoff_table(
    attempt: int, policy: Backoff | None, rand: float, expected: int
) -> None:
    assert compute_backoff(attempt=attempt, policy=policy, tiers_ms=TIERS, rand=rand) == expected


@given(
    attempt=st.integers(1, 10_000),
    base=st.integers(0, 10**7),
    cap=st.integers(0, 10**8),
    mult=st.floats(1.0, 10.0),
    rand=st.floats(0.0, 1.0, exclude_max=True),
    jitter=st.booleans(),
)
def test_exponential_delay_stays_in_zero_to_cap(
    attempt: int, base: int, cap: int, mult: float, rand: float, jitter: bool
) -> None:
    policy = Backoff(base_ms=base, max_ms=cap, multiplier=mult, jitter=jitter)
    delay = compute_backoff(attempt=attempt, policy=policy, tiers_ms=TIERS, rand=rand)
    assert 0 <= delay <= cap


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(InvalidInput, match="attempt"):
        compute_backoff(attempt=0, policy=None, tiers_ms=TIERS, rand=0.1)
    with pytest.raises(InvalidInput, match="rand"):
        compute_backoff(attempt=1, policy=None, tiers_ms=TIERS, rand=1.0)
    with pytest.raises(InvalidInput, match="tiers_ms"):
        choose_tier(5, ())


@pytest.mark.parametrize(
    ("delay", "tier"),
    [
        (0, 1_000),
        (999, 1_000),
        (1_000, 1_000),
        (9_999, 1_000),
        (10_000, 10_000),
        (59_999, 10_000),
        (60_000, 60_000),
        (10**9, 60_000),
    ],
)
def test_choose_tier_is_the_largest_tier_not_above_the_delay(delay: int, tier: int) -> None:
    assert choose_tier(delay, TIERS) == tier


@given(st.integers(0, 10**9))
def test_a_chosen_tier_bounds_head_of_line_waiting(delay: int) -> None:
    tier = choose_tier(delay, TIERS)
    i = TIERS.index(tier)
    nxt = TIERS[i + 1] if i + 1 < len(TIERS) else None
    # Either the delay is below every tier, or it lies in [tier, next tier).
    assert delay < TIERS[0] or (tier <= delay and (nxt is None or delay < nxt))


# ------------------------------------------------------------------ routing


@pytest.mark.parametrize(
    ("delay", "route"),
    [
        (0, 1_000),
        (999, 1_000),
        (1_000, 1_000),
        (9_999, 1_000),
        (10_000, 10_000),
        (59_999, 10_000),
        (60_000, 60_000),  # the top tier holds its own delay (the no-policy retries) ...
        (60_001, WHEEL),  # ... and anything longer goes back through the timer wheel
        (3_600_000, WHEEL),
        (2**62, WHEEL),
    ],
)
def test_retry_route_is_a_tier_up_to_the_top_and_the_wheel_beyond(
    delay: int, route: int | str
) -> None:
    assert retry_route(delay, TIERS) == route


def test_retry_route_of_one_tier_and_no_tier() -> None:
    assert retry_route(500, (500,)) == 500
    assert retry_route(501, (500,)) == WHEEL
    with pytest.raises(InvalidInput):
        retry_route(5, ())


@given(
    tiers=st.lists(st.integers(1, 10**7), min_size=1, max_size=6, unique=True).map(sorted),
    delay=st.integers(0, 10**9),
)
def test_property_a_tier_holds_only_delays_up_to_the_next_tier(
    tiers: list[int], delay: int
) -> None:
    # A retry waits behind an earlier one of its tier at most the spread of the
    # delays the tier holds: [tier, next tier) below the top (from 0 for the first
    # tier), the top tier's own delay at the top; anything longer is the wheel's.
    route = retry_route(delay, tiers)
    if route == WHEEL:
        assert delay > tiers[-1]
        return
    assert isinstance(route, int)
    k = tiers.index(route)
    low = 0 if k == 0 else route
    if k + 1 < len(tiers):
        assert low <= delay < tiers[k + 1]
    else:
        assert low <= delay <= route
