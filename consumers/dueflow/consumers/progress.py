"""``ctx.progress``: the newest value per attempt, written at batch cuts, rate-limited.

A handler's ``ctx.progress(fraction, detail)`` is checked in the call
(:func:`dueflow.records.job_result.check_progress`) and stored as the
attempt's newest value (:meth:`ProgressReporter.note`: a lock and two
stores, no I/O; any thread). At each batch cut the runtime asks the reporter
for outcome records (:meth:`ProgressReporter.records`):

- a ``started`` outcome (Outcome version 3, ``progress`` and
  ``progress_detail``) for each attempt whose value changed since its last
  one, at most one per attempt per ``worker.progress_interval_ms`` and at most
  ``worker.progress_max_per_s`` per worker process (a
  :class:`ProgressBudget` shared by the process's queues); an attempt that
  must wait keeps only its newest value;
- one ``started`` outcome (version 1) for each attempt seen running for
  ``worker.report_running_after_ms`` that has written none yet, so a long job
  shows as running; a job that ends sooner writes nothing of the kind.

An attempt's value that was not written when it ends goes with its final
outcome (:class:`~dueflow.consumers.recorder.BatchRecorder`); the attempt is
then dropped here. Progress outcomes are not atomic with anything: one of
an attempt that is abandoned later is superseded by the job's next outcome.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from dueflow.consumers.feeds import identity, trace_id
from dueflow.consumers.outputs import OUTCOME_HEADERS, OUTCOME_V3_HEADERS
from dueflow.records.job_result import Progress
from dueflow.records.worker_codec import encode_outcome, encode_outcome_v3
from dueflow.rules.token_bucket import TokenBucket

OutcomeRecord = tuple[Any, str, int, bytes, bytes, list[tuple[str, bytes]]]


def monotonic_ms() -> float:
    return time.monotonic() * 1000


class AttemptProgress:
    """What the reporter knows of one running attempt (``Delivery.progress``)."""

    __slots__ = ("announced", "changed", "ended", "seen_ms", "sent_ms", "value")

    def __init__(self, seen_ms: float) -> None:
        self.value: Progress | None = None
        self.changed = False  # a value not written yet
        self.sent_ms = float("-inf")  # monotonic ms of its last progress outcome
        self.seen_ms = seen_ms  # monotonic ms it was first seen running (or reported)
        self.announced = False  # a started outcome of it was written
        self.ended = False

    def take_unsent(self) -> Progress | None:
        """The attempt ended: its value if no outcome carried it yet (then it is
        carried by the final one)."""
        self.ended = True
        if not self.changed:
            return None
        self.changed = False
        return self.value


class ProgressBudget:
    """Progress outcomes per worker process and second (one per process: its queue
    runtimes run on one event loop thread)."""

    def __init__(self, per_s: int, *, now_ms: float) -> None:
        self._bucket = TokenBucket(per_s / 1000, capacity=max(1, per_s), now=now_ms)

    def take(self, now_ms: float) -> bool:
        return self._bucket.try_take(now_ms) == 0.0


class ProgressReporter:
    """The progress of one queue's running attempts (see the module docstring)."""

    def __init__(
        self,
        *,
        queue: str,
        outcomes_topic: str,
        worker_id: str,
        interval_ms: int,
        running_after_ms: int,
        budget: ProgressBudget,
        clock: Callable[[], float] = monotonic_ms,
    ) -> None:
        self._queue = queue
        self._topic = outcomes_topic
        self._worker = worker_id
        self._interval = interval_ms
        self._running_after = running_after_ms
        self._budget = budget
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[Any, None] = {}  # attempts with a changed value, oldest first
        self.reports = 0  # ctx.progress calls since the metrics were last flushed
        self.written = {"progress": 0, "running": 0}

    def note(self, d: Any, value: Progress) -> None:
        """The handler of attempt ``d`` reported ``value`` (any thread)."""
        with self._lock:
            p = d.progress
            if p is None:
                p = d.progress = AttemptProgress(self._clock())
            if p.ended:
                return  # a thread the handler left behind: its job has its outcome
            p.value = value
            p.changed = True
            self.reports += 1
            self._pending[d] = None

    def records(self, running: Iterable[Any], *, at_ms: int) -> list[OutcomeRecord]:
        """The outcome records to add to the batch being cut (loop thread), for the
        attempts running now (``running``) and those that reported progress.
        ``at_ms``: the outcomes' time (the broker's clock as the worker knows it)."""
        out: list[OutcomeRecord] = []
        now_ms = self._clock()
        with self._lock:
            if self._running_after > 0:
                self._announce(running, at_ms, now_ms, out)
            if self._pending:
                self._progress(at_ms, now_ms, out)
        return out

    def _announce(self, running: Iterable[Any], at_ms: int, now_ms: float, out: list[Any]) -> None:
        for d in running:
            p = d.progress
            if p is None:
                d.progress = AttemptProgress(now_ms)
            elif not p.announced and not p.ended and now_ms - p.seen_ms >= self._running_after:
                if p.changed:
                    continue  # its progress outcome says it runs
                if not self._budget.take(now_ms):
                    return
                p.announced = True
                p.sent_ms = now_ms  # one started outcome per attempt per interval
                out.append(self._record(d, at_ms, None))
                self.written["running"] += 1

    def _progress(self, at_ms: int, now_ms: float, out: list[Any]) -> None:
        pending = self._pending
        for d in list(pending):
            p = d.progress
            if p.ended or not p.changed or d.feed.gone:
                del pending[d]
                continue
            if now_ms - p.sent_ms < self._interval:
                continue
            if not self._budget.take(now_ms):
                return  # the rest wait, each with its newest value
            p.changed = False
            p.sent_ms = now_ms
            p.announced = True
            del pending[d]
            out.append(self._record(d, at_ms, p.value))
            self.written["progress"] += 1

    def _record(self, d: Any, at_ms: int, value: Progress | None) -> OutcomeRecord:
        job_id, task, key = identity(d)
        fields: dict[str, Any] = {
            "job_id": job_id,
            "queue": self._queue,
            "task": task,
            "idempotency_key": key,
            "state": "started",
            "attempt": d.attempt,
            "at_ms": at_ms,
            "worker": self._worker,
            "trace_id": trace_id(d),
        }
        if value is None:
            value_bytes = encode_outcome(**fields)
            return (d.feed, self._topic, -1, job_id.encode(), value_bytes, OUTCOME_HEADERS)
        encoded = encode_outcome_v3(progress=value.fraction, progress_detail=value.detail, **fields)
        return (d.feed, self._topic, -1, job_id.encode(), encoded, OUTCOME_V3_HEADERS)

    def take_counts(self) -> tuple[int, dict[str, int]]:
        """Reports and written outcomes since the last call (for the metrics)."""
        with self._lock:
            reports, written = self.reports, self.written
            self.reports, self.written = 0, {"progress": 0, "running": 0}
        return reports, written
