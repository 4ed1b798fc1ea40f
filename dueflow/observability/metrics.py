"""Prometheus metrics of every dueflow process.

One :class:`Metrics` object per process (or per test), built on a registry
passed in: no module-level collectors. Components receive it through their
constructor. Names follow Prometheus conventions: ``dueflow_*``, base units,
``_total`` for counters, ``_seconds`` for time.

For ``dueflow worker --processes N`` call :func:`enable_multiprocess` in the
parent before the children start and before any :class:`Metrics` is built
(it sets ``PROMETHEUS_MULTIPROC_DIR``), call :func:`process_exited` when a
child ends, and :func:`serve` then serves one merged view.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
    values,
)
from prometheus_client.metrics import MetricWrapperBase

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
    """Every collector dueflow exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # --- scheduling (producers)
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
        # --- emitter
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
            "Emit time minus due time of fired jobs",
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
        self.emitter_transactions = Counter(
            "dueflow_emitter_transactions_total",
            "Emitter transactions by result",
            ["result"],
            registry=r,
        )
        self.emitter_commit = Histogram(
            "dueflow_emitter_commit_seconds",
            "How long the emitter's transactions took to commit (handed over to done): "
            "a fired job becomes visible to workers only then",
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
        # --- workers
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
        self.orphaned_threads = Gauge(
            "dueflow_worker_orphaned_threads",
            "Handler threads still running a job that timed out (they cannot be killed)",
            registry=r,
            multiprocess_mode="livesum",
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
        self.hook_calls = Counter(
            "dueflow_worker_hook_calls_total",
            "Worker lifecycle hook calls (startup, shutdown, failure) by result",
            ["hook", "result"],
            registry=r,
        )
        self.rate_limited = Counter(
            "dueflow_rate_limit_waits_total",
            "Times a worker paused partitions for a rate limit",
            ["queue"],
            registry=r,
        )
        # --- status view
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
        self.cluster_reads = Counter(
            "dueflow_cluster_reads_total",
            "Reads of offsets and groups from Kafka (cluster view), by result",
            ["result"],
            registry=r,
        )
        # --- everywhere
        self.quarantined = Counter(
            "dueflow_quarantined_total",
            "Malformed records set aside with a reason",
            ["component", "reason"],
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


def enable_multiprocess(directory: str | os.PathLike[str], *, clean: bool = True) -> Path:
    """Switch this process (and children started after) to multiprocess metrics.

    Call it in the parent of ``--processes N`` before any :class:`Metrics` is
    built. prometheus_client picks its value store when it is first imported,
    so setting ``PROMETHEUS_MULTIPROC_DIR`` later is not enough: this also
    re-selects the store. ``clean`` removes files of an earlier run (stale
    counters would otherwise be summed in).
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if clean:
        for stale in path.glob("*.db"):
            stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return path


def process_exited(pid: int) -> None:
    """Drop the live gauges of a child that exited (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def exposition_registry(metrics: Metrics) -> CollectorRegistry:
    """The registry to expose: the merged multiprocess view when enabled, else ``metrics``'."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return metrics.registry


def render(metrics: Metrics) -> tuple[bytes, str]:
    """The text exposition of ``metrics`` and its content type (for a custom HTTP server)."""
    return generate_latest(exposition_registry(metrics)), CONTENT_TYPE_LATEST


def observe_many(histogram: Histogram, samples: Iterable[float]) -> None:
    """``histogram.observe(v)`` for each value, with one lock round per bucket.

    Workers record a duration per job; at tens of thousands of jobs per
    second, observing them one by one costs a microsecond each. This adds
    them up per bucket first (using the client's per-bucket counters when
    it has them, else plain ``observe``).
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in samples:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    summed = 0.0
    index = bisect.bisect_left
    for value in samples:
        summed += value
        counts[index(bounds, value)] += 1
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    total.inc(summed)


def observe_ages(histogram: Histogram, now_ms: int, starts_ms: list[int]) -> None:
    """``histogram.observe(max(0, now_ms - start) / 1000)`` for each start, in seconds.

    For a batch that ends at one instant (the emitter's lateness at commit):
    the starts are sorted once and each bucket's count is one bisection, so a
    batch of thousands costs about as much as a sort.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        observe_many(histogram, [max(0, now_ms - s) / 1000.0 for s in starts_ms])
        return
    starts = sorted(starts_ms)
    n = len(starts)
    below = 0  # counted in lower buckets (the smallest ages: the latest starts)
    for bound, bucket in zip(bounds, buckets, strict=True):
        within = (
            n if bound == float("inf") else n - bisect.bisect_left(starts, now_ms - _max_ms(bound))
        )
        if within > below:
            bucket.inc(within - below)
            below = within
    overdue = bisect.bisect_left(starts, now_ms)  # starts before now: a positive age
    total.inc((overdue * now_ms - sum(starts[:overdue])) / 1000.0)


def _max_ms(bound_s: float) -> int:
    """The largest whole number of milliseconds ``a`` with ``a / 1000 <= bound_s``."""
    a = int(bound_s * 1000)
    while (a + 1) / 1000.0 <= bound_s:
        a += 1
    while a / 1000.0 > bound_s:
        a -= 1
    return a


def serve(metrics: Metrics, port: int, *, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` on ``addr:port`` (0 picks a free port); return the port.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, serves the merged view of all
    processes that write there instead of this process's registry.
    """
    registry = exposition_registry(metrics)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(server.server_port)
