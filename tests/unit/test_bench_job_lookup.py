"""The job-lookup prototype's pure parts: ids shaped like the SDK's, both in-memory
indexes find what was added (and only that)."""

from __future__ import annotations

import random

from benchmarks.job_lookup import DictIndex, SortedIndex, job_id, partition_of, pct


def test_ids_are_uuid7_hex_in_time_order() -> None:
    rng = random.Random(1)
    ids = [job_id(rng, 1_900_000_000_000 + i) for i in range(100)]
    assert all(len(j) == 32 and j[12] == "7" and j[16] == "8" for j in ids)
    assert [j[:12] for j in ids] == sorted(j[:12] for j in ids)
    assert len(set(ids)) == 100


def test_both_indexes_find_every_added_job_and_nothing_else() -> None:
    rng = random.Random(2)
    ids = [job_id(rng, 1_900_000_000_000) for _ in range(2_000)]
    unknown = [job_id(rng, 1_800_000_000_000) for _ in range(200)]
    by_dict, by_sorted = DictIndex(), SortedIndex()
    for offset, jid in enumerate(ids):
        p = partition_of(jid)
        by_dict.add(jid.encode(), p, offset)
        by_sorted.add(jid.encode(), p, offset)
    by_sorted.seal()
    for offset, jid in enumerate(ids):
        assert by_dict.find(jid) == (partition_of(jid), offset)
        assert by_sorted.find(jid, partition_of(jid)) == offset
    for jid in unknown:
        assert by_dict.find(jid) is None
        assert by_sorted.find(jid, partition_of(jid)) is None
    assert by_sorted.counted_bytes() / len(ids) < 40  # two 8-byte arrays a job
    assert by_dict.counted_bytes() > by_sorted.counted_bytes()


def test_percentile_picks_the_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert pct(values, 0.5) == 51.0
    assert pct(values, 0.99) == 100.0
