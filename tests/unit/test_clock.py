"""The clock offset to the broker: bounds from acknowledged samples (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.rules.clock_offset import ClockOffset

BROKER_START = 1_800_000_000_000


def sample(c: ClockOffset, *, skew: int, at: int, rtt: int, append_after: int) -> None:
    """A record sent at broker time ``at`` by a process whose clock reads ``skew`` ms ahead,
    appended ``append_after`` ms later and acknowledged after ``rtt`` ms."""
    c.add(sent_ms=at + skew, appended_ms=at + append_after, acked_ms=at + rtt + skew)


def test_no_samples_means_trusting_the_local_clock() -> None:
    c = ClockOffset()
    assert (c.upper, c.lower, c.samples) == (0, 0, 0)
    assert c.earliest_broker_ms(1_000) == c.latest_broker_ms(1_000) == 1_000


@pytest.mark.parametrize("skew", [2_000, -2_000, 0, 37])
def test_the_bounds_hold_the_true_offset_and_tighten_to_the_shortest_round_trip(
    skew: int,
) -> None:
    c = ClockOffset()
    for i, (rtt, append_after) in enumerate([(40, 30), (3, 1), (12, 11)]):
        sample(c, skew=skew, at=BROKER_START + 1_000 * i, rtt=rtt, append_after=append_after)
    assert c.lower <= skew <= c.upper
    # The tightest side of each: 1 ms after the send (sample 2), 1 ms before the ack (3).
    assert (c.lower, c.upper) == (skew - 1, skew + 1)
    # "Due?" uses a broker time never later than the truth; stamps one never earlier.
    local = BROKER_START + 5_000 + skew
    assert c.earliest_broker_ms(local) <= BROKER_START + 5_000 <= c.latest_broker_ms(local)


def test_a_clock_stepped_forward_is_followed_at_once() -> None:
    c = ClockOffset(bucket_ms=1_000, buckets=3)
    sample(c, skew=0, at=BROKER_START, rtt=2, append_after=1)
    sample(c, skew=2_000, at=BROKER_START + 100, rtt=2, append_after=1)  # NTP step
    assert c.lower <= 2_000 <= c.upper
    assert c.earliest_broker_ms(BROKER_START + 3_000) <= BROKER_START + 1_000


def test_old_buckets_age_out() -> None:
    c = ClockOffset(bucket_ms=1_000, buckets=2)
    sample(c, skew=0, at=BROKER_START, rtt=1, append_after=0)  # a very tight sample
    for i in range(1, 4):
        sample(c, skew=0, at=BROKER_START + 1_000 * i, rtt=20, append_after=10)
    assert (c.lower, c.upper) == (-10, 10)


def test_a_sample_whose_clock_went_back_during_it_is_ignored() -> None:
    c = ClockOffset()
    c.add(sent_ms=10_000, appended_ms=10_000, acked_ms=9_000)
    assert c.samples == 0


@given(
    skew=st.integers(-5_000, 5_000),
    samples=st.lists(
        st.tuples(st.integers(0, 500), st.integers(0, 500)).map(lambda t: (max(t), min(t))),
        min_size=1,
        max_size=30,
    ),
)
def test_due_never_reads_a_time_later_than_the_brokers(
    skew: int, samples: list[tuple[int, int]]
) -> None:
    c = ClockOffset()
    at = BROKER_START
    for rtt, append_after in samples:
        sample(c, skew=skew, at=at, rtt=rtt, append_after=append_after)
        at += 700
        assert c.earliest_broker_ms(at + skew) <= at <= c.latest_broker_ms(at + skew)
