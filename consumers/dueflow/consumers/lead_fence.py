"""Before a job fired ahead starts: every record appended to its partition before
its due time has been read and handled.

An emitter fires a job up to ``emitter.fire_ahead_ms`` before it is due, so a
command acknowledged after the fire and before the due time (a cancel, a move)
is behind the job in the exec partition. The worker sets the job aside until
it is due and handles the records behind it meanwhile; the fence makes that
exact: the job starts only once every record appended to the partition before
its due time (by the broker's clock) has been handled, so a command
acknowledged before the due time is applied first, however late the worker
read it (a stopped or replaced worker, a new owner after a rebalance that reads
the job past its due time).

:class:`LeadFence` keeps, per partition:

- ``fence_ms``: every record appended before this broker time has been handled;
- ``fenced``: the jobs due and waiting for the fence (a heap by due time);
- ``fence_goal``: an answer to an ask not reached yet (asked at, offset).

The fence moves two ways. Each fire carries ``df-fired``, the broker's time
(as the emitter's clock probe bounds it from below) before it was sent: when
such a record reaches the head of its partition, every record in front of it
has been handled and everything appended before its stamp is in front of it
(:func:`~dueflow.consumers.feeds.prepare` moves the fence; on a busy partition
this is all it takes). A job still waiting :data:`ASK_AFTER_S` later makes the
fence ask the partition's last stable offset through the admin client (one
ListOffsets request for every partition waiting, answered through futures:
nothing waits on the loop; one request at a time); the answer moves the fence
to the moment it was asked once every record before that offset is handled.
When the answer lies past the last record delivered (transaction markers, or
records not fetched yet), the consumer's position, read on its thread once
every record it returned has reached the loop, says whether anything is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dueflow.consumers.feeds import PartitionFeed
from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")

ASK_TIMEOUT_S = 10.0
# Asks failing this long in a row are logged as a warning (jobs fired ahead wait).
WARN_AFTER_S = 10.0
# A job due past its fence: the emitter's records normally move the fence within
# this (each fire carries the broker's time it was sent at); else the end is asked.
ASK_AFTER_S = 0.001
RETRY_FIRST_S = 0.005
RETRY_MAX_S = 0.5
# An answer past the last record delivered: how long to wait for records before
# the consumer's position is asked (normally the records arrive first).
POSITION_AFTER_S = 0.005


def handled_to(feed: PartitionFeed) -> int:
    """A lower bound of the offset below which every record of ``feed`` was handled
    (its first record not dispatched yet, else one past the last delivered; -1 when
    nothing was delivered)."""
    backlog = feed.backlog
    if backlog:
        return backlog[0].offset
    read_to = feed.tracker.read_to
    return -1 if read_to is None else read_to


def reached(feed: PartitionFeed, goal_offset: int) -> bool:
    """Every record of ``feed`` below ``goal_offset`` was handled (pure)."""
    return handled_to(feed) >= goal_offset


def _refresh_metadata(admin: AdminClient, topics: list[str]) -> None:
    """The topics' metadata asked again (on a worker thread: it blocks)."""
    for topic in topics:
        with contextlib.suppress(KafkaException):
            admin.list_topics(topic, timeout=ASK_TIMEOUT_S)


def waiting(feed: PartitionFeed) -> bool:
    """``feed`` has a job waiting for its fence (pure)."""
    fenced = feed.fenced
    return not feed.revoked and bool(fenced) and fenced[0][0] > feed.fence_ms


