"""The status view: a faust-streaming app over the outcomes topic.

:class:`StatusView` builds the faust app from settings (there is no
module-level app). It consumes ``<prefix>.outcomes`` (Avro values, keyed by
job id) into two changelog-backed tables:

- ``jobs``: job id -> the job's view (``state.apply_outcome``);
- ``queue-counts``: ``queue@partition`` -> ``{state: count}``, changed by the
  same event that changes the job, so both tables restore consistently. The
  counts are kept in a table rather than computed per request because a
  request must not scan every job (the page polls every second); they are
  keyed per source partition because faust writes a change to the changelog
  partition of the event that caused it (see ``state.counts_key``).

Outcomes are folded in batches (``take_events``, at most
:data:`FOLD_BATCH` outcomes or :data:`FOLD_WITHIN_S`): each changes the
tables' data in memory, and the batch then writes one changelog record per key
it changed, with the key's last value. A job's outcomes that arrive together
(one worker transaction), and the counts of a queue, which every outcome
changes, cost one write a batch instead of one each. faust acks a batch's
events only after the batch is written, and flushes its producer before it
commits offsets, so a committed offset never runs ahead of the changelog.

Both tables use faust's memory store: on start they are rebuilt from their
changelog topics (``<app id>-jobs-changelog``, compacted) before the HTTP
server opens, so the view survives restarts; the data dir only holds faust's
bookkeeping. The app runs ``at_least_once`` (a replayed outcome folds to the
same view) with a read_committed consumer (``faust_transport``): outcomes
written inside aborted emitter or worker transactions are never shown.
faust's own ``exactly_once`` mode crashes on the first table change, see
``faust_transport``.

Finished jobs leave the table ``status_retention_ms`` after their last change
(a sweep every minute, or every half retention if shorter; the removal is a
tombstone in the changelog), so memory is bounded by the jobs of that window.
A background thread re-reads the cluster view (lag, DLQ, timers, emitter)
every ``cluster_refresh_ms``; requests never wait for Kafka.

State-changing HTTP calls need the view's token (:mod:`.access`): the
configured ``observability.status_token``, or one made at start and printed
once to stderr inside the page URL (``/?token=...``), as Jupyter does. The
view refuses to start bound beyond loopback without a configured token.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import secrets
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.apps.ops.redrive import Redriver
from dueflow.config import Settings
from dueflow.consumers.quarantine import Quarantine
from dueflow.errors import TopicMismatch, UndecodableRecord
from dueflow.kafka.clients import make_admin
from dueflow.kafka.cluster_view import ClusterView, compute_view
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import TopicSpec, names, topic_layout
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.rules import job_state as state
from dueflow.streams.status import faust_transport
from dueflow.streams.status.access import StatusAccess, require_token_beyond_loopback
from dueflow.streams.status.cluster_reader import ClusterReader
from dueflow.streams.status.credentials import faust_broker_options
from dueflow.streams.status.web import WebServer, build_web_app
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.status")

RECENT_JOBS = 200
FOLD_BATCH = 2000  # outcomes folded before the batch's table changes are written
FOLD_WITHIN_S = 0.05  # ... or after this long (the page polls every second)
REDRIVE_RATE = 50.0  # records per second from the redrive button
SWEEP_INTERVAL_S = 60.0


@dataclass(slots=True)
class Changed:
    """Table keys changed by a batch of outcomes, each with its changelog partition
    (the partition of the outcomes that changed it)."""

    jobs: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


class StatusView:
    """The faust app, its tables and its HTTP server, built from ``settings``."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics,
        port: int | None = None,
        data_dir: str | Path | None = None,
        app_id: str | None = None,
        clock: Callable[[], int] = wall_ms,
        reader_factory: Callable[[Settings], ClusterReader] = ClusterReader,
    ) -> None:
        obs = settings.observability
        require_token_beyond_loopback(settings)  # before anything connects or binds
        self.access = StatusAccess(
            token=obs.status_token or secrets.token_urlsafe(32),
            allowed_hosts=obs.status_allowed_hosts,
            generated=obs.status_token is None,
        )
        self.settings = settings
        self.metrics = metrics
        self.port = obs.status_port if port is None else port
        self.data_dir = Path(data_dir or obs.status_data_dir)
        self._clock = clock
        self._reader_factory = reader_factory
        self._names = names(settings)
        self._recent: deque[str] = deque(maxlen=RECENT_JOBS)
        self._cluster: ClusterView | None = None
        self._server: WebServer | None = None
        self._reader: ClusterReader | None = None
        self.app_id = app_id or f"{settings.topic_prefix}.status"
        # Undecodable outcomes are set aside (the producer is made on first use).
        self.quarantine: Quarantine | None = Quarantine(settings, metrics, component="status_view")
        self.app = self._build_app()

    # ------------------------------------------------------------------- faust
    def _build_app(self) -> Any:
        s = self.settings
        app = faust.App(
            self.app_id,
            **faust_broker_options(s),
            store="memory://",
            datadir=str(self.data_dir),
            processing_guarantee="at_least_once",
            web_enabled=False,
            autodiscover=False,
            topic_replication_factor=s.replication_factor,
            topic_partitions=s.outcomes_partitions,
            consumer_auto_offset_reset="earliest",
            broker_client_id=self.app_id,
        )
        faust_transport.install(app)  # read_committed, before anything touches the transport
        # Keys and values are JSON (faust's default when no type is given).
        self.jobs = app.Table(
            "jobs",
            default=None,
            partitions=s.outcomes_partitions,
            help="job id -> the job's current view",
        )
        self.counts = app.Table(
            "queue-counts",
            default=None,
            partitions=s.outcomes_partitions,
            help="queue@partition -> {state: count}",
        )
        topic = app.topic(
            self._names.outcomes,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        app.agent(topic, name="dueflow-status-outcomes")(self._consume)
        app.task(self._serve)
        sweep_s = max(0.5, min(SWEEP_INTERVAL_S, s.observability.status_retention_ms / 2000))
        app.timer(sweep_s, name="dueflow-status-sweep")(self._sweep)
        app.timer(s.observability.cluster_refresh_ms / 1000.0, name="dueflow-status-cluster")(
            self._refresh_cluster
        )
        return app

    async def _consume(self, stream: Any) -> None:
        async for events in stream.take_events(FOLD_BATCH, FOLD_WITHIN_S):
            changed = Changed()
            for ev in events:
                self.apply_event(
                    ev.message.partition,
                    ev.message.offset,
                    ev.headers,
                    ev.value,
                    changed,
                    key=ev.key,
                )
            self.write_changed(changed)

    def write_changed(self, changed: Changed) -> None:
        """One changelog record per table key a batch changed: its value now."""
        jobs, counts = self.jobs, self.counts
        for job_id, p in changed.jobs.items():
            jobs.send_changelog(p, job_id, jobs.data[job_id])
        for key, p in changed.counts.items():
            counts.send_changelog(p, key, counts.data[key])

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
        """Fold one outcome record into the tables' data; ``changed`` collects the keys
        whose changelog records :meth:`write_changed` then writes."""
        try:
            raw = hdr.header(_header_pairs(headers), hdr.SCHEMA)
            version = codec.parse_schema_header(raw, expected="outcome")
            outcome = codec.decode("outcome", value or b"", writer_version=version)
        except UndecodableRecord as exc:
            self.metrics.skipped.labels("status_view", "undecodable").inc()
            if self.quarantine is not None:
                self.quarantine.put_raw(
                    topic=self._names.outcomes,
                    partition=partition,
                    offset=offset,
                    key=key if isinstance(key, bytes) else None,
                    value=value if isinstance(value, bytes) else None,
                    headers=_header_pairs(headers),
                    reason=reasons.with_detail(reasons.UNDECODABLE_OUTCOME, exc),
                )
            self._log_skipped(partition, offset, str(exc))
            return None
        job_id = outcome["job_id"]
        prev = self.jobs.data.get(job_id)
        try:
            view = state.apply_outcome(prev, outcome, partition=partition)
        except (KeyError, TypeError, ValueError) as exc:  # a record the fold cannot use
            self.metrics.skipped.labels("status_view", "unusable").inc()
            self._log_skipped(partition, offset, repr(exc))
            return None
        # Table writes are not guarded: a broken table must stop the view, not lose data.
        self.jobs.data[job_id] = view
        changed.jobs[job_id] = partition
        self._count(prev, view, partition, changed)
        self._recent.append(job_id)
        self.metrics.status_outcomes.labels(outcome["state"]).inc()
        return view

    def _log_skipped(self, partition: int, offset: int, reason: str) -> None:
        """The warning for an outcome record the view skips."""
        event(
            log,
            "status.outcome_skipped",
            logging.WARNING,
            topic=self._names.outcomes,
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
        data = self.counts.data
        for queue in {q for q, _, _ in deltas}:
            key = state.counts_key(queue, partition)
            data[key] = state.apply_deltas(data.get(key), deltas, queue)
            changed.counts[key] = partition
        for queue, st, delta in deltas:
            self.metrics.status_jobs.labels(queue, st).inc(delta)

    async def _serve(self) -> None:
        """Open HTTP once tables are recovered (faust runs tasks after recovery)."""
        self._seed_after_recovery()
        obs = self.settings.observability
        server = WebServer(
            build_web_app(self, self.metrics, access=self.access, redrive_call=self.redrive),
            bind=obs.status_bind,
            port=self.port,
        )
        port = await server.start()
        self._server = server
        event(log, "status.serving", url=f"http://{obs.status_bind}:{port}")
        sys.stderr.write(page_banner(self.access, bind=obs.status_bind, port=port))
        sys.stderr.flush()
        try:
            await asyncio.Event().wait()  # until the app stops and cancels this task
        finally:
            await server.stop()

    def _seed_after_recovery(self) -> None:
        data = self.jobs.data
        newest = heapq.nlargest(RECENT_JOBS, data.items(), key=lambda kv: kv[1]["updated_ms"])
        for job_id, _ in reversed(newest):
            self._recent.append(job_id)
        for queue, counts in state.sum_counts(dict(self.counts.data.items())).items():
            for st, n in counts.items():
                self.metrics.status_jobs.labels(queue, st).set(n)

    async def _sweep(self) -> None:
        """Drop finished jobs older than the retention (tombstones in the changelog)."""
        retention = self.settings.observability.status_retention_ms
        now = self._clock()
        actives = {
            tp.partition
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self._names.outcomes
        }
        removed = 0
        changed = Changed()  # counts only: removed jobs are tombstones
        for i, (job_id, view) in enumerate(list(self.jobs.data.items())):
            if i % 1000 == 999:
                self.write_changed(changed)  # before yielding: the stream may write too
                changed = Changed()
                await asyncio.sleep(0)  # let requests and the stream run
            p = int(view["partition"])
            if p not in actives or not state.expired(view, now_ms=now, retention_ms=retention):
                continue
            if self.jobs.data.get(job_id) is not view:
                continue  # changed while we yielded
            del self.jobs.data[job_id]
            self.jobs.send_changelog(p, job_id, None, value_serializer="raw")
            self._count(view, None, p, changed)
            removed += 1
        self.write_changed(changed)
        if removed:
            event(log, "status.swept", removed=removed, retention_ms=retention)

    async def _refresh_cluster(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            view = await loop.run_in_executor(None, self._read_cluster)
        except Exception as exc:  # a read must never stop the view
            self.metrics.cluster_reads.labels("error").inc()
            event(log, "status.cluster_read_failed", logging.WARNING, error=repr(exc))
            return
        self._cluster = view
        self.metrics.cluster_reads.labels("error" if view.errors else "ok").inc()
        for q, depth in view.dlq_depth.items():
            self.metrics.dlq_depth.labels(q).set(depth)
        for level, n in view.timers_pending.items():
            self.metrics.timers_pending.labels(level).set(n)
        for row in view.lag:
            self.metrics.consumer_lag.labels(row.group, row.topic, str(row.partition)).set(row.lag)

    def _read_cluster(self) -> ClusterView:
        if self._reader is None:
            self._reader = self._reader_factory(self.settings).start()
        return compute_view(self._reader.read(), self.settings)

    def redrive(self, queue: str, limit: int, by: str) -> dict[str, Any]:
        """The redrive button: at most ``limit`` dead letters of ``queue``, at a bounded
        rate, idempotent (blocking; the HTTP layer runs it on a thread)."""
        report = Redriver(self.settings, by=by, rate_per_s=REDRIVE_RATE).run(queue, limit=limit)
        out = report.to_json()
        out["items"] = out["items"][:50]
        out["message"] = f"{report.redriven} redriven, {report.skipped} not redriven"
        if report.error:
            out["message"] += f"; stopped early: {report.error}"
        return out

    # ------------------------------------------------------- StatusSource (HTTP)
    def job(self, job_id: str) -> dict[str, Any] | None:
        view = self.jobs.get(job_id)
        return None if view is None else dict(view)

    def queue_names(self) -> list[str]:
        return self.settings.queue_names

    def queues(self) -> dict[str, Any]:
        counts = state.sum_counts(dict(self.counts.data.items()))
        cluster = self._cluster
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
        for job_id in reversed(self._recent):
            if job_id in seen:
                continue
            seen.add(job_id)
            view = self.jobs.get(job_id)
            if view is not None:
                out.append({k: v for k, v in view.items() if k != "history"})
            if len(out) >= limit:
                break
        return out

    def cluster(self) -> dict[str, Any] | None:
        return None if self._cluster is None else self._cluster.to_json()

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

    # --------------------------------------------------------------- lifecycle
    def internal_topics(self) -> list[TopicSpec]:
        """The faust app's own topics: table changelogs (compacted) and its leader topic."""
        s = self.settings
        isr = {"min.insync.replicas": str(s.min_insync_replicas)}
        compact = {"cleanup.policy": "compact", **isr}
        return [
            TopicSpec(f"{self.app_id}-jobs-changelog", "status", s.outcomes_partitions, compact),
            TopicSpec(
                f"{self.app_id}-queue-counts-changelog", "status", s.outcomes_partitions, compact
            ),
            TopicSpec(
                f"{self.app_id}-__assignor-__leader",
                "status",
                1,
                {"cleanup.policy": "delete", **isr},
            ),
        ]

    def prepare_topics(self) -> None:
        """Check the outcomes topic and create the app's own topics before faust starts.

        faust would create its changelog topics itself, but on a first start its
        consumer joins the group before it sees them, and the tables then fail
        with a partition-count mismatch until the next rebalance.
        """
        s = self.settings
        admin = TopicAdmin(make_admin(s), replication_factor=s.replication_factor)
        (outcomes,) = [t for t in topic_layout(s) if t.role == "outcomes"]
        (found,) = admin.describe([outcomes])
        if found.partitions is None:
            raise TopicMismatch(
                f"topic {outcomes.name} does not exist: run `dueflow topics ensure` first"
            )
        if found.partitions != outcomes.partitions:
            raise TopicMismatch(
                f"topic {outcomes.name} has {found.partitions} partitions but the settings say "
                f"outcomes_partitions = {outcomes.partitions}: the status view's tables must "
                "match the topic; fix the setting"
            )
        report = admin.ensure(self.internal_topics())
        if not report.ok:
            raise TopicMismatch("; ".join(str(d) for d in report.differences))
        # Wait until the new topics show in metadata with leaders: faust's consumer
        # must see them when it joins, or its tables fail until the next rebalance.
        for state_ in admin.describe(self.internal_topics(), must_exist=True):
            if state_.partitions is None:
                raise TopicMismatch(f"topic {state_.name} did not appear in the cluster metadata")

    def run(self, *, loglevel: str = "warning") -> None:
        """Run the app until SIGTERM/SIGINT (blocks; exits the process)."""
        from faust.worker import Worker

        self.prepare_topics()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        worker = Worker(self.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
        worker.spinner = None  # no terminal progress spinner in logs
        try:
            worker.execute_from_commandline()
        finally:
            if self._reader is not None:
                self._reader.close()
            if self.quarantine is not None:
                self.quarantine.close()


def page_banner(access: StatusAccess, *, bind: str, port: int) -> str:
    """What the view prints once at start: the page URL, with the token when it was
    generated (never a configured one: its owner has it, and logs keep stderr)."""
    host = "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{port}/"
    if access.generated:
        return (
            f"dueflow status view: open {url}?token={access.token}\n"
            "  (a token made for this run: the redrive button and every other "
            "state-changing call need it; set observability.status_token or "
            "DUEFLOW_OBSERVABILITY_STATUS_TOKEN to choose one)\n"
        )
    return (
        f"dueflow status view: open {url}?token=<observability.status_token>\n"
        "  (state-changing calls need that token; read-only pages need none)\n"
    )


def _header_pairs(headers: Any) -> list[tuple[str, bytes | None]]:
    """faust gives headers as a mapping or a list of pairs; normalise to pairs."""
    if not headers:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return [(k, v) for k, v in headers]
