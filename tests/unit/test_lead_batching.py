"""The emitter's producer waits to fill a request only behind a long enough lead."""

from __future__ import annotations

import pytest

from dueflow.config.sections import EmitterSettings
from dueflow.rules.lead_batching import BATCH_WAIT_MS, LEAD_FOR_BATCHING_MS, fire_linger_ms


def test_the_default_lead_hides_the_wait() -> None:
    ahead = EmitterSettings().fire_ahead_ms
    assert ahead >= LEAD_FOR_BATCHING_MS
    assert fire_linger_ms(ahead) == BATCH_WAIT_MS
    assert ahead // 10 >= BATCH_WAIT_MS  # the wait stays a small part of the lead


@pytest.mark.parametrize("ahead", [0, 1, LEAD_FOR_BATCHING_MS - 1])
def test_without_a_long_enough_lead_fires_go_out_at_once(ahead: int) -> None:
    assert fire_linger_ms(ahead) == 2


def test_the_wait_starts_at_the_threshold() -> None:
    assert fire_linger_ms(LEAD_FOR_BATCHING_MS) == BATCH_WAIT_MS
