"""The batch being built: its records, the key states it makes final, and its cut.

Every attempt's end adds records here (:class:`~dueflow.consumers.recorder.BatchRecorder`
says which); the commit loop cuts a :class:`~dueflow.consumers.committer.Batch`
from them with each partition's committable offset, and when it commits, its
keys are final in the stores. A key finished here is "pending final" until its
batch commits, so a replayed record of the same key is skipped even before the
store knows. Counters and durations are added up per batch, not per job.

The batch is bounded: a batch commits on the transaction thread while the next
one fills, and when jobs finish faster than a commit ends (a burst of due
jobs), the next batch would grow for as long as the commit takes. Past
``limit`` records (:meth:`full`) the dispatcher starts nothing until the batch
is cut (:meth:`wait_for_cut`), so at most two batches are held: the one
committing and the one filling.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import TopicPartition

from dueflow.consumers.committer import Batch
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.progress import ProgressReporter
from dueflow.consumers.store import RETRIED
from dueflow.observability.metrics import Metrics, observe_many
from dueflow.records.steering_state import Entry

if TYPE_CHECKING:
    from dueflow.consumers.commands import CommandApplier
    from dueflow.consumers.fan_in_owner import GroupFinal

Final = tuple[PartitionFeed, bytes, int, int]  # feed, key, state, at_ms
Mark = tuple[PartitionFeed, int]  # feed, offset committed with the batch
# feed, store key (a job's idempotency key, or a unique key's entry key), the state
# after (None: removed)
SteerFinal = tuple[PartitionFeed, bytes, Entry | None]


class Finals(NamedTuple):
    """What a batch makes final when it commits: key states and steering states."""

    keys: list[Final]
    steering: list[SteerFinal]
    groups: Sequence[GroupFinal] = ()  # fan-in: groups' states after (groups.py)


class PendingBatch:
    """Records, final key states and metrics of the batch being built."""

    def __init__(
        self,
        queue: str,
        *,
        metrics: Metrics,
        progress: ProgressReporter | None,
        limit: int | None = None,
    ) -> None:
        self._name = queue
        self._metrics = metrics
        self.records: list[tuple[Any, ...]] = []  # (feed, topic, partition, key, value, headers)
        self.limit = limit  # records the batch holds before no job starts (None: no bound)
        self._cut_waiters: list[Callable[[], None]] = []
        self.finals: list[Final] = []
        self.pending_final: dict[bytes, int] = {}
        # Steering: commands and steered jobs (dueflow.consumers.commands), set by the owner.
        self.steering: CommandApplier | None = None
        self.steer_finals: list[SteerFinal] = []
        self._dirty = False
        self._tally: Tally[tuple[str, str]] = Tally()
        self._succeeded: dict[str, int] = {}  # task -> successes (the hot counter)
        self._durations: list[tuple[str, float]] = []
        self.progress = progress
        if progress is not None:
            metrics.progress_reports.labels(queue)
            for kind in ("progress", "running"):
                metrics.progress_outcomes.labels(queue, kind)

    def __len__(self) -> int:
        return len(self.records)

    def full(self) -> bool:
        """The batch holds ``limit`` records: no job starts until it is cut."""
        return self.limit is not None and len(self.records) >= self.limit

    def wait_for_cut(self, pump: Callable[[], None]) -> None:
        """Call ``pump`` (on the loop) once the batch is cut or cleared."""
        if pump not in self._cut_waiters:
            self._cut_waiters.append(pump)

    def _emptied(self) -> None:
        if not self._cut_waiters:
            return
        waiting, self._cut_waiters = self._cut_waiters, []
        loop = asyncio.get_running_loop()
        for pump in waiting:
            loop.call_soon(pump)

    # ------------------------------------------------------------------ parts
    def add(
        self,
        feed: PartitionFeed,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> None:
        """One more record of the batch (``partition`` -1: the partitioner's)."""
        self.records.append((feed, topic, partition, key, value, headers))

    def final(self, feed: PartitionFeed, key: bytes, state: int, at_ms: int) -> None:
        """``key`` is ``state`` once the batch commits (and pending final until then)."""
        self.finals.append((feed, key, state, at_ms))
        self.pending_final[key] = state

    def steered(self, feed: PartitionFeed, key: bytes, state: Entry | None) -> None:
        """The steering state of ``key`` becomes ``state`` (None: removed) with the batch."""
        assert self.steering is not None
        topic, partition, record_key, value, headers = self.steering.state_record(feed, key, state)
        self.records.append((feed, topic, partition, record_key, value, headers))
        self.steer_finals.append((feed, key, state))
        self.steering.book.pending[(feed.partition, key)] = state

    # ------------------------------------------------------------------ batches

    def add_progress(self, running: Iterable[Delivery], at_ms: int) -> None:
        """Before a cut: the progress outcomes due now (see
        :mod:`dueflow.consumers.progress`) of the attempts ``running``."""
        if self.progress is not None:
            self.records.extend(self.progress.records(running, at_ms=at_ms))

    def lost(self) -> None:
        """Some partitions were lost: drop their records at the next cut."""
        self._dirty = True

    def clear(self) -> None:
        self.records, self.finals = [], []
        self.pending_final.clear()
        self.steer_finals = []
        if self.steering is not None:
            self.steering.book.pending.clear()
            self.steering.groups.book.clear()
        self._emptied()

    def cut(
        self, feeds: list[PartitionFeed], *, resend: bool = False
    ) -> tuple[Batch, Finals, list[Mark]] | None:
        """Take the batch: records so far and the committable offset of each feed
        (``resend``: of every feed that has one, also when it did not move).

        A feed the batch writes for sends its offset also when it did not move (a
        slow job ahead of finished ones holds it). The pending offset commit is
        the fence against a zombie: a worker frozen inside the commit may finish
        it after its partition moved, and the new owner's read of the committed
        offsets waits for that transaction (read_committed, KIP-447) and then
        finds its records in the key store, instead of running them again
        (tests/integration/test_pending_offsets_fence.py)."""
        records, finals, steer = self.records, self.finals, self.steer_finals
        groups = self.steering.groups.book.take() if self.steering is not None else []
        if self._dirty:
            records = [r for r in records if not r[0].gone]
            for feed, key, _state, _at in finals:
                if feed.gone:
                    self.pending_final.pop(key, None)
            finals = [f for f in finals if not f[0].gone]
            if self.steering is not None:
                self.steering.book.forget(f for f in steer if f[0].gone)
            steer = [f for f in steer if not f[0].gone]
            if self.steering is not None:
                self.steering.groups.book.forget(f for f in groups if f[0].gone)
            groups = [f for f in groups if not f[0].gone]
            self._dirty = False
        offsets: list[TopicPartition] = []
        marks: list[Mark] = []
        # (feed, its committed offset) that did not move: sent if the batch writes for it
        still: list[tuple[PartitionFeed, int]] = []
        for feed in feeds:
            if feed.gone:
                continue
            position = feed.tracker.committable()
            if position is not None and position != feed.committed:
                offsets.append(TopicPartition(feed.topic, feed.partition, position))
                marks.append((feed, position))
            elif feed.committed is not None:
                if resend:
                    offsets.append(TopicPartition(feed.topic, feed.partition, feed.committed))
                else:
                    still.append((feed, feed.committed))
        if still and records:
            writing = {id(r[0]) for r in records}
            offsets.extend(
                TopicPartition(f.topic, f.partition, at) for f, at in still if id(f) in writing
            )
        self.records, self.finals, self.steer_finals = [], [], []
        self._emptied()
        if not records and not offsets:
            return None
        batch = Batch(records, offsets, _gone_check(records, marks))
        return batch, Finals(finals, steer, groups), marks

    def committed(self, done: Finals, marks: list[Mark]) -> None:
        """The batch is committed: its keys are final in the stores now (and its
        steering states in theirs)."""
        finals = done.keys
        if done.steering and self.steering is not None:
            self.steering.book.committed(done.steering)
        if done.groups and self.steering is not None:
            self.steering.groups.book.committed(done.groups)
        for feed, position in marks:
            feed.committed = position
        by_store: dict[int, tuple[Any, list[tuple[bytes, int | None, int]]]] = {}
        pending = self.pending_final
        for feed, key, state, at_ms in finals:
            entry = by_store.get(id(feed.keys))
            if entry is None:
                entry = by_store[id(feed.keys)] = (feed.keys, [])
            entry[1].append((key, state, at_ms))
            if pending.get(key) == state:
                del pending[key]
        for store, items in by_store.values():
            store.apply(items, None)

    def flush_metrics(self) -> None:
        """Counters and durations are added up per batch, not per job (hot path)."""
        m = self._metrics
        q = self._name
        if self._succeeded:
            for task, count in self._succeeded.items():
                self._tally[(task, "succeeded")] += count
            self._succeeded.clear()
        if self._tally:
            for (task, outcome), count in self._tally.items():
                m.jobs.labels(q, task, outcome).inc(count)
                if outcome in ("succeeded", "retrying", "dead"):
                    m.attempts.labels(q, task).inc(count)
            self._tally.clear()
        if self.progress is not None:
            reports, written = self.progress.take_counts()
            if reports:
                m.progress_reports.labels(q).inc(reports)
            for kind, count in written.items():
                if count:
                    m.progress_outcomes.labels(q, kind).inc(count)
        if self._durations:
            per_task: dict[str, list[float]] = {}
            for task, seconds in self._durations:
                per_task.setdefault(task, []).append(seconds)
            for task, values in per_task.items():
                observe_many(m.job_duration.labels(q, task), values)
            self._durations.clear()


def key_name(state: int) -> str | None:
    """A key store state as the steering rule names it: done, dead, cancelled, or
    None (an attempt handed on to a retry: not an end)."""
    if state >= RETRIED:
        return None
    return ("done", "dead", "cancelled")[state]


def _gone_check(records: list[tuple[Any, ...]], marks: list[Mark]) -> Callable[[], bool]:
    """Whether a feed the batch writes for is gone (asked before the offsets are
    sent, before the commit, and before a replay)."""
    feeds: list[Any] | None = None

    def gone() -> bool:
        nonlocal feeds
        if feeds is None:  # the distinct feeds, once: a batch has thousands of records
            distinct = {id(f): f for f, _ in marks}
            distinct.update((id(r[0]), r[0]) for r in records if r[0] is not None)
            feeds = list(distinct.values())
        return any(f.gone for f in feeds)

    return gone
