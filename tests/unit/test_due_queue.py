"""The emitter's queue of timers: key order, buckets taken and put back."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dueflow.rules.due_queue import DueQueue


@given(
    keys=st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 5), st.integers(0, 10_000)),
        unique_by=lambda k: (k[1], k[2]),
        max_size=200,
    ),
    seed=st.integers(0, 2**16),
)
def test_entries_come_out_in_key_order_whatever_is_put_back(
    keys: list[tuple[int, int, int]], seed: int
) -> None:
    rng = random.Random(seed)
    q = DueQueue()
    for due, p, off in keys:
        q.push(due, (p, off, object()))  # a payload that cannot be compared
    assert len(q) == len(keys)
    out: list[tuple[int, int, int]] = []
    while q:
        got = q.pop_bucket(limit=10**9)
        assert got is not None
        due, entries = got
        used = rng.randint(0, len(entries))  # a rate limit or a resume stops part-way
        out.extend((due, p, off) for p, off, _ in entries[:used])
        q.put_back(due, entries[used:])
    assert out == sorted(keys)
    assert q.first_due() is None


def test_a_bucket_is_taken_only_when_due() -> None:
    q = DueQueue()
    assert q.push(20, (1, 5)) == 1
    assert q.push(10, (2, 7)) == 2
    assert q.push(10, (1, 9)) == 3
    assert q.first_due() == 10
    assert q.pop_bucket(limit=9) is None
    assert q.pop_bucket(limit=10) == (10, [(1, 9), (2, 7)])
    assert len(q) == 1
    assert q.pop_bucket(limit=15) is None
    assert q.pop_bucket(limit=20) == (20, [(1, 5)])
    assert not q
