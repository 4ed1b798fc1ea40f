"""Whether a queue's consumer holds what the group coordinator gave it, no more, no less.

librdkafka (2.16) can miss a change of assignment of the ``consumer`` group
protocol (KIP-848) for good: a heartbeat whose request times out while the
broker is paused (longer than about 3 s) may have been processed by it, and the
member's later heartbeats do not say what it owns, so the coordinator never
sends that change again. A partition it should give up stays with it, one it
was given stays with nobody, and the partitions waiting for either start
nothing until the coordinator fences the member at the group's rebalance
timeout (``max.poll.interval.ms``, minutes).

So every ``worker.assignment_check_s`` the queue asks the coordinator what it
gave this member (``describe_consumer_groups``, through the worker process's
:class:`~dueflow.kafka.group_probe.GroupProbe`: that call can abort the process
that makes it when a broker goes away, librdkafka#4605, so a child process makes
it) and compares it with what the consumer holds. A partition held
and not given, or given and not held, at every answer for :data:`STUCK_AFTER_S`
makes the consumer leave the group and join it again (``unsubscribe`` +
``subscribe``: what it holds is revoked as in any rebalance, its finished work
committed, then the coordinator assigns it afresh). In a rebalance the two
agree again within a heartbeat or two; while a revocation's callback runs (it
may wait up to ``worker.rebalance_grace_s`` for running jobs) nothing is
compared.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from dueflow.kafka.group_probe import GroupProbe, Member
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")
STUCK_AFTER_S = 10.0  # given and held disagree at every answer for this long: stuck

Partition = tuple[str, int]


def given_to(members: Iterable[Member], member_id: str) -> frozenset[Partition] | None:
    """The partitions the coordinator gives ``member_id``; None when the member is not
    one of ``members`` (pure)."""
    for member in members:
        if member.member_id == member_id:
            return frozenset(member.assignment)
    return None


class StuckWatch:
    """Partitions given and not held, or held and not given, and since when (pure: the
    caller tells the time)."""

    def __init__(self, stuck_after_s: float = STUCK_AFTER_S) -> None:
        self.stuck_after_s = stuck_after_s
        self._since: dict[Partition, float] = {}

    def observe(
        self, now: float, given: Iterable[Partition], held: Iterable[Partition]
    ) -> frozenset[Partition]:
        """One answer; the partitions the two disagreed on at every answer for
        ``stuck_after_s``."""
        differ = frozenset(given) ^ frozenset(held)
        self._since = {tp: self._since.get(tp, now) for tp in differ}
        return frozenset(
            tp for tp, since in self._since.items() if now - since >= self.stuck_after_s
        )

    def reset(self) -> None:
        self._since.clear()


class AssignmentCheck:
    """Asks the coordinator on each :meth:`tick` (one question at a time) and makes the
    consumer rejoin when a partition is stuck.

    ``describe(group)``: the group's members as the coordinator has them (None when
    it did not say); ``held()``: the consumer's member id and assignment;
    ``settled()``: no rebalance callback runs and the queue runs (else the answer
    is not compared); ``rejoin(reason)``: leave the group and join again.
    """

    def __init__(
        self,
        *,
        queue: str,
        group: str,
        describe: Callable[[str], Awaitable[list[Member] | None]],
        held: Callable[[], Awaitable[tuple[str, frozenset[Partition]] | None]],
        settled: Callable[[], bool],
        rejoin: Callable[[str], None],
        count: Callable[[], None],
        watch: StuckWatch | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queue = queue
        self._group = group
        self._describe = describe
        self._held = held
        self._settled = settled
        self._rejoin = rejoin
        self._count = count
        self._watch = watch or StuckWatch()
        self._clock = clock
        self._asking: asyncio.Task[None] | None = None

    def tick(self) -> None:
        """Ask now unless a question is under way (on the loop)."""
        if self._asking is not None and not self._asking.done():
            return
        self._asking = asyncio.get_running_loop().create_task(self._ask())

    async def _ask(self) -> None:
        try:
            await self.check()
        except Exception as exc:  # the broker away, the consumer closing: next tick
            event(_LOG, "assignment check not answered", logging.DEBUG, error=repr(exc))

    async def check(self) -> frozenset[Partition]:
        """One question and its comparison; the partitions found stuck (rejoined)."""
        if not self._settled():
            self._watch.reset()
            return frozenset()
        mine = await self._held()
        if mine is None:
            return frozenset()
        member_id, held = mine
        members = await self._describe(self._group)
        given = None if members is None else given_to(members, member_id)
        if given is None or not self._settled():
            self._watch.reset()
            return frozenset()
        stuck = self._watch.observe(self._clock(), given, held)
        if stuck:
            self._watch.reset()
            event(
                _LOG,
                "consumer's assignment differs from the group's: rejoining",
                logging.WARNING,
                queue=self._queue,
                partitions=sorted(f"{t}[{p}]" for t, p in stuck),
                held=len(held),
            )
            self._count()
            self._rejoin(f"stuck assignment: {len(stuck)} partition(s) not as the group says")
        return stuck


class GroupAsker:
    """A worker process's :class:`~dueflow.kafka.group_probe.GroupProbe`, asked from the
    loop on a thread of its own (a question may wait for its timeout, 12 s, while a
    broker is away: not on the loop's default executor, which is for short work)."""

    def __init__(self, probe: GroupProbe) -> None:
        self.probe = probe
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="dueflow-groups")

    async def members(self, group: str) -> list[Member] | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.probe.members, group)

    def close(self) -> None:
        """Stop the child (after the question under way, if any); blocks."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        self.probe.close()
