"""Cron overlap policies: the decision, the partition, and the worker's bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.store import MemoryKeyStore
from dueflow.records.worker_codec import F_SCHEDULE_ID
from dueflow.rules.cron_overlap import Admission, OverlapPolicy, admit_occurrence, exec_partition
from dueflow.rules.partitioning import partition_for_key


@pytest.mark.parametrize(
    ("policy", "running", "buffered", "decision"),
    [
        ("allow", 0, False, Admission.RUN),
        ("allow", 3, False, Admission.RUN),  # today's behaviour
        ("skip", 0, False, Admission.RUN),
        ("skip", 1, False, Admission.SKIP),
        ("buffer_one", 0, False, Admission.RUN),
        ("buffer_one", 1, False, Admission.BUFFER),  # waits behind the running one
        ("buffer_one", 1, True, Admission.SKIP),  # at most one waits
        ("buffer_one", 0, True, Admission.RUN),
    ],
)
def test_the_decision(policy: str, running: int, buffered: bool, decision: Admission) -> None:
    assert admit_occurrence(policy, running=running, buffered=buffered) is decision


def test_occurrences_with_a_policy_go_to_their_schedules_partition() -> None:
    assert exec_partition("nightly", OverlapPolicy.ALLOW, 12) == -1  # the key's, as before
    for policy in (OverlapPolicy.SKIP, OverlapPolicy.BUFFER_ONE):
        assert exec_partition("nightly", policy, 12) == partition_for_key(b"nightly", 12)


class _Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset


def occurrence(schedule_id: str | None, policy: str | None, offset: int) -> Delivery:
    feed = PartitionFeed("p.exec.default", 0, None, MemoryKeyStore(1))
    d = Delivery(feed, _Msg(offset), offset)
    fields: list[Any] = [None] * 17
    fields[F_SCHEDULE_ID] = schedule_id
    d.fields = tuple(fields)
    d.hmap = {} if policy is None else {hdr.OVERLAP: policy.encode()}
    return d


def test_the_guard_counts_running_occurrences_and_lets_the_waiting_one_go() -> None:
    guard = OverlapGuard()
    first, second, third = (occurrence("s", "buffer_one", i) for i in range(3))
    assert guard.admit(first) is Admission.RUN
    guard.started(first)
    assert guard.admit(second) is Admission.BUFFER
    assert guard.admit(third) is Admission.SKIP  # one waits already
    assert guard.finished(first) is second  # its turn
    assert guard.admit(second) is Admission.RUN
    guard.started(second)
    assert guard.finished(second) is None
    assert guard.running == {}
    # other jobs and other schedules are not counted
    plain = occurrence(None, None, 9)
    assert guard.admit(plain) is Admission.RUN
    guard.started(plain)
    assert guard.running == {}
    other = occurrence("t", "skip", 10)
    guard.started(occurrence("s", "skip", 11))
    assert guard.admit(other) is Admission.RUN


def test_a_waiting_occurrence_of_a_lost_partition_is_forgotten() -> None:
    guard = OverlapGuard()
    first, second = occurrence("s", "buffer_one", 0), occurrence("s", "buffer_one", 1)
    guard.started(first)
    assert guard.admit(second) is Admission.BUFFER
    second.feed.advance(FeedState.GONE)
    guard.forget_gone()
    assert guard.finished(first) is None
