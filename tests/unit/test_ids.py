from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from dueflow.ids import TAIL_BYTES, uuid7_head, uuid7_hex, uuid7_tails, uuid7_time_ms
from dueflow.producers.core import JobIds


@given(now=st.integers(0, 2**48 - 1), rand=st.text("0123456789abcdef", min_size=18, max_size=18))
def test_property_is_a_uuid7_carrying_its_time(now: int, rand: str) -> None:
    text = uuid7_hex(now_ms=now, random_hex=rand)
    assert re.fullmatch(r"[0-9a-f]{32}", text)
    u = uuid.UUID(text)
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    assert uuid7_time_ms(text) == now


def test_ids_sort_by_time_and_differ() -> None:
    ids = JobIds()
    made = [ids.new(1_800_000_000_000 + i // 10) for i in range(10_000)]
    assert len(set(made)) == len(made)
    assert [m[:12] for m in made] == sorted(m[:12] for m in made)


def test_random_source_is_injected() -> None:
    ids = JobIds(random_bytes=lambda n: bytes(n), batch=4)
    assert ids.new(0) == "00000000000070008000000000000000"
    assert uuid7_time_ms("not-a-uuid") is None


def test_threads_never_share_random_digits() -> None:
    import threading

    ids = JobIds(batch=7)
    made: list[str] = []

    def draw() -> None:
        made.extend(ids.new(0) for _ in range(2_000))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == len(made) == 8_000


@given(now=st.integers(0, 2**48 - 1), random=st.binary(min_size=0, max_size=5 * TAIL_BYTES + 3))
def test_property_bulk_ids_are_the_ids_of_their_random_digits(now: int, random: bytes) -> None:
    tails = uuid7_tails(random)
    assert len(tails) == len(random) // TAIL_BYTES
    for i, tail in enumerate(tails):
        digits = random[i * TAIL_BYTES : (i + 1) * TAIL_BYTES].hex()
        expected = uuid7_hex(now_ms=now, random_hex=digits[:3] + digits[4:19])
        assert uuid7_head(now) + tail == expected
        assert uuid.UUID(expected).version == 7


def counting_random() -> Callable[[int], bytes]:
    """A random source whose bytes count up (so every id differs)."""
    drawn = [0]

    def draw(n: int) -> bytes:
        out = bytes((drawn[0] + i) % 251 for i in range(n))
        drawn[0] += n
        return out

    return draw


def test_bulk_tails_continue_where_new_stopped() -> None:
    first = JobIds(counting_random(), batch=5)
    expected = [first.new(7) for _ in range(12)]
    bulk = JobIds(counting_random(), batch=5)
    drawn = [bulk.new(7), bulk.new(7)]
    tails = bulk.tails()  # the rest of the first batch, the next one last
    assert len(tails) == 3
    drawn += [uuid7_head(7) + tails.pop() for _ in range(3)]
    drawn += [bulk.new(7) for _ in range(2)]
    more = bulk.tails()  # the rest of the second batch
    drawn += [uuid7_head(7) + more.pop() for _ in range(3)]
    drawn += [uuid7_head(7) + t for t in reversed(bulk.tails())]  # a new batch
    assert drawn[:12] == expected
    assert len(set(drawn)) == len(drawn) == 15
