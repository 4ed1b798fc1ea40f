"""The visibility probe's pure part: the three spans of every record both readers saw."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.visibility_probe import SPANS, fired_ms, partitions_when_known, split
from dueflow.errors import InvalidInput


def test_split_measures_each_span_per_record() -> None:
    uncommitted = {("x", 0, 0): (105, 100), ("x", 0, 1): (130, 110), ("x", 1, 0): (50, None)}
    committed = {("x", 0, 0): (120, 100), ("x", 0, 1): (190, 110), ("x", 1, 0): (60, None)}
    out = split(uncommitted, committed)
    assert out["records"] == 2  # the record without a stamp is left out
    assert out["fired_to_appended_ms"]["max"] == 20  # 130 - 110
    assert out["fired_to_appended_ms"]["p50"] == 20
    assert out["appended_to_committed_ms"]["max"] == 60  # 190 - 130
    assert out["fired_to_committed_ms"]["max"] == 80  # 190 - 110
    assert sorted(SPANS) == sorted(k for k in out if k != "records")


def test_a_record_only_one_reader_saw_is_left_out() -> None:
    out = split({}, {("x", 0, 0): (120, 100)})
    assert out["records"] == 0
    assert out["fired_to_committed_ms"]["p99"] is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("df-fired", b"1700000000123")], 1700000000123),
        ([("df-due", b"5"), ("df-fired", b"7"), ("df-fired", b"9")], 9),  # the last wins
        ([("df-fired", b"soon")], None),
        ([("df-due", b"5")], None),
        (None, None),
    ],
)
def test_fired_ms(headers: list[tuple[str, bytes]] | None, expected: int | None) -> None:
    assert fired_ms(headers) == expected


class _Metadata:
    def __init__(self, topics: dict[str, Any]) -> None:
        self.topics = topics


class _Topic:
    def __init__(self, partitions: list[int]) -> None:
        self.partitions = dict.fromkeys(partitions)
        self.error = None


class _LateMetadata:
    """A consumer whose first answers do not name a topic created a moment before."""

    def __init__(self, missing: int) -> None:
        self.missing = missing
        self.asked = 0

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        self.asked += 1
        if self.asked <= self.missing:
            return _Metadata({})
        return _Metadata({topic: _Topic([1, 0])})


def test_the_probe_asks_for_a_new_topic_until_its_metadata_names_it() -> None:
    consumer = _LateMetadata(missing=2)
    assert partitions_when_known(consumer, "t.exec.q") == [0, 1]  # type: ignore[arg-type]
    assert consumer.asked == 3


def test_the_probe_names_a_topic_that_never_appears() -> None:
    consumer = _LateMetadata(missing=10**6)
    with pytest.raises(InvalidInput, match=r"t\.exec\.q"):
        partitions_when_known(consumer, "t.exec.q", timeout_s=0.3)  # type: ignore[arg-type]
    assert consumer.asked >= 2
