"""The status view: a faust-streaming app over the outcomes topic.

:class:`StatusView` builds the faust app from settings (there is no
module-level app). It consumes ``<prefix>.outcomes`` (Avro values, keyed by
job id) into one changelog-backed table, ``jobs``: job id -> the job's view
(``state.apply_outcome``), kept in a SQLite file (:mod:`.job_store`).

The per-queue counts by state (``GET /queues``, the overview) are derived from
the job views, never stored on their own (:mod:`.queue_counts`): after each
recovery the view counts its active partitions' rows in the file (a covering
index, about 0.3 s per million jobs) and the views staged over them, and
the fold then changes the counts with each view it changes. So after any crash
the counts say what the job views say. They are kept in memory rather than
computed per request because a request must not scan every job (the page
polls every second).

Outcomes are folded in batches: faust's consumer hands the records of the
outcomes topic to :meth:`StatusView.fold_messages` a fetched list at a time
(at most :data:`FOLD_BATCH`; ``faust_transport.hand_over_batches``), not
through faust's channel and stream per record. A batch reads the previous
views of its jobs in one query, changes its copy of each job's view, then
writes one changelog record per key it changed, with the key's last value (a
job's outcomes that arrive together, one worker transaction, cost one write a
batch instead of one each), through a librdkafka producer
(:mod:`.changelog_writer`). The batch waits until the changelog has stored
those records, writes their rows in one transaction, and only then does the
consumer acknowledge the batch's outcomes, so a committed offset never runs
ahead of the changelog. A job's new view is answered as soon as its batch is
folded, before its record is stored.

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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
import orjson

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import Settings
from dueflow.consumers.quarantine import Quarantine
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.kafka.topics import TopicSpec, names
from dueflow.observability.health import Health
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.outcome_checks import check_outcome
from dueflow.records.outcome_decoder import decode_outcome
from dueflow.rules import job_state as state
from dueflow.rules.job_status import scheduled_content_hash
from dueflow.streams.status import faust_transport
from dueflow.streams.status.access import (
    StatusAccess,
    page_banner,
    require_token_beyond_loopback,
)
from dueflow.streams.status.changelog_load import load_changelog
from dueflow.streams.status.changelog_writer import ChangelogWriter
from dueflow.streams.status.cluster_reader import ClusterReader
from dueflow.streams.status.cluster_refresh import ClusterRefresh
from dueflow.streams.status.console_access import Sessions
from dueflow.streams.status.console_source import StatusConsole
from dueflow.streams.status.credentials import faust_broker_options
from dueflow.streams.status.job_file import JobFile, MemoryJobFile
from dueflow.streams.status.job_store import JobStore, Staged
from dueflow.streams.status.operator_tools import OperatorTools
from dueflow.streams.status.queue_counts import QueueCounts
from dueflow.streams.status.queue_watch import ENDED, QueueWatch
from dueflow.streams.status.status_reads import RECENT_JOBS, StatusReads
from dueflow.streams.status.status_topics import internal_topics, prepare_topics
from dueflow.streams.status.tls import server_context
from dueflow.streams.status.web import WebServer, build_web_app
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.status")

FOLD_BATCH = 2000  # outcomes folded before the batch's table changes are written
FOLD_WITHIN_S = 0.05  # ... or after this long (the page polls every second)
SWEEP_INTERVAL_S = 60.0
SWEEP_PAGE = 1000  # finished jobs read per step of the sweep (it yields in between)
SAVE_INTERVAL_S = 0.5  # acknowledged views are written to the job file at least this often
RECOVERY_BATCH = 10_000  # changelog records per job-file transaction at recovery
HEARTBEAT_S = 0.5  # the loop's heartbeat (/livez)


@dataclass(slots=True)
class Changed:
    """Jobs changed by a batch of outcomes, each with its changelog partition (the
    partition of the outcomes that changed it) and its view now."""

    jobs: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    # The batch's changes to the metrics (written once a batch, not once an outcome).
    outcomes: dict[str, int] = field(default_factory=dict)  # outcome state -> n
    jobs_by_state: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state)


class JobsTable(faust.Table[str, bytes]):
    """The ``jobs`` table, stored by a :class:`JobStore` made by ``make_store``."""

    def __init__(self, app: Any, *, make_store: Callable[[Any], JobStore], **kw: Any) -> None:
        self._make_store = make_store
        super().__init__(app, **kw)

    def _new_store(self) -> JobStore:
        return self._make_store(self)


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
        # Undecodable outcomes are set aside (the producer is made on first use).
        self.quarantine: Quarantine | None = Quarantine(settings, metrics, component="status_view")
        # The fold's changelog records (:mod:`.changelog_writer`; the producer is made
        # on first use).
        self.changelog = ChangelogWriter(settings, self.changelog_topic)
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
        # Keys and values are JSON; the jobs' values are sent as bytes made by orjson.
        obs = s.observability
        self.jobs = JobsTable(
            app,
            name="jobs",
            default=None,
            partitions=s.outcomes_partitions,
            help="job id -> the job's current view",
            value_type=bytes,
            recovery_buffer_size=RECOVERY_BATCH,
            beacon=app.tables.beacon,
            make_store=lambda table: JobStore(
                "sqlite://",
                app,
                table,
                table_name=table.name,
                loop=table.loop,
                file=(
                    MemoryJobFile(self.job_file_path)
                    if obs.status_store == "memory"
                    else JobFile(self.job_file_path, cache_mib=obs.status_cache_mib)
                ),
                hot_jobs=obs.status_hot_jobs,
                on_restored=self.metrics.status_restored.inc,
                preload=functools.partial(
                    load_changelog, s, self.changelog_topic, s.outcomes_partitions
                ),
                drain=lambda: self.changelog.stored(),
                on_recovered=self.recount,
            ),
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
            app, self._names.outcomes, self.fold_messages, max_records=FOLD_BATCH
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
            await self.fold_messages([ev.message for ev in events])

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

    async def _save(self) -> None:
        """Write acknowledged views to the job file when no batch comes to do it."""
        self.store.flush()

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
                    topic=self._names.outcomes,
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
        self.reads.recent.append(job_id)
        outcomes = changed.outcomes
        outcomes[outcome["state"]] = outcomes.get(outcome["state"], 0) + 1
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
        removed = await self.sweep(now_ms=now, retention_ms=retention, partitions=actives)
        if removed:
            event(log, "status.swept", removed=removed, retention_ms=retention)

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
            if self.quarantine is not None:
                self.quarantine.close()


def _header_pairs(headers: Any) -> list[tuple[str, bytes | None]]:
    """faust gives headers as a mapping or a list of pairs; normalise to pairs."""
    if not headers:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return [(k, v) for k, v in headers]
