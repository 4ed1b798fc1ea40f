"""Lag, DLQ depth, pending timers and the active emitter from a snapshot (pure)."""

from __future__ import annotations

from dueflow.config import QueueSpec, Settings
from dueflow.kafka.cluster_view import (
    ClusterSnapshot,
    GroupMember,
    RecordCount,
    Watermarks,
    compute_view,
    level_label,
    partition_lag,
    pending_timers,
    ranges_to_count,
)
from dueflow.rules.partitioning import murmur2, partition_for_key
from dueflow.rules.wheel import NEAR_LEVEL, WheelGeometry, WheelLevel

GEO = WheelGeometry(
    levels=(WheelLevel(8, 1000), WheelLevel(4, 4000)),
    near_partitions=2,
    near_window_ms=1500,
    lookahead_ms=100,
)


def test_partition_lag() -> None:
    assert partition_lag(None, Watermarks(3, 10)) == 7  # nothing committed: all retained
    assert partition_lag(8, Watermarks(3, 10)) == 2
    assert partition_lag(1, Watermarks(3, 10)) == 7  # committed below low: records deleted
    assert partition_lag(12, Watermarks(3, 10)) == 0


def test_counted_records_replace_the_offset_distance_of_exactly_that_range() -> None:
    marks = Watermarks(3, 10)
    assert partition_lag(8, marks, RecordCount(8, 10, 1)) == 1  # the marker is not a record
    assert partition_lag(8, marks, RecordCount(7, 10, 1)) == 2  # another range: distance
    assert partition_lag(8, marks, RecordCount(8, 9, 0)) == 2  # counted before a write
    assert partition_lag(None, marks, RecordCount(3, 10, 4)) == 4


def test_ranges_to_count() -> None:
    s = Settings(
        topic_prefix="p",
        queues=(QueueSpec("billing", partitions=2, retry_tiers_ms=(1000,)),),
        wheel=GEO,
    )
    marks = {
        ("p.dlq.billing", 0): Watermarks(5, 5000),  # every DLQ range, however long
        ("p.dlq.billing", 1): Watermarks(7, 7),  # empty: nothing to count
        ("p.exec.billing", 0): Watermarks(0, 1000),  # busy: offsets are close enough
        ("p.exec.billing", 1): Watermarks(0, 12),
        ("p.retry.billing.1s", 0): Watermarks(0, 4),
        ("p.timers", 0): Watermarks(0, 3),
        ("p.timers", 1): Watermarks(0, 3),
        ("p.timers", 2): Watermarks(0, 3),
    }
    committed = {
        "p.worker.billing": {("p.exec.billing", 0): 1, ("p.exec.billing", 1): 11},
        "p.emitter.offsets": {("p.timers", 0): 3, ("p.timers", 2): 1},  # in transactions
        "p.emitter": {("p.timers", 2): 3},  # the lease group: without them (the higher counts)
    }
    assert ranges_to_count(s, marks, committed, up_to=100) == {
        ("p.dlq.billing", 0): 5,
        ("p.exec.billing", 1): 11,
        ("p.retry.billing.1s", 0): 0,  # nothing committed: from the low watermark
        ("p.timers", 1): 0,
    }


def test_pending_timers_per_level() -> None:
    GEO.validate()
    marks = {("t", p): Watermarks(0, 5) for p in range(GEO.total_partitions)}
    committed = {("t", 0): 5, ("t", 2): 3, ("t", 10): 5}
    pending = pending_timers("t", GEO, committed, marks)
    # near: p0 done, p1 5; level 0 (p2..p9): 2 + 7*5; level 1 (p10..p13): 0 + 3*5
    assert pending == {"near": 5, "0": 37, "1": 15}
    assert level_label(NEAR_LEVEL) == "near"
    assert level_label(1) == "1"


def test_compute_view() -> None:
    s = Settings(
        topic_prefix="p",
        queues=(QueueSpec("billing", partitions=2, retry_tiers_ms=(1000,)),),
        wheel=GEO,
    )
    marks = {
        ("p.exec.billing", 0): Watermarks(0, 10),
        ("p.exec.billing", 1): Watermarks(0, 4),
        ("p.retry.billing.1s", 0): Watermarks(0, 2),
        ("p.retry.billing.1s", 1): Watermarks(0, 0),
        ("p.dlq.billing", 0): Watermarks(1, 4),
        ("p.dlq.billing", 1): Watermarks(0, 2),
        ("p.timers", 1): Watermarks(0, 3),
    }
    committed = {"p.worker.billing": {("p.exec.billing", 0): 9, ("p.exec.billing", 1): 4}}
    leader = GroupMember("m1", "emitter-a", "/127.0.0.1", (("p.emitter.lease", 0),))
    standby = GroupMember("m2", "emitter-b", "/127.0.0.1", ())
    view = compute_view(
        ClusterSnapshot(
            taken_ms=5,
            watermarks=marks,
            committed=committed,
            emitter_members=(standby, leader),
            emitter_group_state="stable",
        ),
        s,
    )
    assert view.lag_by_queue == {"billing": 1 + 0 + 2 + 0}
    assert [(r.topic, r.partition, r.lag) for r in view.lag] == [
        ("p.exec.billing", 0, 1),
        ("p.exec.billing", 1, 0),
        ("p.retry.billing.1s", 0, 2),
        ("p.retry.billing.1s", 1, 0),
    ]
    assert view.dlq_depth == {"billing": 5}
    assert view.timers_pending["near"] == 3
    assert view.active_emitter == leader
    assert view.emitter_members == 2
    doc = view.to_json()
    assert doc["active_emitter"]["partitions"] == ["p.emitter.lease:0"]
    assert doc["lag"][0]["group"] == "p.worker.billing"

    counted = {
        ("p.dlq.billing", 0): RecordCount(1, 4, 2),
        ("p.exec.billing", 0): RecordCount(9, 10, 0),
        ("p.timers", 1): RecordCount(0, 3, 1),
    }
    exact = compute_view(
        ClusterSnapshot(taken_ms=5, watermarks=marks, committed=committed, counted=counted), s
    )
    assert exact.dlq_depth == {"billing": 2 + 2}
    assert exact.lag_by_queue == {"billing": 0 + 0 + 2 + 0}
    assert exact.timers_pending["near"] == 1

    nobody = compute_view(ClusterSnapshot(taken_ms=5, watermarks={}, committed={}), s)
    assert nobody.active_emitter is None
    assert nobody.to_json()["active_emitter"] is None


def test_murmur2_matches_kafka() -> None:
    # Kafka's UtilsTest vectors; the integration suite checks librdkafka agrees.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert partition_for_key(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7
