"""Deterministic jitter: stable values, exact range, uniform spread."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from hashlib import blake2b

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.errors import InvalidInput
from dueflow.rules.jitter import MAX_WINDOW_MS, deterministic_jitter_ms, occurrence_jitter_ms

GOLDEN = [
    ("a", 1_000, 619),
    ("nightly-report@1714557600000", 30_000, 26_105),
    ("", 59_999, 707),
    ("ünïcode", 7, 4),
    ("x", 2**40, 852_641_979_726),
]


def from_spec(seed: str, window_ms: int) -> int:
    """The documented algorithm, first draw (rejection is vanishingly rare)."""
    digest = blake2b(
        seed.encode(), digest_size=8, person=b"dueflow-jitter", salt=bytes(16)
    ).digest()
    return int.from_bytes(digest, "big") % (window_ms + 1)


@pytest.mark.parametrize(("seed", "window", "expected"), GOLDEN)
def test_golden_values_never_change(seed: str, window: int, expected: int) -> None:
    assert deterministic_jitter_ms(seed, window) == expected
    assert from_spec(seed, window) == expected


def test_stable_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from dueflow.rules.jitter import deterministic_jitter_ms as j;"
        "print(j('nightly-report@1714557600000', 30000), hash('x'))"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
        for seed in (1, 2)
    ]
    assert outputs[0][0] == outputs[1][0] == "26105"
    assert outputs[0][1] != outputs[1][1]  # hash() differs: jitter does not use it


def test_zero_window_is_no_jitter() -> None:
    assert deterministic_jitter_ms("anything", 0) == 0


def test_both_ends_of_the_window_occur() -> None:
    seen = {deterministic_jitter_ms(f"s{i}", 1) for i in range(64)}
    assert seen == {0, 1}


def test_uniform_over_seeds() -> None:
    window, n = 9, 20_000
    counts = Counter(deterministic_jitter_ms(f"schedule-{i}@0", window) for i in range(n))
    assert set(counts) == set(range(10))
    expected = n / 10
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001 (deterministic: seeds are fixed)


def test_occurrence_jitter_uses_schedule_and_instant() -> None:
    assert occurrence_jitter_ms("nightly-report", 1_714_557_600_000, 30_000) == 26_105
    hourly = {occurrence_jitter_ms("s", 3_600_000 * k, 30_000) for k in range(100)}
    schedules = {occurrence_jitter_ms(f"s{k}", 3_600_000, 30_000) for k in range(100)}
    assert len(hourly) > 90  # each occurrence and each schedule gets its own delay
    assert len(schedules) > 90


@pytest.mark.parametrize("window", [-1, True, 1.5, "10", MAX_WINDOW_MS + 1])
def test_bad_window(window: object) -> None:
    with pytest.raises(InvalidInput) as info:
        deterministic_jitter_ms("s", window)  # type: ignore[arg-type]
    assert info.value.field == "jitter_ms"


def test_bad_seed() -> None:
    with pytest.raises(InvalidInput, match="seed"):
        deterministic_jitter_ms(b"s", 10)  # type: ignore[arg-type]


@given(seed=st.text(max_size=40), window=st.integers(0, MAX_WINDOW_MS))
def test_in_range_and_repeatable(seed: str, window: int) -> None:
    value = deterministic_jitter_ms(seed, window)
    assert 0 <= value <= window
    assert deterministic_jitter_ms(seed, window) == value
