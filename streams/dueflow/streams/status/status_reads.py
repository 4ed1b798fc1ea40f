"""What the status view's HTTP pages and ``Scheduler.status`` read
(:class:`~dueflow.streams.status.web.StatusSource`): a job's view (or its next change,
:mod:`.job_waiters`), the queues' counts by state with lag and DLQ depth, the newest
jobs, the cluster view, and which cluster and topics the view reads."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from dueflow.config import Settings
from dueflow.kafka.cluster_view import ClusterView
from dueflow.streams.status.job_store import JobStore
from dueflow.streams.status.job_waiters import JobWaiters
from dueflow.streams.status.queue_counts import QueueCounts

RECENT_JOBS = 200
_NOT_IN_LISTS = frozenset({"history", "result"})


class StatusReads:
    """The reads of one status view: ``store`` and ``cluster`` give its job store and
    newest cluster view, ``counts`` its counts by queue and state."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], int],
        store: Callable[[], JobStore],
        counts: QueueCounts,
        cluster: Callable[[], ClusterView | None],
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._store = store
        self._counts = counts
        self._cluster = cluster
        self.recent: deque[str] = deque(maxlen=RECENT_JOBS)  # job ids, newest changed last
        self.waiters = JobWaiters(self.job)  # GET /jobs/{id}?wait_ms=
        self.cluster_id: str | None = None  # the Kafka cluster's id, once read

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self._store().view(job_id)

    async def wait_job(self, job_id: str, *, until: str, timeout_s: float) -> dict[str, Any] | None:
        """``job_id``'s view once it is final or once it changes (``until``), else after
        ``timeout_s`` as it is then (:meth:`.JobWaiters.wait`)."""
        return await self.waiters.wait(job_id, until=until, timeout_s=timeout_s)

    def identity(self) -> dict[str, str]:
        """Which cluster and topics this view reads (HTTP headers of job answers: a
        client checks it asks the view of its own cluster)."""
        out = {"Dueflow-Topic-Prefix": self.settings.topic_prefix}
        if self.cluster_id:
            out["Dueflow-Cluster-Id"] = self.cluster_id
        return out

    def queue_names(self) -> list[str]:
        return self.settings.queue_names

    def queues(self) -> dict[str, Any]:
        counts = self._counts.totals()
        cluster = self._cluster()
        out = {}
        for q in self.settings.queue_names:
            by_state = counts.get(q, {})
            out[q] = {
                "counts": by_state,
                "total": sum(by_state.values()),
                "lag": None if cluster is None else cluster.lag_by_queue.get(q),
                "dlq_depth": None if cluster is None else cluster.dlq_depth.get(q),
                "paused": None if cluster is None else cluster.paused.get(q),
            }
        return {"queues": out, "updated_ms": self._clock()}

    def recent_jobs(self, limit: int = 50) -> list[dict[str, Any]]:
        seen: set[str] = set()
        out = []
        store = self._store()
        for job_id in reversed(self.recent):
            if job_id in seen:
                continue
            seen.add(job_id)
            view = store.view(job_id)
            if view is not None:
                # (a result may be large: /jobs/{id} has it)
                out.append({k: v for k, v in view.items() if k not in _NOT_IN_LISTS})
            if len(out) >= limit:
                break
        return out

    def cluster(self) -> dict[str, Any] | None:
        view = self._cluster()
        return None if view is None else view.to_json()

    def overview(self) -> dict[str, Any]:
        recent = self.recent_jobs()
        cluster = self.cluster()
        return {
            "queues": self.queues()["queues"],
            "recent_jobs": recent,
            "recent_failures": [j for j in recent if j.get("last_error")][:20],
            "cluster": cluster,
            "updated_ms": self._clock(),
        }
