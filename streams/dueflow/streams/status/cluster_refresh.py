"""The status view's cluster view (lag, DLQ depth, pending timers, the active
emitter), re-read from Kafka on a timer by a background thread: requests never wait
for Kafka. A reader whose group calls keep timing out while the broker answers is
given up and the next read starts fresh clients."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from dueflow.config import Settings
from dueflow.kafka.cluster_view import ClusterView, compute_view
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.cluster_reader import ClusterReader, broker_unreachable
from dueflow.streams.status.queue_watch import QueueWatch

log = logging.getLogger("dueflow.status")

CLUSTER_STALE_S = 10.0  # /readyz: a cluster read at least this recent
# Errors of a cluster read after which the reader's clients are made anew.
_RETIRED_READERS = 8  # readers given up on (left open, see ClusterRefresh.read) at most


def reader_stuck(errors: Sequence[str]) -> bool:
    """A cluster read whose group-coordinator calls timed out while the broker answered
    the metadata and offsets requests (pure): the reader's clients are stuck."""
    group_timeouts = any(
        e.startswith(("committed offsets of group", "emitter group")) and "_TIMED_OUT" in e
        for e in errors
    )
    return group_timeouts and not broker_unreachable(list(errors))


class ClusterRefresh:
    """The newest cluster view of ``settings``' cluster (``view``), its metrics, and
    the emitter leaders ``watch`` has seen."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        watch: QueueWatch,
        *,
        clock: Callable[[], int],
        reader_factory: Callable[[Settings], ClusterReader],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.watch = watch
        self._clock = clock
        self._reader_factory = reader_factory
        self.view: ClusterView | None = None
        self.read_at: float | None = None  # monotonic time of the last good read
        self.error: str | None = None
        self._reader: ClusterReader | None = None
        self._retired: list[ClusterReader] = []

    def problem(self) -> str | None:
        """Why the cluster view does not count as current (None: it does)."""
        if self.error is not None:
            return f"reading the cluster failed: {self.error}"
        refresh_s = self.settings.observability.cluster_refresh_ms / 1000.0
        at = self.read_at
        age = None if at is None else time.monotonic() - at
        if age is None or age > max(3 * refresh_s, CLUSTER_STALE_S):
            return "no recent read of the cluster (is the broker reachable?)"
        return None

    async def refresh(self) -> None:
        """Read the cluster on a thread; a failed read is counted and logged, never raised."""
        loop = asyncio.get_running_loop()
        try:
            view = await loop.run_in_executor(None, self.read)
        except Exception as exc:  # a read must never stop the view
            self.error = repr(exc)
            self.metrics.cluster_reads.labels("error").inc()
            event(log, "status.cluster_read_failed", logging.WARNING, error=repr(exc))
            return
        self.view = view
        holder = view.active_emitter
        self.watch.leader_seen(None if holder is None else holder.client_id, at_ms=self._clock())
        self.metrics.cluster_reads.labels("error" if view.errors else "ok").inc()
        if view.errors:
            self.error = "; ".join(str(e) for e in view.errors)[:300]
        else:
            self.error = None
            self.read_at = time.monotonic()
        for q, depth in view.dlq_depth.items():
            self.metrics.dlq_depth.labels(q).set(depth)
        for level, n in view.timers_pending.items():
            self.metrics.timers_pending.labels(level).set(n)
        for row in view.lag:
            self.metrics.consumer_lag.labels(row.group, row.topic, str(row.partition)).set(row.lag)

    def read(self) -> ClusterView:
        """One read of the cluster (blocking)."""
        if self._reader is None:
            self._reader = self._reader_factory(self.settings).start()
        view = compute_view(self._reader.read(), self.settings)
        if reader_stuck(view.errors) and len(self._retired) < _RETIRED_READERS:
            # After a broker restart the reader's admin client can go on timing out
            # on the group coordinator for minutes while the broker answers
            # everything else: the next read starts fresh clients. The old ones
            # are left open: librdkafka aborts the process when an admin client
            # is destroyed with a coordinator request still pending
            # (rd_kafka_enq_once_del_source_return, seen on a restarted broker).
            event(log, "status.cluster_reader_renewed", logging.WARNING, errors=view.errors)
            self._retired.append(self._reader)
            self._reader = None
        return view

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
