"""A stopping emitter copies into the offsets group what the lease group accepted,
even when its own last commit is refused (the lease group rebalancing as it stops):
an earlier release that takes over after a rollback reads that group only."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from dueflow.streams.emitter.acked_session import AckedSession


class _Counter:
    def labels(self, *_: str) -> _Counter:
        return self

    def inc(self) -> None:
        pass

    def observe(self, _: float) -> None:
        pass


class _Metrics:
    emitter_offset_commits = _Counter()
    emitter_commit = _Counter()


class _Outbox:
    records = 0

    def cut(self, _: Any) -> None:
        pass

    def seal(self) -> int:
        return 1

    def flush(self, _: float) -> bool:
        return True

    def acked(self, _: int) -> bool:
        return True


class _Sealing:
    def __init__(self, offsets: list[TopicPartition]) -> None:
        self.offsets = offsets


class _Drainer:
    def __init__(self, fired_to: list[TopicPartition]) -> None:
        self._fired_to = fired_to
        self.confirmed: list[TopicPartition] = []

    def take_fired(self) -> list[Any]:
        return []

    def seal(self) -> _Sealing:
        return _Sealing(self._fired_to)

    def confirm(self, offsets: list[TopicPartition]) -> None:
        self.confirmed.extend(offsets)


class _NoOffsets:
    def commit_offsets(self) -> list[TopicPartition]:
        return []


class _Lease:
    def __init__(self, accepts: bool) -> None:
        self.accepts = accepts
        self.sent: list[list[TopicPartition]] = []

    def commit_now(self, offsets: list[TopicPartition]) -> bool:
        self.sent.append(offsets)
        return self.accepts


class _Source:
    def __init__(self) -> None:
        self.copies: list[dict[int, int]] = []

    def mirror(self, offsets: list[TopicPartition], *, wait: bool = False) -> bool:
        assert wait, "a stopping emitter waits for its copy"
        self.copies.append({tp.partition: tp.offset for tp in offsets})
        return True


def _session(*, accepts: bool, accepted_before: dict[int, int]) -> tuple[Any, _Lease, _Source]:
    """A session stopping with ``accepted_before`` accepted and not copied yet (copies
    go at most once a second), having fired up to offset 100 of partitions 0 and 1."""
    s: Any = object.__new__(AckedSession)
    lease, source = _Lease(accepts), _Source()
    s._lease = lease
    s.source = source
    s.outbox = _Outbox()
    s._drainer = _Drainer([TopicPartition("t.timers", p, 100) for p in (0, 1)])
    s.cron = _NoOffsets()
    s.registry_quarantine = _NoOffsets()
    s._metrics = _Metrics()
    s._unconfirmed = {}
    s._to_mirror = {
        ("t.timers", p): TopicPartition("t.timers", p, o) for p, o in accepted_before.items()
    }
    s._to_mirror_at = 0.0
    s._mirrored_at = 0.0
    s._stall_s = 10.0
    return s, lease, source


def test_the_last_commit_accepted_is_copied() -> None:
    s, lease, source = _session(accepts=True, accepted_before={0: 64, 1: 66})
    s._commit_all()
    assert lease.sent
    assert {tp.partition: tp.offset for tp in lease.sent[0]} == {0: 100, 1: 100}
    assert source.copies == [{0: 100, 1: 100}]


def test_a_refused_last_commit_still_copies_the_commits_accepted_before_it() -> None:
    s, lease, source = _session(accepts=False, accepted_before={0: 64, 1: 66})
    s._commit_all()
    assert len(lease.sent) == 1
    # Not the refused offsets (100): the lease group never accepted them.
    assert source.copies == [{0: 64, 1: 66}]


def test_nothing_accepted_and_refused_copies_nothing() -> None:
    s, _, source = _session(accepts=False, accepted_before={})
    s._commit_all()
    assert source.copies == []
