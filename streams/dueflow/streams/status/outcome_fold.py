"""The status view's fold: outcome records into job views, counts and changelog records.

:class:`OutcomeFold` folds the records of the outcomes topic in batches (the
consumer hands them over a fetched list at a time). A batch reads the previous
views of its jobs in one query, changes its copy of each job's view
(``state.apply_outcome``), then writes one changelog record per key it changed,
with the key's last value (a job's outcomes that arrive together, one worker
transaction, cost one write a batch instead of one each), through a librdkafka
producer (:mod:`.changelog_writer`). The batch waits until the changelog has
stored those records and writes their rows in one transaction; only then does
the consumer acknowledge the batch's outcomes, so a committed offset never runs
ahead of the changelog. A job's new view is answered as soon as its batch is
folded, before its record is stored.

The per-queue counts by state (:mod:`.queue_counts`) are derived from the job
views, never stored on their own: after each recovery :meth:`OutcomeFold.recount`
counts the active partitions' rows in the job file (a covering index, about
0.3 s per million jobs) and the views staged over them, and the fold then changes
the counts with each view it changes. So after any crash the counts say what the
job views say. They are kept in memory rather than computed per request because
a request must not scan every job (the page polls every second).

A record that does not decode is counted, logged and set aside in the quarantine.
Finished jobs leave the table once older than the retention
(:meth:`OutcomeFold.sweep`, over the job file's index of finished jobs); the
removal is a tombstone in the changelog.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.consumers.quarantine import Quarantine
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.outcome_checks import check_outcome
from dueflow.records.outcome_decoder import decode_outcome
from dueflow.rules import job_state as state
from dueflow.rules.job_status import scheduled_content_hash
from dueflow.streams.status.changelog_writer import ChangelogWriter
from dueflow.streams.status.job_store import JobStore, Staged
from dueflow.streams.status.job_waiters import JobWaiters
from dueflow.streams.status.queue_counts import QueueCounts
from dueflow.streams.status.queue_watch import ENDED, QueueWatch

log = logging.getLogger("dueflow.status")

SWEEP_PAGE = 1000  # finished jobs read per step of the sweep (it yields in between)


@dataclass(slots=True)
class Changed:
    """Jobs changed by a batch of outcomes, each with its changelog partition (the
    partition of the outcomes that changed it) and its view now."""

    jobs: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    # The batch's changes to the metrics (written once a batch, not once an outcome).
    outcomes: dict[str, int] = field(default_factory=dict)  # outcome state -> n
    jobs_by_state: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state)


class OutcomeFold:
    """Folds the records of ``outcomes_topic`` into the job views of ``store`` (it
    gives the jobs table's store, which faust makes later), ``counts`` and the
    metrics, and writes each changed job through ``changelog``. ``watch``, ``recent``
    and ``waiters`` hear of each change; undecodable records go to ``quarantine``."""

    def __init__(
        self,
        *,
        outcomes_topic: str,
        store: Callable[[], JobStore],
        changelog: ChangelogWriter,
        counts: QueueCounts,
        watch: QueueWatch,
        recent: deque[str],
        waiters: JobWaiters,
        metrics: Metrics,
        quarantine: Quarantine | None,
    ) -> None:
        self.outcomes_topic = outcomes_topic
        self._store = store
        self.changelog = changelog
        self.counts = counts
        self.watch = watch
        self.recent = recent
        self.waiters = waiters
        self.metrics = metrics
        self.quarantine = quarantine

    @property
    def store(self) -> JobStore:
        return self._store()

    async def fold_messages(self, messages: Sequence[Any]) -> None:
        """Fold a batch of outcome records (faust's messages: bytes as read). The
        consumer acknowledges them after this returns, so their offsets commit only
        once the changelog has the batch's records."""
        changed = Changed()
        # The previous views of the batch's jobs in one read (keys are job ids).
        self.store.prefetch(
            m.key.decode("utf-8", "replace") for m in messages if isinstance(m.key, bytes)
        )
        apply_event = self.apply_event
        for m in messages:
            apply_event(m.partition, m.offset, m.headers, m.value, changed, key=m.key)
        self.write_changed(changed)
        await self.saved()

    async def saved(self) -> None:
        """Wait until the changelog has every record sent, then write their rows."""
        await self.changelog.stored()
        self.store.flush()

    def write_changed(self, changed: Changed) -> None:
        """One changelog record per job a batch changed: its view now. A job's new
        view is answered at once; its row is written once the record is stored."""
        store = self.store
        store.flush()  # what was acknowledged since the last batch
        store.forget_prefetched()
        self._count_metrics(changed)
        for job_id, (p, view) in changed.jobs.items():
            # A copy of exact size: orjson's bytes keep a buffer of 4 KB or more, and
            # these stay in memory (hot views) until their record is stored.
            raw = memoryview(orjson.dumps(view)).tobytes()
            self._send_job(job_id, p, raw, store.stage(job_id, p, raw, view))
        if self.waiters:
            self.waiters.wake(changed.jobs)

    def _send_job(self, job_id: str, partition: int, raw: bytes | None, staged: Staged) -> None:
        self.changelog.send(
            job_id, partition, raw, functools.partial(self.store.saved, job_id, staged)
        )

    def apply_event(
        self,
        partition: int,
        offset: int,
        headers: Any,
        value: bytes | None,
        changed: Changed,
        *,
        key: bytes | None = None,
    ) -> dict[str, Any] | None:
        """Fold one outcome record into the job's view and the counts; ``changed``
        collects the jobs whose changelog records :meth:`write_changed` then writes."""
        pairs = _header_pairs(headers)
        try:
            raw = hdr.header(pairs, hdr.SCHEMA)
            version = codec.parse_schema_header(raw, expected="outcome")
            outcome = check_outcome(decode_outcome(value or b"", version))
        except UndecodableRecord as exc:
            out_of_range = isinstance(exc, FieldOutOfRange)
            self.metrics.skipped.labels(
                "status_view", "out_of_range" if out_of_range else "undecodable"
            ).inc()
            if self.quarantine is not None:
                self.quarantine.put_raw(
                    topic=self.outcomes_topic,
                    partition=partition,
                    offset=offset,
                    key=key if isinstance(key, bytes) else None,
                    value=value if isinstance(value, bytes) else None,
                    headers=pairs,
                    reason=reasons.with_detail(
                        reasons.FIELD_OUT_OF_RANGE if out_of_range else reasons.UNDECODABLE_OUTCOME,
                        exc,
                    ),
                )
            self._log_skipped(partition, offset, str(exc))
            return None
        job_id = outcome["job_id"]
        batched = changed.jobs.get(job_id)
        prev = batched[1] if batched is not None else self.store.view(job_id)
        try:
            view = state.apply_outcome(
                prev,
                outcome,
                partition=partition,
                fired_ms=state.header_ms(hdr.header(pairs, hdr.FIRED)),
                next_due_ms=state.header_ms(hdr.header(pairs, hdr.NEXT_DUE)),
            )
        except (KeyError, TypeError, ValueError) as exc:  # a record the fold cannot use
            self.metrics.skipped.labels("status_view", "unusable").inc()
            self._log_skipped(partition, offset, repr(exc))
            return None
        # What a client asking whether a job id exists compares (check_existing_ids).
        content_hash = scheduled_content_hash(outcome, pairs)
        if content_hash is not None:
            view["content_hash"] = content_hash
        changed.jobs[job_id] = (partition, view)
        # A redriven job's attempt is not late by the time it spent dead (its due
        # time stays the first one; a redrive writes a `fired` outcome).
        if outcome["state"] in ENDED:
            self.watch.record(
                outcome,
                redriven=any(h[0] == "fired" for h in (prev or {}).get("history") or ()),
            )
        self._count(prev, view, partition, changed)
        self.recent.append(job_id)
        outcomes = changed.outcomes
        outcomes[outcome["state"]] = outcomes.get(outcome["state"], 0) + 1
        return view

    def _log_skipped(self, partition: int, offset: int, reason: str) -> None:
        """The warning for an outcome record the view skips."""
        event(
            log,
            "status.outcome_skipped",
            logging.WARNING,
            topic=self.outcomes_topic,
            partition=partition,
            offset=offset,
            reason=reason,
        )

    def _count(
        self,
        prev: dict[str, Any] | None,
        new: dict[str, Any] | None,
        partition: int,
        changed: Changed,
    ) -> None:
        deltas = state.count_deltas(prev, new)
        self.counts.apply(partition, deltas)
        by_state = changed.jobs_by_state
        for queue, st, delta in deltas:
            by_state[queue, st] = by_state.get((queue, st), 0) + delta

    def _count_metrics(self, changed: Changed) -> None:
        """The batch's outcomes and job count changes into the metrics."""
        for st, n in changed.outcomes.items():
            self.metrics.status_outcomes.labels(st).inc(n)
        for (queue, st), delta in changed.jobs_by_state.items():
            if delta:
                self.metrics.status_jobs.labels(queue, st).inc(delta)

    def recount(self, partitions: frozenset[int]) -> None:
        """Count the jobs of ``partitions`` (the active ones after a recovery) by queue
        and state from the job views (:mod:`.queue_counts`), then the fold keeps them."""
        started = time.monotonic()
        before = self.counts.totals()
        self.counts.reset(self.store.count_states(partitions))
        after = self.counts.totals()
        for queue, states in before.items():
            for st in states:
                if st not in after.get(queue, {}):
                    self.metrics.status_jobs.labels(queue, st).set(0)
        for queue, states in after.items():
            for st, n in states.items():
                self.metrics.status_jobs.labels(queue, st).set(n)
        took = time.monotonic() - started
        if took > 1.0:
            event(log, "status.jobs_counted", partitions=sorted(partitions), seconds=round(took, 1))

    async def sweep(self, *, now_ms: int, retention_ms: int, partitions: set[int]) -> int:
        """One sweep of the jobs of ``partitions``; returns how many left."""
        store = self.store
        removed = 0
        after: tuple[int, str] | None = None
        while True:
            rows = store.finished_before(now_ms - retention_ms, after=after, limit=SWEEP_PAGE)
            if not rows:
                return removed
            changed = Changed()  # nothing to answer: removed jobs are tombstones
            for row in rows:  # no await in here: the stream cannot change them meanwhile
                after = (int(row.final_ms or 0), row.job_id)
                if row.partition not in partitions or store.is_staged(row.job_id):
                    continue  # another view's, or changed since it was written
                view = orjson.loads(row.view)
                if not state.expired(view, now_ms=now_ms, retention_ms=retention_ms):
                    continue
                self._send_job(
                    row.job_id, row.partition, None, store.stage(row.job_id, row.partition, None)
                )
                self._count(view, None, row.partition, changed)
                removed += 1
            self.write_changed(changed)
            await self.saved()  # (lets requests and the stream run meanwhile)


def _header_pairs(headers: Any) -> list[tuple[str, bytes | None]]:
    """faust gives headers as a mapping or a list of pairs; normalise to pairs."""
    if not headers:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return [(k, v) for k, v in headers]
