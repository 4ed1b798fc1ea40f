"""The status view: a faust-streaming app over the outcomes topic.

:class:`StatusView` builds the faust app from settings (there is no
module-level app). It consumes ``<prefix>.outcomes`` (Avro values, keyed by
job id) into one changelog-backed table, ``jobs``: job id -> the job's view
(``state.apply_outcome``), kept in a SQLite file (:mod:`.job_store`). The
per-queue counts by state (``GET /queues``, the overview) are derived from the
job views and kept in memory (:mod:`.queue_counts`).

faust's consumer hands the records of the outcomes topic to the fold
(:mod:`.outcome_fold`) a fetched list at a time (at most :data:`FOLD_BATCH`;
``faust_transport.hand_over_batches``), not through faust's channel and stream
per record. The fold writes each changed job's view to the table's changelog,
and the consumer acknowledges a batch's outcomes only once the changelog has
stored its records.

The jobs live in a SQLite file in the data dir (``<app id>.jobs.sqlite``,
:mod:`.job_store`) that holds what the changelog holds up to per-partition
offsets: a restart reads only the newer changelog records, and without the
file the table is made again from the whole changelog (compacted) before the
HTTP server opens. The app runs ``at_least_once`` (a replayed
outcome folds to the same view) with a read_committed consumer
(``faust_transport``): outcomes written inside aborted emitter or worker
transactions are never shown. faust's own ``exactly_once`` mode crashes on
the first table change, see ``faust_transport``.

Finished jobs leave the table ``status_retention_ms`` after their last change
(a sweep every minute, or every half retention if shorter, over an index of
finished jobs; the removal is a tombstone in the changelog); pending and
running jobs stay until they end. ``GET /jobs/{id}?wait_ms=`` waits for a
job's next change or its end (:mod:`.job_waiters`).
A background thread re-reads the cluster view (lag, DLQ, timers, emitter)
every ``cluster_refresh_ms``; requests never wait for Kafka (:mod:`.cluster_refresh`).
The operator console's reads and actions: :mod:`.console_source`; the actions are
the operator tools the application running the view hands it (:mod:`.operator_tools`).

State-changing HTTP calls need the view's token (:mod:`.access`): the
configured ``observability.status_token``, or one made at start and printed
once to stderr inside the page URL (``/?token=...``), as Jupyter does. The
view refuses to start bound beyond loopback without a configured token.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import faust

from dueflow.config import Settings
from dueflow.consumers.quarantine import Quarantine
from dueflow.kafka.topics import TopicSpec, names
from dueflow.observability.health import Health
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.streams.status import faust_transport
from dueflow.streams.status.access import (
    StatusAccess,
    page_banner,
    require_token_beyond_loopback,
)
from dueflow.streams.status.changelog_writer import ChangelogWriter
from dueflow.streams.status.cluster_reader import ClusterReader
from dueflow.streams.status.cluster_refresh import ClusterRefresh
from dueflow.streams.status.console_access import Sessions
from dueflow.streams.status.console_source import StatusConsole
from dueflow.streams.status.credentials import faust_broker_options
from dueflow.streams.status.job_store import JobStore
from dueflow.streams.status.jobs_table import jobs_table
from dueflow.streams.status.operator_tools import OperatorTools
from dueflow.streams.status.outcome_fold import Changed as Changed
from dueflow.streams.status.outcome_fold import OutcomeFold
from dueflow.streams.status.queue_counts import QueueCounts
from dueflow.streams.status.queue_watch import QueueWatch
from dueflow.streams.status.status_reads import RECENT_JOBS, StatusReads
from dueflow.streams.status.status_topics import internal_topics, prepare_topics
from dueflow.streams.status.tls import server_context
from dueflow.streams.status.web import WebServer, build_web_app
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.status")

FOLD_BATCH = 2000  # outcomes folded before the batch's table changes are written
FOLD_WITHIN_S = 0.05  # ... or after this long (the page polls every second)
SWEEP_INTERVAL_S = 60.0
SAVE_INTERVAL_S = 0.5  # acknowledged views are written to the job file at least this often
HEARTBEAT_S = 0.5  # the loop's heartbeat (/livez)


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
        health: Health | None = None,
        tools: OperatorTools | None = None,
    ) -> None:
        """``tools``: the operator tools behind the redrive button and the console's
        actions (None: the view takes no actions)."""
        obs = settings.observability
        # /livez: a timer on the app's loop beats; /readyz: tables recovered and
        # served, the cluster read from Kafka recently, no rebalance under way.
        self.health = health or Health(liveness_timeout_s=obs.liveness_timeout_s)
        require_token_beyond_loopback(settings)  # before anything connects or binds
        self.tls = server_context(obs)  # the files load now, or the view does not start
        self.access = StatusAccess(
            token=obs.status_token or secrets.token_urlsafe(32),
            allowed_hosts=obs.status_allowed_hosts,
            generated=obs.status_token is None,
        )
        self.sessions = Sessions(
            operator_token=self.access.token, viewer_token=obs.status_viewer_token
        )
        self.settings = settings
        self.metrics = metrics
        self.port = obs.status_port if port is None else port
        self.data_dir = Path(data_dir or obs.status_data_dir)
        self._clock = clock
        self._names = names(settings)
        self._server: WebServer | None = None
        self.tools = tools
        self.watch = QueueWatch()  # the console's last hour per queue
        self.cluster_refresh = ClusterRefresh(
            settings, metrics, self.watch, clock=clock, reader_factory=reader_factory
        )
        self.counts = QueueCounts()  # per queue and state, from the job views
        # What the HTTP pages read (the StatusSource of :mod:`.web`).
        self.reads = StatusReads(
            settings,
            clock=clock,
            store=lambda: self.store,
            counts=self.counts,
            cluster=lambda: self.cluster_refresh.view,
        )
        self.waiters = self.reads.waiters
        self.console = StatusConsole(
            settings,
            tools=tools,
            token=self.access.token,
            clock=clock,
            watch=self.watch,
            store=lambda: self.store,
            cluster=lambda: self.cluster_refresh.view,
            served_port=self._served_port,
        )
        self.app_id = app_id or f"{settings.topic_prefix}.status"
        # The fold's changelog records (:mod:`.changelog_writer`; the producer is made
        # on first use).
        self.changelog = ChangelogWriter(settings, self.changelog_topic)
        # Outcome records into job views, counts and changelog records (:mod:`.outcome_fold`).
        self.fold = OutcomeFold(
            outcomes_topic=self._names.outcomes,
            store=lambda: self.store,
            changelog=self.changelog,
            counts=self.counts,
            watch=self.watch,
            recent=self.reads.recent,
            waiters=self.waiters,
            metrics=metrics,
            # Undecodable outcomes are set aside (the producer is made on first use).
            quarantine=Quarantine(settings, metrics, component="status_view"),
        )
        self.app = self._build_app()
        self.health.add_check("status view", self.readiness)

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
        self.jobs = jobs_table(
            app,
            s,
            job_file_path=self.job_file_path,
            changelog_topic=self.changelog_topic,
            changelog=self.changelog,
            metrics=self.metrics,
            on_recovered=self.fold.recount,
        )
        app.tables.add(self.jobs)
        topic = app.topic(
            self._names.outcomes,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        app.agent(topic, name="dueflow-status-outcomes")(self._consume)
        faust_transport.hand_over_batches(
            app, self._names.outcomes, self.fold.fold_messages, max_records=FOLD_BATCH
        )
        app.task(self._serve)
        sweep_s = max(0.5, min(SWEEP_INTERVAL_S, s.observability.status_retention_ms / 2000))
        app.timer(sweep_s, name="dueflow-status-sweep")(self._sweep)
        app.timer(SAVE_INTERVAL_S, name="dueflow-status-save")(self._save)
        app.timer(s.observability.cluster_refresh_ms / 1000.0, name="dueflow-status-cluster")(
            self.cluster_refresh.refresh
        )
        app.timer(HEARTBEAT_S, name="dueflow-status-heartbeat")(self._beat)
        return app

    async def _beat(self) -> None:
        self.health.beat()
        self.health.publish(self.metrics.ready, self.metrics.loop_heartbeat)

    def readiness(self) -> str | None:
        """None while the tables are served, the last cluster read (recent) succeeded and
        no rebalance is under way; else why not (asked from the listener's thread)."""
        if self._server is None:
            return "recovering the tables from their changelogs"
        problem = self.cluster_refresh.problem()
        if problem is not None:
            return problem
        if getattr(self.app, "rebalancing", False):
            return "the consumer group is rebalancing"
        return None

    async def _consume(self, stream: Any) -> None:
        # The consumer hands the outcomes to fold_messages (hand_over_batches): this
        # stream only makes faust subscribe to them and assign their partitions.
        async for events in stream.take_events(FOLD_BATCH, FOLD_WITHIN_S):
            await self.fold.fold_messages([ev.message for ev in events])

    @property
    def changelog_topic(self) -> str:
        """The jobs table's changelog (faust's name for it)."""
        return f"{self.app_id}-jobs-changelog"

    @property
    def job_file_path(self) -> Path:
        """The SQLite file of the jobs table (:mod:`.job_store`)."""
        return self.data_dir / f"{self.app_id}.jobs.sqlite"

    @property
    def store(self) -> JobStore:
        return cast(JobStore, self.jobs.data)

    async def _save(self) -> None:
        """Write acknowledged views to the job file when no batch comes to do it."""
        self.store.flush()

    async def _serve(self) -> None:
        """Open HTTP once tables are recovered (faust runs tasks after recovery)."""
        self._seed_after_recovery()
        obs = self.settings.observability
        server = WebServer(
            build_web_app(
                self.reads,
                self.metrics,
                access=self.access,
                redrive_call=(
                    None
                    if self.tools is None
                    else functools.partial(self.tools.redrive, self.settings)
                ),
                health=self.health,
                console=self.console,
                sessions=self.sessions,
                tls=self.tls is not None,
            ),
            bind=obs.status_bind,
            port=self.port,
            ssl_context=self.tls,
        )
        port = await server.start()
        self._server = server
        scheme = "http" if self.tls is None else "https"
        event(log, "status.serving", url=f"{scheme}://{obs.status_bind}:{port}")
        sys.stderr.write(page_banner(self.access, bind=obs.status_bind, port=port, scheme=scheme))
        sys.stderr.flush()
        try:
            await asyncio.Event().wait()  # until the app stops and cancels this task
        finally:
            await server.stop()

    def _seed_after_recovery(self) -> None:
        for job_id in reversed(self.store.newest(RECENT_JOBS)):
            self.reads.recent.append(job_id)

    async def _sweep(self) -> None:
        """Drop finished jobs older than the retention (tombstones in the changelog),
        oldest first, from the job file's index of finished jobs."""
        retention = self.settings.observability.status_retention_ms
        now = self._clock()
        actives = {
            tp.partition
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self._names.outcomes
        }
        removed = await self.fold.sweep(now_ms=now, retention_ms=retention, partitions=actives)
        if removed:
            event(log, "status.swept", removed=removed, retention_ms=retention)

    def _served_port(self) -> int | None:
        """The port the HTTP server listens on (None until it serves)."""
        return None if self._server is None else (self._server.port or self.port)

    # --------------------------------------------------------------- lifecycle
    def internal_topics(self) -> list[TopicSpec]:
        """The faust app's own topics (:func:`.status_topics.internal_topics`)."""
        return internal_topics(
            self.settings, app_id=self.app_id, changelog_topic=self.changelog_topic
        )

    def prepare_topics(self) -> None:
        """Check the outcomes topic and create the app's own topics before faust starts
        (:func:`.status_topics.prepare_topics`)."""
        self.reads.cluster_id = prepare_topics(self.settings, self.internal_topics())

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
            self.changelog.close()
            self.cluster_refresh.close()
            self.console.close()
            if self.fold.quarantine is not None:
                self.fold.quarantine.close()
