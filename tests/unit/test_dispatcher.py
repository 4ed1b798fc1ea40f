"""The dispatcher carries each head record to its verdict (no broker): a record not
due at the turn's clock holds its partition unless it is due by now (or is set aside
when it is due within a second, and starts when due), a replay of a
running key waits for it, a duplicate is recorded and its offset finished."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from dueflow.consumers import TaskRegistry, task
from dueflow.consumers.dispatch import Dispatcher
from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.intake import Intake
from dueflow.consumers.membership import MembershipDoubt
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.ratelimit import QueueRates
from dueflow.consumers.run_state import RunState
from dueflow.consumers.slots import Slots
from dueflow.consumers.store import DONE, MemoryKeyStore
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from tests.support.attempts import NOW, SETTINGS, batch_recorder, job_delivery

DUE = NOW + 50


@task("noop", queue="jobs")
def noop(payload: Any, ctx: Any) -> None:
    return None


class NoSteering:
    def judge(self, d: Delivery) -> None:
        return None


class ClockFence:
    """A lead fence answered at once: every record before now was handled."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.dispatcher: Dispatcher | None = None
        self.wanted: list[PartitionFeed] = []

    def want(self, feed: PartitionFeed) -> None:
        self.wanted.append(feed)
        feed.fence_ms = self.clock()
        assert self.dispatcher is not None
        self.dispatcher.fence_reached(feed)

    def check(self, feed: PartitionFeed) -> None:
        pass


class HeldFence(ClockFence):
    """A lead fence whose answers the test gives."""

    def want(self, feed: PartitionFeed) -> None:
        self.wanted.append(feed)


def dispatcher(
    clock: Callable[[], int], fence: ClockFence | None = None, rates: QueueRates | None = None
) -> tuple[Dispatcher, list[Delivery], Any]:
    """A dispatcher of queue ``jobs`` reading ``clock``, and the deliveries it started."""
    fence = fence or ClockFence(clock)
    life = RunState()
    overlap = OverlapGuard()
    intake = Intake(
        queue="jobs",
        group="g",
        fetch_batch=10,
        concurrency=4,
        life=life,
        metrics=Metrics(),
        overlap=overlap,
    )
    doubt = MembershipDoubt(
        queue="jobs", heartbeat_ms=3000, life=life, on_doubt=lambda: None, on_confirmed=lambda: None
    )
    started: list[Delivery] = []
    recorder = batch_recorder()
    running: dict[bytes, Delivery] = {}
    made = Dispatcher(
        queue="jobs",
        life=life,
        intake=intake,
        doubt=doubt,
        slots=Slots(4),
        recorder=recorder,
        running=running,
        overlap=overlap,
        registry=TaskRegistry([noop]),
        rates=rates
        if rates is not None
        else QueueRates(None, task_rates={}, partitions=6, now=0.0),
        book=NoSteering(),  # type: ignore[arg-type]
        steer=None,  # type: ignore[arg-type]
        quarantine=None,  # type: ignore[arg-type]
        metrics=Metrics(),
        limits=WireLimits(),
        due_now=clock,
        start=started.append,
        recheck=lambda feed: None,
        fence=fence,  # type: ignore[arg-type]
    )
    fence.dispatcher = made
    return made, started, (recorder, running)


def feed_with(*keys: str, due: dict[str, int] | None = None) -> PartitionFeed:
    """A loaded exec partition with a record per key, each due at ``DUE`` unless
    ``due`` says otherwise."""
    feed = PartitionFeed(names(SETTINGS).exec("jobs"), 2, None, MemoryKeyStore(10**9))
    for state in (FeedState.LOADING, FeedState.LOADED):
        feed.advance(state)
    for offset, key in enumerate(keys):
        job = make_job("noop", {}, queue="jobs", key=key, due_ms=(due or {}).get(key, DUE))
        d = job_delivery(feed, job, exec_headers(job, fired_ms=NOW), offset)
        feed.backlog.append(d)
        feed.tracker.extend([offset])
    return feed


def in_line(d: Dispatcher, feed: PartitionFeed) -> PartitionFeed:
    """``feed``, assigned to ``d``'s intake and ready."""
    d._intake.feeds[(feed.topic, feed.partition)] = feed
    d._intake.make_ready(feed)
    return feed


async def all_started(started: list[Delivery], keys: list[bytes]) -> None:
    """Wait (5 s at most) until ``keys`` have started, in this order."""
    deadline = time.monotonic() + 5
    while len(started) < len(keys):
        assert time.monotonic() < deadline, [s.key for s in started]
        await asyncio.sleep(0.01)
    assert [s.key for s in started] == keys


