from __future__ import annotations

import re
import uuid

from hypothesis import given
from hypothesis import strategies as st

from dueflow.ids import uuid7_hex, uuid7_time_ms
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