def retry_delay(failures: int) -> float:
    """Seconds before asking again after ``failures`` failed asks in a row."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * float(2 ** min(failures, 16)))


class LeadFence:
    """Asks the last stable offsets of the partitions whose jobs wait for the fence.

    ``due_now``: the earliest the broker's clock can read now (epoch ms);
    ``on_reached(feed)``: ``feed.fence_ms`` moved on (the dispatcher puts the
    jobs now covered back in front of the backlog); ``position(tp)``: the
    consumer's position of ``tp``, read once every record it returned before is
    on the loop.
    """

    def __init__(
        self,
        *,
        queue: str,
        due_now: Callable[[], int],
        on_reached: Callable[[PartitionFeed], None],
        position: Callable[[TopicPartition], Coroutine[Any, Any, int]],
        count_ask: Callable[[str], None],
    ) -> None:
        self._queue = queue
        self._due_now = due_now
        self._on_reached = on_reached
        self._position = position
        self._count_ask = count_ask
        self._admin: AdminClient | None = None
        self._loop = asyncio.get_running_loop()
        self._wanted: dict[tuple[str, int], PartitionFeed] = {}
        self._unanswered = 0  # partitions of the request under way
        self._failures = 0
        self._retry: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None  # the first want's ask
        self._stale: set[str] = set()  # topics whose ask failed: metadata asked first
        self._refreshing = False
        self._failing_since: float | None = None  # monotonic s of the first failure in a row
        self._warn_at = 0.0

    def _idle(self) -> bool:
        """No request under way, due or being prepared."""
        return (
            not self._unanswered
            and self._retry is None
            and self._timer is None
            and not self._refreshing
        )

    def start(self, admin: AdminClient) -> None:
        self._admin = admin
        if self._wanted and self._idle():
            self._ask()

    def want(self, feed: PartitionFeed) -> None:
        """Jobs of ``feed`` are due past its fence: unless the emitter's records move it
        within :data:`ASK_AFTER_S`, ask for its end (or once the request under way is
        answered)."""
        self._wanted[(feed.topic, feed.partition)] = feed
        if self._idle():
            self._timer = self._loop.call_later(ASK_AFTER_S, self._ask)

    def check(self, feed: PartitionFeed) -> None:
        """The dispatcher went on in ``feed``: is its answer reached, or its fence past
        a job waiting, now?"""
        goal = feed.fence_goal
        if goal is not None:
            asked_ms, offset = goal
            if reached(feed, offset):
                self._reach(feed, asked_ms)
                return
            if not feed.backlog and feed.fence_probe is None:
                feed.fence_probe = self._loop.call_later(POSITION_AFTER_S, self._probe, feed)
        fenced = feed.fenced
        if fenced and fenced[0][0] <= feed.fence_ms:
            self._on_reached(feed)

    # ------------------------------------------------------------------ asking

    def _ask(self) -> None:
        """One request for every partition still waiting (never two at a time)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        admin = self._admin
        if admin is None or self._unanswered or self._refreshing:
            return
        feeds = [f for f in self._wanted.values() if waiting(f)]
        self._wanted.clear()
        if not feeds:
            return
        asked_ms = self._due_now()  # the request reaches the broker after this
        try:
            futures = admin.list_offsets(
                {f.tp: OffsetSpec.latest() for f in feeds},  # type: ignore[no-untyped-call]
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=ASK_TIMEOUT_S,
            )
        except Exception as exc:  # refused before it was sent: nothing of it answers
            self._failed(feeds, exc)
            return
        by_place = {(f.topic, f.partition): f for f in feeds}
        self._unanswered += len(futures)
        self._count_ask("asked")
        for tp, future in futures.items():
            feed = by_place[(tp.topic, tp.partition)]
            future.add_done_callback(self._on_answer(feed, asked_ms))

    def _on_answer(self, feed: PartitionFeed, asked_ms: int) -> Callable[[Future[Any]], None]:
        def answered(future: Future[Any]) -> None:  # on the admin client's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the process exits
                self._loop.call_soon_threadsafe(self._answered, feed, asked_ms, future)

        return answered

    def _answered(self, feed: PartitionFeed, asked_ms: int, future: Future[Any]) -> None:
        self._unanswered -= 1
        error = None if future.cancelled() else future.exception()
        offset = -1 if future.cancelled() or error is not None else int(future.result().offset)
        if offset < 0:  # failed, or no offset in the answer (-1001: a leader moving)
            self._failed([feed], error or ValueError(f"no offset in the answer: {offset}"))
        elif not feed.revoked:
            self._failing_since = None
            goal = feed.fence_goal
            if goal is None or goal[0] < asked_ms:
                feed.fence_goal = (asked_ms, offset)
            self.check(feed)
        if self._wanted and self._idle():
            self._ask()

    def _failed(self, feeds: list[PartitionFeed], error: BaseException | None) -> None:
        """A leader moved, a timeout: asked again after 5 ms doubling to 0.5 s, the
        topic's metadata first (an admin client does not learn by itself that a
        partition's leader moved)."""
        self._count_ask("failed")
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        failing_s = now - self._failing_since
        late = failing_s >= WARN_AFTER_S and now >= self._warn_at
        if late:
            self._warn_at = now + WARN_AFTER_S
        event(
            _LOG,
            "lead fence cannot read partition ends" if late else "lead fence ask failed",
            logging.WARNING if late else logging.DEBUG,
            queue=self._queue,
            partitions=[f.partition for f in feeds],
            error=repr(error),
            failing_s=round(failing_s, 1),
        )
        for f in feeds:
            self._stale.add(f.topic)
            if not f.revoked:
                self._wanted[(f.topic, f.partition)] = f
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._retry is None:
            self._retry = self._loop.call_later(retry_delay(self._failures), self._again)
        self._failures += 1

    def _again(self) -> None:
        self._retry = None
        admin = self._admin
        stale, self._stale = sorted(self._stale), set()
        if admin is None or not stale or self._refreshing:
            self._ask()
            return
        self._refreshing = True
        refresh = self._loop.run_in_executor(None, _refresh_metadata, admin, stale)
        refresh.add_done_callback(self._refreshed)

    def _refreshed(self, done: asyncio.Future[None]) -> None:
        self._refreshing = False
        if not done.cancelled():
            done.exception()  # retrieved: a failed refresh is asked again with the ends
        self._ask()

    # ------------------------------------------------------------------ reaching

    def _reach(self, feed: PartitionFeed, asked_ms: int) -> None:
        self._failures = 0
        feed.fence_goal = None
        if feed.fence_probe is not None:
            feed.fence_probe.cancel()
            feed.fence_probe = None
        if asked_ms > feed.fence_ms:
            feed.fence_ms = asked_ms
        self._on_reached(feed)

    def _probe(self, feed: PartitionFeed) -> None:
        """The answer lies past the records delivered: the consumer's position says
        whether records are still to come (else transaction markers end the log)."""
        feed.fence_probe = None
        goal = feed.fence_goal
        if goal is None or feed.revoked:
            return
        if reached(feed, goal[1]):
            self._reach(feed, goal[0])
            return
        if feed.backlog:
            return  # checked again as the dispatcher goes on
        task: asyncio.Task[int] = self._loop.create_task(self._position(feed.tp))
        task.add_done_callback(lambda t: self._positioned(feed, goal, t))

    def _positioned(
        self, feed: PartitionFeed, goal: tuple[int, int], task: asyncio.Task[int]
    ) -> None:
        failed = task.cancelled() or task.exception() is not None  # retrieved
        if feed.revoked or feed.fence_goal is not goal:
            return
        position = -1 if failed else task.result()
        backlog = feed.backlog
        if position >= goal[1] and (not backlog or backlog[0].offset >= goal[1]):
            self._reach(feed, goal[0])
        elif not backlog and feed.fence_probe is None:
            # still being fetched (or the partition paused): look again
            feed.fence_probe = self._loop.call_later(max(POSITION_AFTER_S, 0.05), self._probe, feed)