def clock_of(*readings: int) -> Callable[[], int]:
    """A clock that reads ``readings`` in turn, then the last one for good."""
    left = list(readings)

    def now() -> int:
        return left.pop(0) if len(left) > 1 else left[0]

    return now


def test_a_record_due_by_now_starts_in_the_same_turn() -> None:
    async def main() -> None:
        d, started, _ = dispatcher(clock_of(NOW, DUE + 1))  # not due at the turn's start
        feed = feed_with("k1")
        prepare(feed.backlog[0], TaskRegistry([noop]), now_ms=NOW, limits=WireLimits())
        assert feed.backlog[0].not_before == DUE
        assert d._dispatch(feed) is True
        assert [s.key for s in started] == [b"k1"]
        assert feed.held_until == 0
        assert feed.timer is None

    asyncio.run(main())


def test_a_record_due_later_than_a_fire_ahead_holds_its_partition_until_it_is() -> None:
    later = NOW + 5_000  # more than the longest fire ahead (1 s)

    async def main() -> None:
        d, started, _ = dispatcher(clock_of(NOW))
        feed = feed_with("k1", "k2", due={"k1": later, "k2": NOW})
        assert d._dispatch(feed) is True
        assert started == []  # k2, due, waits behind k1
        assert feed.held_until == later
        assert feed.timer is not None
        assert [x.offset for x in feed.backlog] == [0, 1]  # k1 still at the head
        assert feed.aside == []
        feed.timer.cancel()

    asyncio.run(main())


def test_a_record_due_soon_is_set_aside_and_starts_when_due_after_those_behind_it() -> None:
    now = [NOW]

    async def main() -> None:
        d, started, _ = dispatcher(lambda: now[0])
        feed = feed_with("k1", "k2", "k3", due={"k1": DUE, "k2": NOW, "k3": DUE + 10})
        assert d._dispatch(feed) is True
        assert [s.key for s in started] == [b"k2"]  # not held behind k1
        assert feed.held_until == 0
        assert feed.timer is None
        assert not feed.paused
        assert [(u, x.key) for u, _, x in feed.aside] == [(DUE, b"k1"), (DUE + 10, b"k3")]
        assert feed.waiting == 2
        assert feed.aside_timer is not None
        # The wake-up at DUE: k1 only is due; it starts, k3 stays aside.
        feed.aside_timer.cancel()
        now[0] = DUE
        d._aside_due(feed)
        assert [s.key for s in started] == [b"k2", b"k1"]
        assert [x.key for _, _, x in feed.aside] == [b"k3"]
        assert feed.aside_timer is not None
        # Revoked before k3 is due: it is forgotten with the backlog, its wake-up too.
        feed.drop_undispatched()
        assert feed.aside == []
        assert feed.aside_timer is None

    asyncio.run(main())


def test_a_replay_waits_for_its_key_and_a_duplicate_is_recorded() -> None:
    async def main() -> None:
        d, started, (recorder, running) = dispatcher(clock_of(DUE))
        feed = feed_with("running", "done", "new")
        running[b"running"] = object()
        recorder.pending_final[b"done"] = DONE
        assert d._dispatch(feed) is True
        assert [s.key for s in started] == [b"new"]
        assert [w.key for w in d._intake.held[b"running"]] == [b"running"]  # waits
        assert [r[1] for r in recorder.records] == [names(SETTINGS).outcomes]  # duplicate
        assert feed.tracker.unfinished == 2  # the waiting replay and the started job

    asyncio.run(main())


def test_a_job_fired_ahead_waits_for_the_fence_while_the_records_behind_it_go_on() -> None:
    """Due, fired ahead: it starts only once the fence is at its due time and the
    records in front of the answer's offset were handled."""
    now = [DUE]

    async def main() -> None:
        fence = HeldFence(lambda: now[0])
        d, started, _ = dispatcher(lambda: now[0], fence)
        feed = feed_with("k1", "k2", due={"k1": DUE, "k2": NOW})
        feed.backlog[1].hmap = {}  # k2: written when due, not fired ahead
        prepare(feed.backlog[0], TaskRegistry([noop]), now_ms=NOW, limits=WireLimits())
        assert feed.backlog[0].ahead
        assert d._dispatch(feed) is True
        assert fence.wanted == [feed]
        assert [x.key for _, _, x in feed.fenced] == [b"k1"]
        # k2 went on (written when due: no fence); k1 waits
        assert [s.key for s in started] == [b"k2"]
        # an answer asked before k1's due time covers nothing
        feed.fence_ms = DUE - 1
        d.fence_reached(feed)
        assert [x.key for _, _, x in feed.fenced] == [b"k1"]
        assert fence.wanted == [feed, feed]  # wanted again
        # the answer asked at its due time: k1 is decided again, first, and starts
        feed.fence_ms = DUE
        d.fence_reached(feed)
        assert feed.fenced == []
        assert [x.key for x in feed.backlog] == [b"k1"]
        d._dispatch(feed)
        assert [s.key for s in started] == [b"k2", b"k1"]

    asyncio.run(main())


