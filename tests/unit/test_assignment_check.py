"""The assignment check: a partition the coordinator gave this member and its consumer
does not hold, or one it holds and was not given, at every answer for 10 s, makes the
consumer rejoin; nothing is compared while a rebalance callback runs or for a member
the coordinator does not list, or when the probe did not answer."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from dueflow.consumers.assignment_check import (
    STUCK_AFTER_S,
    AssignmentCheck,
    GroupAsker,
    StuckWatch,
    given_to,
)
from dueflow.kafka.group_probe import Member

T = "p.exec.q"


def _group(**members: list[int]) -> list[Member]:
    return [Member("worker", tuple((T, p) for p in ps), m) for m, ps in members.items()]


@dataclass
class _Admin:
    """The group probe's answers."""

    group: list[Member] | None
    asked: int = 0

    async def describe(self, group: str) -> list[Member] | None:
        self.asked += 1
        return self.group


@dataclass
class _World:
    held: frozenset[tuple[str, int]]
    member: str = "me"
    settled: bool = True
    now: float = 0.0
    rejoins: list[str] = field(default_factory=list)
    counted: int = 0

    async def ask_held(self) -> tuple[str, frozenset[tuple[str, int]]] | None:
        return (self.member, self.held) if self.member else None

    def count(self) -> None:
        self.counted += 1


def _check(world: _World, admin: _Admin) -> AssignmentCheck:
    check = AssignmentCheck(
        queue="q",
        group="p.worker.q",
        describe=admin.describe,
        held=world.ask_held,
        settled=lambda: world.settled,
        rejoin=world.rejoins.append,
        count=world.count,
        clock=lambda: world.now,
    )
    return check


def _answers(check: AssignmentCheck, world: _World, times: list[float]) -> list[frozenset[Any]]:
    async def run() -> list[frozenset[Any]]:
        found = []
        for t in times:
            world.now = t
            found.append(await check.check())
        return found

    return asyncio.run(run())


def test_given_to_reads_the_members_assignment() -> None:
    group = _group(me=[0, 2], other=[1])
    assert given_to(group, "me") == frozenset({(T, 0), (T, 2)})
    assert given_to(group, "gone") is None


def test_a_partition_given_and_never_held_for_ten_seconds_rejoins_once() -> None:
    world = _World(held=frozenset({(T, 0)}))
    check = _check(world, _Admin(_group(me=[0, 1, 2], other=[3])))
    found = _answers(check, world, [0.0, 5.0, STUCK_AFTER_S, STUCK_AFTER_S + 2.0])
    assert found[:2] == [frozenset(), frozenset()]
    assert found[2] == {(T, 1), (T, 2)}
    assert found[3] == frozenset()  # the watch starts over after a rejoin
    assert len(world.rejoins) == 1
    assert world.counted == 1


def test_a_partition_held_in_between_starts_its_time_over() -> None:
    world = _World(held=frozenset())
    admin = _Admin(_group(me=[0]))
    check = _check(world, admin)
    _answers(check, world, [0.0])
    world.held = frozenset({(T, 0)})
    _answers(check, world, [6.0])
    world.held = frozenset()
    assert _answers(check, world, [12.0, 21.0]) == [frozenset(), frozenset()]
    assert _answers(check, world, [22.0]) == [{(T, 0)}]


def test_a_revocation_never_heard_of_rejoins_and_one_under_way_never_counts() -> None:
    world = _World(held=frozenset({(T, 0), (T, 1), (T, 2)}))  # 1 and 2 to be given up
    check = _check(world, _Admin(_group(me=[0], other=[])))
    assert _answers(check, world, [0.0, 9.0]) == [frozenset()] * 2
    world.settled = False  # its callback runs: waits for running jobs, up to the grace
    assert _answers(check, world, [10.0, 100.0, 400.0]) == [frozenset()] * 3
    world.settled = True
    assert _answers(check, world, [401.0, 405.0]) == [frozenset()] * 2
    assert world.rejoins == []
    assert _answers(check, world, [411.0]) == [{(T, 1), (T, 2)}]
    assert len(world.rejoins) == 1


def test_nothing_is_compared_during_a_rebalance_callback_or_for_an_unlisted_member() -> None:
    world = _World(held=frozenset(), settled=False)
    admin = _Admin(_group(me=[0]))
    check = _check(world, admin)
    assert _answers(check, world, [0.0, 20.0]) == [frozenset()] * 2
    assert admin.asked == 0
    world.settled, world.member = True, "not-listed"
    assert _answers(check, world, [40.0, 60.0]) == [frozenset()] * 2
    assert world.rejoins == []


def test_stuck_watch_forgets_what_is_held_again() -> None:
    watch = StuckWatch(stuck_after_s=10.0)
    assert watch.observe(0.0, {(T, 0), (T, 1)}, set()) == frozenset()
    assert watch.observe(10.0, {(T, 0), (T, 1)}, {(T, 1)}) == {(T, 0)}
    assert watch.observe(20.0, {(T, 1)}, {(T, 0), (T, 1)}) == {(T, 0)}  # held, not given


def test_no_answer_from_the_probe_compares_nothing() -> None:
    world = _World(held=frozenset())
    check = _check(world, _Admin(None))
    assert _answers(check, world, [0.0, 20.0, 40.0]) == [frozenset()] * 3
    assert world.rejoins == []


def test_the_asker_asks_on_a_thread_of_its_own_and_closes_the_probe() -> None:
    class _Probe:
        def __init__(self) -> None:
            self.threads: list[str] = []
            self.closed = False

        def members(self, group: str) -> list[Member] | None:
            self.threads.append(threading.current_thread().name)
            return [Member("c", ((T, 0),), "me")]

        def close(self) -> None:
            self.closed = True

    probe = _Probe()
    asker = GroupAsker(probe)  # type: ignore[arg-type]
    assert asyncio.run(asker.members("g")) == [Member("c", ((T, 0),), "me")]
    assert probe.threads[0].startswith("dueflow-groups")
    asker.close()
    assert probe.closed
