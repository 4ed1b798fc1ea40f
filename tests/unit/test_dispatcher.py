"""The dispatcher carries each head record to its verdict (no broker): a record not
due at the turn's clock holds its partition unless it is due by now (or is set aside
when it is due within a second, and starts when due), a replay of a
running key waits for it, a duplicate is recorded and its offset finished."""

from __future__ import annotations

import asyncio
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


def dispatcher(clock: Callable[[], int]) -> tuple[Dispatcher, list[Delivery], Any]:
    """A dispatcher of queue ``jobs`` reading ``clock``, and the deliveries it started."""
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
    return (
        Dispatcher(
            queue="jobs",
            life=life,
            intake=intake,
            doubt=doubt,
            slots=Slots(4),
            recorder=recorder,
            running=running,
            overlap=overlap,
            registry=TaskRegistry([noop]),
            rates=QueueRates(None, task_rates={}, partitions=6, now=0.0),
            book=NoSteering(),  # type: ignore[arg-type]
            steer=None,  # type: ignore[arg-type]
            quarantine=None,  # type: ignore[arg-type]
            metrics=Metrics(),
            limits=WireLimits(),
            due_now=clock,
            start=started.append,
            recheck=lambda feed: None,
        ),
        started,
        (recorder, running),
    )


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
