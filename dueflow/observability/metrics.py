"""Prometheus metrics of every dueflow process.

One :class:`Metrics` object per process (or per test), built on a registry
passed in: no module-level collectors. Components receive it through their
constructor. Names follow Prometheus conventions: ``dueflow_*``, base units,
``_total`` for counters, ``_seconds`` for time.

For ``dueflow worker --processes N`` call :func:`enable_multiprocess` in the
parent before the children start and before any :class:`Metrics` is built
(it sets ``PROMETHEUS_MULTIPROC_DIR``), call :func:`process_exited` when a
child ends, and :func:`serve` then serves one merged view
(:mod:`.multiprocess_metrics`). Batched histogram observations:
:mod:`.histogram_batches`.
"""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase

from dueflow.observability.endpoint import HealthSource, start_listener
from dueflow.observability.histogram_batches import observe_ages, observe_many
from dueflow.observability.multiprocess_metrics import (
    enable_multiprocess,
    merged_registry,
    merged_samples,
    multiprocess_enabled,
    process_exited,
)

__all__ = [
    "DURATION_BUCKETS",
    "LATENESS_BUCKETS",
    "MetricFamily",
    "Metrics",
    "enable_multiprocess",
    "exposition_registry",
    "merged_samples",
    "observe_ages",
    "observe_many",
    "process_exited",
    "render",
    "serve",
]

