from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import ConfigError
from dueflow.rules.wheel import NEAR_LEVEL, Placement, WheelGeometry, WheelLevel, place_timer
from tests.support.wheel_geometries import GEO, SMALL

NOW = 1_800_000_000_000  # a round-ish epoch ms


@pytest.mark.parametrize(
    ("delta_ms", "level"),
    [
        (-86_400_000, NEAR_LEVEL),  # overdue: near, fires at once
        (0, NEAR_LEVEL),
        (2_000, NEAR_LEVEL),
        (2_001, 0),
        (62_500, 0),  # reach of level 0: (64-1)*1s - 0.5s
        (62_501, 1),
        (3_779_500, 1),
        (3_779_501, 2),
        (226_799_500, 2),
        (226_799_501, 3),
        (5_443_199_500, 3),
        (400 * 86_400_000, 3),  # beyond the top: parked at the top level
    ],
)
def test_placement_levels(delta_ms: int, level: int) -> None:
    p = place_timer(due_ms=NOW + delta_ms, now_ms=NOW, geometry=GEO, spread=7)
    assert p.level == level
    if level == NEAR_LEVEL:
        assert p.partition == 7 % GEO.near_partitions
    else:
        assert GEO.locate(p.partition) == (level, p.slot % GEO.levels[level].slots)


def test_partition_numbering_round_trips() -> None:
    seen = set()
    for p in range(GEO.total_partitions):
        level, index = GEO.locate(p)
        if level != NEAR_LEVEL:
            assert GEO.partition_of(level, index) == p
        seen.add((level, index))
    assert len(seen) == GEO.total_partitions
    with pytest.raises(ValueError, match="outside the wheel"):
        GEO.locate(GEO.total_partitions)


