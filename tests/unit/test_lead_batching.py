"""The waits to fill a request follow the emitter's lead: hidden behind it, or none."""

from __future__ import annotations

import pytest

from dueflow.config.sections import EmitterSettings
from dueflow.rules.lead_batching import (
    BATCH_WAIT_MS,
    FETCH_MIN_BYTES,
    LEAD_FOR_BATCHING_MS,
    exec_fetch_config,
    fire_linger_ms,
)


def test_the_default_lead_hides_the_waits() -> None:
    ahead = EmitterSettings().fire_ahead_ms
    assert ahead >= LEAD_FOR_BATCHING_MS
    assert fire_linger_ms(ahead) == BATCH_WAIT_MS
    assert exec_fetch_config(ahead) == {
        "fetch.wait.max.ms": BATCH_WAIT_MS,
        "fetch.min.bytes": FETCH_MIN_BYTES,
    }
    # what the waits add stays a small part of the lead
    assert ahead // 4 >= 2 * BATCH_WAIT_MS


@pytest.mark.parametrize("ahead", [0, 1, LEAD_FOR_BATCHING_MS - 1])
def test_without_a_long_enough_lead_records_go_out_and_come_back_at_once(ahead: int) -> None:
    assert fire_linger_ms(ahead) == 2
    config = exec_fetch_config(ahead)
    assert config["fetch.min.bytes"] == 1  # a fetch returns with its first record


def test_the_waits_start_at_the_threshold() -> None:
    assert fire_linger_ms(LEAD_FOR_BATCHING_MS) == BATCH_WAIT_MS
    assert exec_fetch_config(LEAD_FOR_BATCHING_MS)["fetch.min.bytes"] == FETCH_MIN_BYTES