# Fire lateness and job durations span milliseconds to minutes.
LATENESS_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class Metrics:
    """Every collector dueflow exports, registered on ``registry``, declared per
    component (the ``_declare_*`` methods, in the order they are exposed)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._declare_scheduling(r)
        self._declare_firing(r)
        self._declare_emitter_leadership(r)
        self._declare_worker_jobs(r)
        self._declare_worker_process(r)
        self._declare_steering(r)
        self._declare_status_view(r)
        self._declare_every_process(r)

    def _declare_scheduling(self, r: CollectorRegistry) -> None:
        """The scheduling clients (producers)."""
        self.schedules_produced = Counter(
            "dueflow_schedules_produced_total",
            "Jobs written to the timer topic",
            ["queue"],
            registry=r,
        )
        self.schedule_errors = Counter(
            "dueflow_schedule_errors_total",
            "Jobs a client failed to write",
            ["queue"],
            registry=r,
        )

    def _declare_firing(self, r: CollectorRegistry) -> None:
        """The emitter: the wheel's timers and the jobs it fires."""
        self.timers_pending = Gauge(
            "dueflow_timers_pending",
            "Timers waiting in the wheel (high watermark minus committed offset)",
            ["level"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.fires = Counter(
            "dueflow_fires_total", "Jobs fired into exec topics", ["queue"], registry=r
        )
        self.fire_lateness = Histogram(
            "dueflow_fire_lateness_seconds",
            "When fired jobs became visible to workers (acknowledged, or their "
            "transaction committed) minus their due time",
            ["queue"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.cascaded = Counter(
            "dueflow_timers_cascaded_total",
            "Timers placed again one level down (or parked again)",
            ["level"],
            registry=r,
        )
        self.late_timers = Counter(
            "dueflow_timers_landed_late_total",
            "Timers read from a slot after their due time had passed the slot (fired late)",
            registry=r,
        )

    def _declare_emitter_leadership(self, r: CollectorRegistry) -> None:
        """The emitter: its leadership, commits, cron and clock."""
        self.emitter_leader = Gauge(
            "dueflow_emitter_leader",
            "1 while this process is the active emitter",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.emitter_failovers = Counter(
            "dueflow_emitter_failovers_total",
            "Times this process took over as active emitter",
            registry=r,
        )
        self.emitter_refires = Counter(
            "dueflow_emitter_refires_total",
            "Fires after a takeover of timers the previous active emitter may have fired "
            "already (due before the takeover; an upper bound of the duplicates it made: "
            "workers skip them, see dueflow_duplicates_skipped_total)",
            registry=r,
        )
        self.emitter_offset_commits = Counter(
            "dueflow_emitter_offset_commits_total",
            "Timer offset commits through the lease group by result (firing without transactions)",
            ["result"],
            registry=r,
        )
        self.emitter_restarts = Counter(
            "dueflow_emitter_restarts_total",
            "Times an active shard stopped and started over from its committed offsets, by "
            "reason: fenced, stalled, transaction aborted, error (a refused write, e.g. a "
            "record the broker refused as too large)",
            ["reason"],
            registry=r,
        )
        self.emitter_transactions = Counter(
            "dueflow_emitter_transactions_total",
            "Emitter transactions by result",
            ["result"],
            registry=r,
        )
        self.emitter_commit = Histogram(
            "dueflow_emitter_commit_seconds",
            "How long the emitter's commits took: without transactions, the timer offsets "
            "from sealed to accepted (fired jobs are visible before); with transactions, "
            "handed over to committed (fired jobs become visible only then)",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.cron_occurrences = Counter(
            "dueflow_cron_occurrences_total",
            "Cron occurrences by what happened to them",
            ["result"],
            registry=r,
        )
        self.clock_offset = Gauge(
            "dueflow_clock_offset_seconds",
            "Local clock minus broker clock, from broker append timestamps",
            registry=r,
            multiprocess_mode="livemax",
        )

    def _declare_worker_jobs(self, r: CollectorRegistry) -> None:
        """Workers: job attempts and where they went."""
        self.jobs = Counter(
            "dueflow_jobs_total",
            "Job attempts by outcome",
            ["queue", "task", "outcome"],
            registry=r,
        )
        self.job_duration = Histogram(
            "dueflow_job_duration_seconds",
            "Handler run time",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.attempts = Counter(
            "dueflow_job_attempts_total", "Handler invocations", ["queue", "task"], registry=r
        )
        self.retries = Counter(
            "dueflow_retries_total", "Jobs sent to a retry tier", ["queue", "tier"], registry=r
        )
        self.dead_letters = Counter(
            "dueflow_dead_letters_total", "Jobs sent to the DLQ", ["queue", "reason"], registry=r
        )
        self.dlq_depth = Gauge(
            "dueflow_dlq_depth",
            "Records in the DLQ topic of a queue",
            ["queue"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.duplicates_skipped = Counter(
            "dueflow_duplicates_skipped_total",
            "Jobs skipped because their idempotency key was already final",
            ["queue"],
            registry=r,
        )
        self.in_flight = Gauge(
            "dueflow_jobs_in_flight",
            "Jobs running now",
            ["queue"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.consumer_lag = Gauge(
            "dueflow_consumer_lag",
            "High watermark minus committed offset",
            ["group", "topic", "partition"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.job_timeouts = Counter(
            "dueflow_job_timeouts_total",
            "Attempts failed because the handler overran its timeout",
            ["queue", "task"],
            registry=r,
        )

    def _declare_worker_process(self, r: CollectorRegistry) -> None:
        """Workers: the process, its commits and what handlers report."""
        self.orphaned_threads = Gauge(
            "dueflow_worker_orphaned_threads",
            "Handler threads still running a job that timed out (they cannot be killed)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.loop_blocked = Counter(
            "dueflow_worker_loop_blocked_total",
            "Times the worker's event loop was blocked past its limit: by an async "
            "handler past its timeout (its attempt recorded as timed out; queue and "
            "task named) or with no handler on it (queue and task empty)",
            ["queue", "task"],
            registry=r,
        )
        self.worker_restarts = Counter(
            "dueflow_worker_restarts_total",
            "Worker processes restarted by the worker itself, by reason: memory "
            "(max_memory, after its jobs), memory_ceiling (the hard ceiling, at once), "
            "blocked_loop (the event loop stayed blocked)",
            ["reason"],
            registry=r,
        )
        self.worker_rejoins = Counter(
            "dueflow_worker_rejoins_total",
            "Times a queue's consumer left its group and joined again because the "
            "group coordinator had given it partitions it never heard of",
            ["queue"],
            registry=r,
        )
        self.worker_memory = Gauge(
            "dueflow_worker_resident_memory_bytes",
            "Resident memory of a worker process (the largest one, across processes)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.worker_transactions = Counter(
            "dueflow_worker_transactions_total",
            "Worker commit transactions by result",
            ["queue", "result"],
            registry=r,
        )
        self.follow_ups = Counter(
            "dueflow_follow_ups_total",
            "Follow-up jobs handlers scheduled (ctx.schedule): written with their "
            "attempt's success, or dropped with its failure",
            ["queue", "result"],
            registry=r,
        )
        self.result_errors = Counter(
            "dueflow_result_errors_total",
            "Handler results not kept (not JSON, or over result_max_bytes): the jobs "
            "succeeded with result_error in their outcome",
            ["queue", "task"],
            registry=r,
        )
        self.progress_reports = Counter(
            "dueflow_progress_reports_total",
            "ctx.progress calls of handlers (the newest value per attempt is written)",
            ["queue"],
            registry=r,
        )
        self.progress_outcomes = Counter(
            "dueflow_progress_outcomes_total",
            "started outcomes written for running attempts: with progress, or to show "
            "a long attempt as running",
            ["queue", "kind"],
            registry=r,
        )
        self.hook_calls = Counter(
            "dueflow_worker_hook_calls_total",
            "Worker lifecycle hook calls (startup, shutdown, failure) by result",
            ["hook", "result"],
            registry=r,
        )

    def _declare_steering(self, r: CollectorRegistry) -> None:
        """Workers: steered jobs, store loads and rate limits."""
        self.steering_commands = Counter(
            "dueflow_steering_commands_total",
            "Commands (cancel, move, patch, replace) the owner of their partition "
            "answered, by verdict (cancelled, rescheduled, updated, refused)",
            ["queue", "op", "verdict"],
            registry=r,
        )
        self.steering_deliveries = Counter(
            "dueflow_steering_deliveries_total",
            "Deliveries of steered jobs that did not run as they came: superseded (an "
            "older version), cancelled, redirect (written again with a move or update), "
            "duplicate",
            ["queue", "step"],
            registry=r,
        )
        self.steering_states = Gauge(
            "dueflow_steering_states",
            "Steered jobs whose state this worker keeps (they have timers in the wheel)",
            ["queue"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.store_load_wait = Histogram(
            "dueflow_store_load_wait_seconds",
            "Time a worker's read of a partition of its key store (store=keys: at "
            "assignment, and before a redriven record) or steering store (steering: "
            "at assignment) waited for the transactions written to it before to end "
            "there (its last stable offset to reach its high watermark); 0 when none was open",
            ["queue", "store"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.steering_swept = Counter(
            "dueflow_steering_swept_total",
            "Steering states the sweep changed (timers due longer ago than the grace)",
            ["queue"],
            registry=r,
        )
        self.rate_limited = Counter(
            "dueflow_rate_limit_waits_total",
            "Times a worker paused partitions for a rate limit",
            ["queue"],
            registry=r,
        )
        self.lead_fence_asks = Counter(
            "dueflow_lead_fence_asks_total",
            "Requests for the last stable offsets of partitions with jobs fired ahead "
            "and due (result: asked, failed)",
            ["queue", "result"],
            registry=r,
        )

    def _declare_status_view(self, r: CollectorRegistry) -> None:
        """The status view."""
        self.status_outcomes = Counter(
            "dueflow_status_outcomes_total",
            "Outcome records the status view applied, by job state",
            ["state"],
            registry=r,
        )
        self.status_jobs = Gauge(
            "dueflow_status_jobs",
            "Jobs the status view knows, by queue and current state",
            ["queue", "state"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.status_restored = Counter(
            "dueflow_status_changelog_restored_total",
            "Changelog records the status view read into its job file at recovery "
            "(after a restart with its file: only those newer than the file)",
            registry=r,
        )
        self.cluster_reads = Counter(
            "dueflow_cluster_reads_total",
            "Reads of offsets and groups from Kafka (cluster view), by result",
            ["result"],
            registry=r,
        )

    def _declare_every_process(self, r: CollectorRegistry) -> None:
        """Every process: readiness, liveness and records set aside."""
        # Per process (a worker's children each have their own series, by pid):
        # what /readyz answers and when the main loop last turned.
        self.ready = Gauge(
            "dueflow_ready",
            "1 while this process is ready (/readyz: connected, group membership held)",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.loop_heartbeat = Gauge(
            "dueflow_loop_heartbeat_timestamp_seconds",
            "Wall time the process's main loop last turned (/livez)",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.quarantined = Counter(
            "dueflow_quarantined_total",
            "Malformed records set aside with a reason",
            ["component", "reason"],
            registry=r,
        )
        self.set_aside_trimmed = Counter(
            "dueflow_set_aside_trimmed_total",
            "Dead letters and quarantine records cut to fit their topic, by what was cut "
            "(texts, reference, minimal; value, headers, key)",
            ["component", "record", "cut"],
            registry=r,
        )
        self.too_large = Counter(
            "dueflow_records_too_large_total",
            "Records set aside (quarantined or dead-lettered) because a hop's record "
            "would exceed its topic's max.message.bytes, by hop",
            ["component", "hop"],
            registry=r,
        )
        self.skipped = Counter(
            "dueflow_records_skipped_total",
            "Records a reader could not use and skipped (not quarantined), by reason",
            ["component", "reason"],
            registry=r,
        )

    def families(self) -> list[MetricFamily]:
        """Name, type and label names of every collector (for checks of rules and dashboards)."""
        out = []
        for value in vars(self).values():
            if isinstance(value, MetricWrapperBase):
                # prometheus_client keeps the declared labels on _labelnames (no public getter).
                labels = tuple(value._labelnames)
                out.append(MetricFamily(value._name, str(value._type), labels))
        return sorted(out)


class MetricFamily(NamedTuple):
    """One collector as Prometheus sees it: base ``name``, ``kind`` and ``labels``."""

    name: str
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]

    def sample_names(self) -> tuple[str, ...]:
        """Series names this family exposes (``_total``, ``_bucket``, ... included)."""
        if self.kind == "counter":
            return (f"{self.name}_total", f"{self.name}_created")
        if self.kind == "histogram":
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_count", "_sum", "_created"))
        return (self.name,)


def exposition_registry(metrics: Metrics) -> CollectorRegistry:
    """The registry to expose: the merged multiprocess view when enabled, else ``metrics``'."""
    if multiprocess_enabled():
        return merged_registry()
    return metrics.registry


def render(metrics: Metrics) -> tuple[bytes, str]:
    """The text exposition of ``metrics`` and its content type (for a custom HTTP server)."""
    return generate_latest(exposition_registry(metrics)), CONTENT_TYPE_LATEST


def serve(
    metrics: Metrics,
    port: int,
    *,
    addr: str = "127.0.0.1",
    health: HealthSource | None = None,
) -> int:
    """Serve ``/metrics`` (and with ``health``, ``/livez`` and ``/readyz``) on
    ``addr:port`` (0 picks a free port); return the port.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, serves the merged view of all
    processes that write there instead of this process's registry.
    """
    return start_listener(exposition_registry(metrics), port, addr=addr, health=health)