@pytest.mark.parametrize(
    ("geometry", "setting", "fragment"),
    [
        (WheelGeometry(near_window_ms=1_200), "wheel.near_window_ms", "level 0 width + lookahead"),
        (
            WheelGeometry(levels=(WheelLevel(64, 1_000), WheelLevel(64, 120_000))),
            "wheel.levels[1]",
            "level 0 must reach at least level 1's width + lookahead",
        ),
        (WheelGeometry(levels=(WheelLevel(2, 1_000),)), "wheel.levels[0].slots", ">= 3"),
        (
            WheelGeometry(levels=(WheelLevel(64, 1_000), WheelLevel(64, 1_500))),
            "wheel.levels[1].width_ms",
            "multiple",
        ),
        (WheelGeometry(near_partitions=0), "wheel.near_partitions", ">= 1"),
    ],
)
def test_validator_names_the_level_and_why(
    geometry: WheelGeometry, setting: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        geometry.validate()
    assert info.value.setting == setting
    assert fragment in str(info.value)


def _check_safe(geo: WheelGeometry, due: int, now: int) -> None:
    """A placement never targets an open or about-to-open slot, nor an undrained visit."""
    p = place_timer(due_ms=due, now_ms=now, geometry=geo, spread=due)
    if p.is_near:
        assert due - now <= geo.near_window_ms
        return
    lv = geo.levels[p.level]
    window = geo.window(p.level, p.slot)
    assert window.opens_ms > now, "placed into a slot that is open or about to open"
    previous_visit_end = (p.slot - lv.slots + 1) * lv.width_ms
    assert previous_visit_end <= now, "placed into the previous visit of the partition"
    if due - now <= geo.reach_ms(len(geo.levels) - 1):
        assert window.start_ms <= due < window.end_ms


def _cascade(geo: WheelGeometry, due: int, now: int) -> list[tuple[int, int]]:
    """Follow a timer from placement to firing; returns (time, level) steps."""
    steps = []
    t = now
    for _ in range(1_000):
        p = place_timer(due_ms=due, now_ms=t, geometry=geo, spread=0)
        steps.append((t, p.level))
        if p.is_near:
            return steps
        window = geo.window(p.level, p.slot)
        assert window.opens_ms > t, "re-placement must move the timer forward in time"
        t = window.opens_ms  # the emitter opens the slot and reads the timer
        assert t <= due, "a slot was opened only after the timer was due"
        if p.level == 0 and window.start_ms <= due < window.end_ms:
            steps.append((t, NEAR_LEVEL))  # level-0 timers go to the heap when opened
            assert due - t <= geo.near_window_ms
            return steps
        # otherwise (a higher level, or parked beyond the top) it is placed again at t
    raise AssertionError("cascading did not converge")


@settings(max_examples=800, deadline=None)
@given(
    now=st.integers(min_value=0, max_value=4_000_000_000_000),
    delta=st.integers(min_value=-10_000_000, max_value=500 * 86_400_000),
)
def test_property_never_placed_in_open_slot_default_geometry(now: int, delta: int) -> None:
    _check_safe(GEO, now + delta, now)
    steps = _cascade(GEO, now + delta, now)
    assert all(t <= now + max(delta, 0) for t, _ in steps)


@settings(max_examples=800, deadline=None)
@given(
    now=st.integers(min_value=0, max_value=10_000_000),
    delta=st.integers(min_value=-1_000, max_value=200_000),
)
def test_property_small_geometry(now: int, delta: int) -> None:
    _check_safe(SMALL, now + delta, now)
    _cascade(SMALL, now + delta, now)


@settings(max_examples=300, deadline=None)
@given(
    slots=st.lists(st.integers(3, 80), min_size=1, max_size=4),
    widths=st.lists(st.integers(2, 6), min_size=4, max_size=4),
    lookahead=st.integers(0, 400),
    now=st.integers(0, 10**9),
    delta_fraction=st.floats(-0.01, 5.0),
)
def test_property_any_valid_geometry_is_safe(
    slots: list[int], widths: list[int], lookahead: int, now: int, delta_fraction: float
) -> None:
    levels = []
    width = 100
    for i, n in enumerate(slots):
        levels.append(WheelLevel(n, width))
        width *= widths[i]
    geo = WheelGeometry(
        levels=tuple(levels),
        near_partitions=3,
        near_window_ms=100 + lookahead,
        lookahead_ms=lookahead,
    )
    try:
        geo.validate()
    except ConfigError:
        return
    # Far beyond the top, a timer is parked again once per top rotation: bound the
    # horizon to a few rotations so the simulation stays short.
    delta = int(delta_fraction * geo.reach_ms(len(levels) - 1))
    _check_safe(geo, now + delta, now)
    _cascade(geo, now + delta, now)


@pytest.mark.parametrize(
    ("due_ms", "spread", "expected"),
    [
        # now = 10_000 on SMALL: near window 250 ms; level reaches 850, 5_550, 23_950 ms
        (9_000, 5, Placement(1, NEAR_LEVEL, 1)),  # overdue: near partition spread % 2
        (10_000, 3, Placement(1, NEAR_LEVEL, 1)),
        (10_250, 0, Placement(0, NEAR_LEVEL, 0)),
        (10_251, 0, Placement(2 + 2, 0, 102)),  # level 0 slot 102 -> partition 2 + 102 % 10
        (10_850, 0, Placement(2 + 8, 0, 108)),
        (10_851, 0, Placement(2 + 10 + 5, 1, 13)),  # level 1 slot 13 -> 12 + 13 % 8
        (15_550, 0, Placement(2 + 10 + 3, 1, 19)),
        (15_551, 0, Placement(2 + 10 + 8 + 3, 2, 3)),  # level 2 slot 3 -> 20 + 3 % 6
        (33_950, 0, Placement(2 + 10 + 8 + 1, 2, 7)),
        (10**9, 0, Placement(2 + 10 + 8 + 1, 2, 7)),  # beyond the top: furthest safe slot
    ],
)
def test_placement_exact_partition_level_slot(
    due_ms: int, spread: int, expected: Placement
) -> None:
    assert place_timer(due_ms=due_ms, now_ms=10_000, geometry=SMALL, spread=spread) == expected


@settings(max_examples=400, deadline=None)
@given(
    now=st.integers(min_value=0, max_value=4_000_000_000_000),
    delta=st.integers(min_value=-10_000_000, max_value=500 * 86_400_000),
    spread=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_property_partition_is_in_the_topic_and_matches_level_and_slot(
    now: int, delta: int, spread: int
) -> None:
    p = place_timer(due_ms=now + delta, now_ms=now, geometry=GEO, spread=spread)
    assert 0 <= p.partition < GEO.total_partitions
    level, index = GEO.locate(p.partition)
    assert level == p.level
    if p.is_near:
        assert index == spread % GEO.near_partitions
        assert delta <= GEO.near_window_ms  # due now, soon, or overdue: fires at once
    else:
        assert index == p.slot % GEO.levels[p.level].slots