def test_jobs_fired_ahead_that_the_fence_covers_start_in_offset_order() -> None:
    now = [DUE + 10]

    async def main() -> None:
        fence = HeldFence(lambda: now[0])
        d, started, _ = dispatcher(lambda: now[0], fence)
        feed = feed_with("k1", "k2", "k3", due={"k1": DUE + 5, "k2": DUE, "k3": DUE + 10})
        assert d._dispatch(feed) is True
        assert sorted(x.key for _, _, x in feed.fenced) == [b"k1", b"k2", b"k3"]
        feed.fence_ms = DUE + 5
        d.fence_reached(feed)
        assert [x.key for x in feed.backlog] == [b"k1", b"k2"]
        assert [x.key for _, _, x in feed.fenced] == [b"k3"]
        d._dispatch(feed)
        assert [s.key for s in started] == [b"k1", b"k2"]
        # revoked: the jobs waiting for the fence are forgotten with the backlog
        feed.drop_undispatched()
        assert feed.fenced == []
        assert feed.waiting == 0

    asyncio.run(main())


def test_a_fire_stamped_after_the_due_time_behind_the_job_moves_the_fence() -> None:
    """The emitter's next fire into the partition, stamped at or after the job's due
    time, is proof that what was appended before it was handled: the job starts
    without an ask."""
    now = [DUE + 3]

    async def main() -> None:
        fence = HeldFence(lambda: now[0])
        d, started, _ = dispatcher(lambda: now[0], fence)
        feed = feed_with("k1", "k2", due={"k1": DUE, "k2": DUE + 200})
        job = make_job("noop", {}, queue="jobs", key="k2", due_ms=DUE + 200)
        feed.backlog[1] = job_delivery(feed, job, exec_headers(job, fired_ms=DUE + 1), 1)
        assert d._dispatch(feed) is True
        assert feed.fence_ms == DUE + 1  # k2's stamp, read at the head after k1
        assert fence.wanted == [feed]
        d.fence_reached(feed)  # what the fence's check does after a dispatch
        assert feed.fenced == []
        d._dispatch(feed)
        assert [s.key for s in started] == [b"k1"]
        assert fence.wanted == [feed]  # never asked again

    asyncio.run(main())


def test_a_queue_rate_limit_keeps_the_partition_in_line_and_its_jobs_start_after() -> None:
    """No token for the queue: the partition stays first in line (its fetching paused
    with every other), and the rest of its jobs start once the limit lets them."""

    async def main() -> None:
        rates = QueueRates(4.0, task_rates={}, partitions=1, now=time.monotonic())
        rates.set_owned(1, now=time.monotonic())
        d, started, _ = dispatcher(lambda: DUE + 1, rates=rates)
        feed = in_line(d, feed_with("k1", "k2", "k3"))
        d.pump()
        assert [s.key for s in started] == [b"k1"]  # one token in the bucket
        assert d._intake.queue_held  # none for k2 yet
        assert list(d._intake.ready) == [feed]
        await all_started(started, [b"k1", b"k2", b"k3"])

    asyncio.run(main())


def test_a_full_batch_starts_nothing_until_it_is_cut() -> None:
    """Jobs finishing faster than a commit ends: past the batch's limit nothing more
    starts (its records would wait for the commit after next), and the jobs start
    once the commit loop cuts the batch."""

    async def main() -> None:
        d, started, (recorder, _running) = dispatcher(lambda: DUE + 1)
        recorder.limit = 2
        feed = in_line(d, feed_with("k1", "k2", "k3"))
        recorder.records.extend([(feed, "t", 0, b"a", b"", [])] * 2)  # two finished jobs' records
        assert recorder.full()
        d.pump()
        await asyncio.sleep(0.01)
        assert started == []
        assert list(d._intake.ready) == [feed]  # still in line
        cut = recorder.cut([feed])
        assert cut is not None
        assert len(cut[0].records) == 2
        assert not recorder.full()
        await all_started(started, [b"k1", b"k2", b"k3"])

    asyncio.run(main())


def test_a_batch_without_a_limit_is_never_full() -> None:
    recorder = batch_recorder()
    recorder.records.extend([(None, "t", 0, b"a", b"", [])] * 100_000)
    assert recorder.limit is None
    assert not recorder.full()
