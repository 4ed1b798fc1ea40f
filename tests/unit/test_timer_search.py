"""Where in the wheel a pending timer can be: every partition it is ever placed in."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.rules.timer_search import timer_partitions
from dueflow.rules.wheel import WheelGeometry, WheelLevel, place_timer

GEOMETRIES = [
    WheelGeometry(),
    WheelGeometry(
        levels=(WheelLevel(8, 100), WheelLevel(8, 500), WheelLevel(6, 2_000)),
        near_partitions=2,
        near_window_ms=300,
        lookahead_ms=100,
    ),
]


@given(
    st.sampled_from(GEOMETRIES),
    st.integers(1_800_000_000_000, 1_900_000_000_000),
    st.integers(-10_000, 200 * 86_400_000),
    st.integers(0, 200 * 86_400_000),
    st.binary(min_size=1, max_size=20),
)
@settings(max_examples=500)
def test_every_placement_from_writing_to_now_is_a_candidate(
    geometry: WheelGeometry, written: int, ahead: int, later: int, key: bytes
) -> None:
    """Written at ``written`` for ``due``, placed again (cascaded) at any time up to its
    due: wherever it is then, the search looks there, at every ``now`` between."""
    due = written + ahead
    now = min(written + later, max(due, written))
    spread = zlib.crc32(key)
    candidates = timer_partitions(due_ms=due, now_ms=now, key=key, geometry=geometry)
    for placed_at in {written, now, (written + now) // 2}:
        if placed_at > now:
            continue
        where = place_timer(due_ms=due, now_ms=placed_at, geometry=geometry, spread=spread)
        if where.level == len(geometry.levels) - 1 and due - placed_at > geometry.reach_ms(
            where.level
        ):
            # parked beyond the top level's reach: found if it is still that far
            if due - now > geometry.reach_ms(where.level):
                assert where.partition in candidates
            continue
        assert where.partition in candidates
    assert len(candidates) == len(set(candidates))


def test_the_search_goes_top_down_with_the_clients_partition_first() -> None:
    g = GEOMETRIES[1]
    got = timer_partitions(due_ms=5_000, now_ms=0, key=b"k", geometry=g, hint=5)
    assert got[0] == 5
    assert [g.locate(p)[0] for p in got[1:]] == [2, 1, 0, -1]  # top level first, near last
    assert got[-1] == zlib.crc32(b"k") % g.near_partitions
    parked = timer_partitions(due_ms=50_000, now_ms=0, key=b"k", geometry=g)
    assert {p for p in parked if g.locate(p)[0] == 2} == {g.partition_of(2, s) for s in range(6)}
