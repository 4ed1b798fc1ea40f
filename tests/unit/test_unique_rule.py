"""The unique key owner's admit rule (dueflow.rules.unique): tables."""

from __future__ import annotations

import pytest

from dueflow.rules import unique as rule
from dueflow.rules.unique import ADMIT, DUPLICATE, ENDED, PENDING, REPLACE, STARTED, UniqueSpec
from dueflow.steering_model import UniqueEntry

NOW = 1_000_000


def held(*, window: int | None = None, until: str = "end", state: str = "pending") -> UniqueEntry:
    return UniqueEntry("k", "first", "first-key", window, until, state)


def admit(entry: UniqueEntry | None, first: str | None = PENDING, **spec: object) -> rule.Admission:
    return rule.admit(
        entry,
        spec=UniqueSpec("k", **spec),  # type: ignore[arg-type]
        job_id="second",
        idempotency_key="second-key",
        first=first,
        now_ms=NOW,
        token="cmd-2",
    )


def test_a_free_key_admits_and_holds_from_now() -> None:
    got = admit(None)
    assert (got.verdict, got.changed, got.first_job_id) == (ADMIT, True, None)
    assert got.entry == UniqueEntry("k", "second", "second-key", None, "end", "pending", "")
    windowed = admit(None, window_ms=5_000, until="end")
    assert windowed.entry is not None
    assert windowed.entry.window_until_ms == NOW + 5_000


@pytest.mark.parametrize(
    ("entry", "first", "holds"),
    [
        (held(), PENDING, True),
        (held(), STARTED, True),
        (held(), ENDED, False),
        (held(until="start"), PENDING, True),
        (held(until="start"), STARTED, False),
        (held(until="start"), ENDED, False),
        # a window holds until it has passed, whatever the job does
        (held(window=NOW + 1), ENDED, True),
        (held(window=NOW + 1, state="ended"), ENDED, True),
        (held(window=NOW), PENDING, False),
        (None, PENDING, False),
    ],
)
def test_how_long_a_key_is_held(entry: UniqueEntry | None, first: str | None, holds: bool) -> None:
    assert rule.holds(entry, first=first, now_ms=NOW) is holds


@pytest.mark.parametrize("on_duplicate", ["return", "refuse"])
def test_a_held_key_answers_with_its_holder_and_writes_nothing(on_duplicate: str) -> None:
    got = admit(held(), on_duplicate=on_duplicate)
    assert (got.verdict, got.changed, got.first_job_id) == (DUPLICATE, False, "first")
    assert got.entry == held()


def test_replace_takes_over_a_pending_holder_and_a_started_one_lets_a_new_job_in() -> None:
    got = admit(held(), on_duplicate="replace")
    assert (got.verdict, got.first_job_id) == (REPLACE, "first")
    assert got.entry == UniqueEntry("k", "first", "first-key", None, "end", "pending", "cmd-2")
    started = admit(held(), STARTED, on_duplicate="replace")
    assert started.verdict == ADMIT
    assert started.entry is not None
    assert started.entry.job_id == "second"


def test_extend_starts_a_replaced_window_again() -> None:
    entry = held(window=NOW + 10)
    kept = admit(entry, on_duplicate="replace", window_ms=500)
    assert kept.entry is not None
    assert kept.entry.window_until_ms == NOW + 10
    extended = admit(entry, on_duplicate="replace", window_ms=500, extend=True)
    assert extended.entry is not None
    assert extended.entry.window_until_ms == NOW + 500


def test_the_same_job_asked_again_is_its_own_duplicate() -> None:
    entry = UniqueEntry("k", "second", "second-key", None)
    got = admit(entry, ENDED, on_duplicate="replace")
    assert (got.verdict, got.first_job_id, got.changed) == (DUPLICATE, "second", False)


def test_the_end_releases_the_key_or_keeps_a_window_to_its_end() -> None:
    assert rule.released(held(), job_id="first") == (None, True)
    assert rule.released(held(until="start"), job_id="first") == (None, True)
    assert rule.released(held(), job_id="other") == (held(), False)  # taken over since
    after, changed = rule.released(held(window=NOW + 5), job_id="first")
    assert changed
    assert after == held(window=NOW + 5, state="ended")
    assert rule.released(held(window=NOW + 5, state="ended"), job_id="first")[1] is False


def test_the_sweep_removes_a_window_that_has_passed_and_nothing_else() -> None:
    assert rule.sweep(held(window=NOW), now_ms=NOW) == (None, True)
    assert rule.sweep(held(window=NOW + 1), now_ms=NOW) == (held(window=NOW + 1), False)
    assert rule.sweep(held(), now_ms=NOW) == (held(), False)
    assert rule.sweep_due(held(window=NOW + 1)) == NOW + 1
    assert rule.sweep_due(held()) is None
