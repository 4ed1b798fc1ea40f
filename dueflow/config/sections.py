"""The sections of :class:`~dueflow.config.Settings`: a queue's spec, the emitter,
the workers, observability (metrics, logs, the status view) and the scheduling
clients. Plain frozen dataclasses with their defaults; each field's comment is its
description in the configuration reference (``python -m tools.reference_docs``).
Checks: :mod:`dueflow.config.validation`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue: its exec, retry-tier, DLQ and idempotency topics share ``partitions``."""

    name: str  # 1-100 of A-Z a-z 0-9 _ -
    # Partitions of each of its topics: at most this many workers share the queue.
    # Cannot change once its topics exist.
    partitions: int = 6
    # Delays of its retry-tier topics, increasing (a longer backoff goes back
    # through the timer wheel).
    retry_tiers_ms: tuple[int, ...] = (1_000, 10_000, 60_000)
    # How long workers remember a key's state (its compacted idempotency topic);
    # cancel and reschedule refuse a job due further away than this.
    idempotency_retention_ms: int = 7 * 24 * 3_600_000
    # Jobs per second at most over all its workers, each taking its partitions'
    # share; unset: no limit.
    rate_limit_per_s: float | None = None


# Transactional ids every takeover fences (emitter.producers is at most this).
EMITTER_MAX_PRODUCERS = 4
# emitter.fire_ahead_ms at most: a worker sets aside a record due within this.
FIRE_AHEAD_MAX_MS = 1_000


@dataclass(frozen=True, slots=True)
class EmitterSettings:
    """The active emitter and its standbys."""

    # Lease group session: a crashed active emitter is replaced after this.
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 1_000  # lease group heartbeat
    # false: fires go out through an idempotent producer and are visible once
    # appended; the timer offsets are committed through the lease group once the
    # fires they cover are acknowledged, and a takeover fires again what the old
    # emitter fired after its last commit (workers skip the copies). true: fires
    # and offsets commit in Kafka transactions, visible at commit, never twice.
    transactional: bool = False
    # The timer offsets are committed after this many records ... (in
    # transactions: while a backlog is due, a transaction commits after this many)
    batch_max_records: int = 20_000
    # ... or this long after the first. In transactions, a transaction commits once
    # every due timer fired; while a backlog is due, every batch_max_records
    # records or batch_max_ms milliseconds.
    batch_max_ms: int = 100
    # In transactions, caught up: a transaction stays open this long after its first
    # record (0: commit as soon as every due timer fired): fewer transactions, so
    # fewer commit markers in the exec partitions, for that much later visibility.
    # The default keeps the lowest lateness: 20 ms did not measurably lower the
    # broker's CPU at 5k jobs/s.
    batch_min_ms: int = 0
    # In transactions: the transactional producers the active emitter writes with,
    # in turn: with 2 or more it keeps firing into the next one while a commit is
    # in flight (1: the loop waits for every commit). At most 4 (every takeover
    # fences 4 ids).
    producers: int = 2
    catchup_max_rate_per_s: float = 200_000.0  # fires per second at most (a token bucket)
    # A timer is written to its exec topic this long before it is due; the worker
    # that reads it starts the job at its due time (df-due), not before, and runs
    # the records behind it meanwhile. It hides the write, the fetch and the
    # emitter's own pauses from the job's start (0: written when due). At most
    # 1,000 ms, and below worker.max_clock_skew_ms. From 100 ms on, the emitter's
    # producer waits up to 10 ms to fill a request.
    fire_ahead_ms: int = 200
    # In transactions: a commit runs at most this long (an abort 2 s more); one that
    # runs 5 s past both is wedged: its producers are abandoned and the active
    # period starts over.
    transaction_timeout_ms: int = 10_000
    # Pending-timer gauges, DeleteRecords and the clock offset run this often.
    housekeeping_interval_ms: int = 5_000
    # Timers the emitter reads ahead into memory while a backlog drains (beyond
    # those due within one level-0 slot of the earliest): memory vs. throughput.
    heap_budget: int = 50_000
    # Cron: an occurrence fired later than this after its instant is a misfire
    # (its schedule's misfire policy decides).
    misfire_grace_ms: int = 60_000
    cron_max_catchup: int = 100  # cron: runs fired for one misfire at most (fire_all)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Worker processes.

    ``concurrency``: jobs running at once in each worker process.
    ``processes``: worker processes (consumer group members) ``dueflow worker``
    runs. ``session_timeout_ms``: a member silent this long loses its
    partitions to the others. ``default_timeout_s``: an attempt's hard timeout
    when neither the job nor its task gives one. ``default_max_attempts``:
    attempts before the DLQ when neither gives them. ``commit_interval_ms``:
    finished jobs are committed this often, in one transaction (idempotency
    records, outcomes, offsets). ``commit_max_jobs``: ... or as soon as this
    many have finished; past it no job starts until the batch is taken for its
    commit (while one commits, the next fills). ``fetch_batch``: records taken
    from the consumer at a time. ``store_dir``: where ``store = "disk"`` keeps its files.
    ``max_orphaned_threads``: sync handler threads still running a timed-out
    job, at most: beyond that the process stops with an error (a supervisor
    restarts it). ``group_protocol``: ``consumer`` (KIP-848, Kafka 4.0+: incremental
    rebalances with the broker's co-partitioning ``range`` assignor; the
    session timeout is a group config the worker sets, see
    docs/workers.md) or ``classic`` (eager ``range``: every rebalance
    revokes every partition of every member; for brokers before 4.0).
    ``shutdown_grace_s``: drain time on SIGTERM (in-flight jobs may finish).
    ``rebalance_grace_s``: how long a revoked partition's in-flight jobs may
    run on (they end by themselves at their timeout first, as a rule) before
    they are abandoned and may run on the new owner at the same time.
    ``transaction_timeout_ms``: after a kill -9, the new owner of the dead
    member's partitions may wait this long for its open transaction to be
    aborted by the broker. ``store``: ``memory`` or ``disk`` (SQLite files in
    ``store_dir``) for idempotency keys. ``isolated_processes``: child
    processes per worker process for ``isolation="process"`` tasks.
    ``hook_timeout_s``: how long a lifecycle hook (``@on_startup``,
    ``@on_shutdown``, ``@on_failure``) may run before it counts as failed.
    ``watchdog_interval_s``: how often the watchdog thread looks at the event
    loop and the process's memory (0 turns it off); ``watchdog_stall_s``: a loop
    that does not turn this long while no handler runs on it counts as blocked;
    ``watchdog_restart_s``: a loop still blocked this long after the watchdog
    acted restarts the process. ``max_memory``: bytes of resident memory after
    which the process finishes its jobs and restarts (unset: no limit);
    ``max_memory_hard``: the ceiling at which it restarts at once (default twice
    ``max_memory``). See docs/workers.md. ``assignment_check_s``: how often a
    queue of the ``consumer`` protocol asks the group coordinator which partitions
    it gave this member; a partition it gave that the consumer has not held at
    any answer for 10 s or more makes the consumer leave the group and join it
    again (0 turns the check off; see docs/workers.md,
    "A member that never hears of its assignment").
    ``steering_grace_ms``: how late a steered job's older timer may still
    arrive and be recognised (``None``: the queue's idempotency retention);
    see docs/workers.md, "Steering jobs". ``steering_margin_ms``: a command
    acknowledged at least this long before a job's due time always wins, also
    when the emitter fired the job ahead of it: a job fired ahead starts once
    every record appended to its partition before its due time less this has
    been handled (0: every command before the due time, at a few ms of start
    latency and a request to the broker per due moment; see docs/workers.md).
    ``result_max_bytes``: the largest handler result kept (its JSON, in the
    ``succeeded`` outcome; a task may set its own). ``progress_interval_ms``:
    at most one progress outcome per attempt this often;
    ``progress_max_per_s``: at most this many per worker process and second
    (beyond: the newest value waits); ``report_running_after_ms``: an attempt
    that runs this long gets a ``started`` outcome (0: never).
    """

    concurrency: int = 64
    processes: int = 1
    group_protocol: Literal["consumer", "classic"] = "consumer"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int | None = None  # unset: a third of the session, 100 ms-3 s
    shutdown_grace_s: float = 25.0
    default_timeout_s: float = 300.0
    default_max_attempts: int = 4
    # How far the clocks of two processes may differ: an exec record's df-due later
    # than its df-fired plus this is dead-lettered (docs/wire-format.md#accepted-ranges).
    max_clock_skew_ms: int = 30_000
    commit_interval_ms: int = 100
    commit_max_jobs: int = 20_000
    rebalance_grace_s: float = 300.0
    transaction_timeout_ms: int = 10_000
    fetch_batch: int = 2_000
    store: Literal["memory", "disk"] = "memory"
    store_dir: str = ".dueflow/keys"
    isolated_processes: int = 2
    max_orphaned_threads: int = 256
    hook_timeout_s: float = (
        60.0  # a lifecycle hook call (consumers/dueflow/consumers/hooks.py) at most
    )
    watchdog_interval_s: float = 0.5
    watchdog_stall_s: float = 30.0
    watchdog_restart_s: float = 10.0
    max_memory: int | None = None
    max_memory_hard: int | None = None
    assignment_check_s: float = 5.0

    @property
    def memory_ceiling(self) -> int | None:
        """The hard memory ceiling: ``max_memory_hard``, else twice ``max_memory``."""
        if self.max_memory_hard is not None:
            return self.max_memory_hard
        return None if self.max_memory is None else 2 * self.max_memory

    steering_grace_ms: int | None = None

    def steering_grace(self, queue: QueueSpec) -> int:
        """The steering grace of ``queue``: as set, else its idempotency retention."""
        if self.steering_grace_ms is not None:
            return self.steering_grace_ms
        return queue.idempotency_retention_ms

    steering_margin_ms: int = 100

    result_max_bytes: int = 65_536
    progress_interval_ms: int = 1_000
    progress_max_per_s: int = 500
    report_running_after_ms: int = 1_000

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat interval: as set, else a third of the session (100 ms to 3 s)."""
        if self.heartbeat_interval_ms is not None:
            return self.heartbeat_interval_ms
        return max(100, min(3_000, self.session_timeout_ms // 3))


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """Metrics, logs and traces."""

    metrics_port: int | None = None  # serve /metrics, /livez and /readyz here; unset: none
    # The listener's address: loopback on a laptop; the container image sets
    # 0.0.0.0 (a scraper and the kubelet must reach it).
    metrics_bind: str = "127.0.0.1"  # 127.0.0.1, 0.0.0.0 (every interface) or an address
    liveness_timeout_s: float = 30.0  # /livez fails when the main loop has not turned this long
    log_format: Literal["json", "text"] = "json"  # one JSON object per line, or text
    log_level: str = "INFO"  # DEBUG, INFO, WARNING, ERROR or CRITICAL
    # Worker job events: "all" logs the start and the success of every job too
    # (a few microseconds per line); "failures" only failed attempts, retries
    # and dead letters.
    job_log: Literal["all", "failures"] = "all"
    # The status view (faust app over the outcomes topic) and its HTTP server:
    # the address it binds (beyond loopback only with a status_token) ...
    status_bind: str = "127.0.0.1"
    status_port: int = 6066  # ... and its port
    status_url: str | None = None  # where `dueflow status`/`job` ask; unset: bind and port
    # Bearer token of the status view's state-changing calls (the redrive button).
    # Unset: the view makes one at start and prints the page URL with it once.
    # Required to bind beyond loopback. Never shown in repr, errors or logs.
    status_token: str | None = field(default=None, repr=False)
    # Host names (``name`` or ``name:port``) the status view answers to besides
    # the address a request arrived at (and ``localhost`` on loopback): names
    # that are not listed are refused (a DNS-rebinding defence).
    status_allowed_hosts: tuple[str, ...] = ()
    # Token of the console's viewer role (reads only). Set: reading the view needs a
    # login or a bearer token; unset: reads are open. Never shown.
    status_viewer_token: str | None = field(default=None, repr=False)
    # Who may read payloads and results in the console: "operator" or "viewer".
    status_payloads: Literal["operator", "viewer"] = "operator"
    # Link from a job's trace id to a tracing UI: a URL with {trace_id}; unset: none.
    status_trace_url: str | None = None
    # The status view's TLS certificate file (PEM, its chain after it). With
    # status_tls_key: the view serves HTTPS only (TLS 1.2 or later); neither: HTTP.
    status_tls_cert: str | None = None
    # The private key file of status_tls_cert (PEM, not encrypted); both or neither.
    status_tls_key: str | None = None
    status_data_dir: str = ".dueflow/status"  # the job file: <dir>/<app id>.jobs.sqlite
    # Finished jobs leave the status view (and Scheduler.status) this long after
    # their last change; pending and running jobs stay until they end.
    status_retention_ms: int = 7 * 24 * 3_600_000
    # Where the status view keeps its jobs: "sqlite" (a file in status_data_dir that
    # survives restarts; memory bounded by the two settings below) or "memory"
    # (every job's view in RAM, the whole changelog read at each start).
    status_store: Literal["sqlite", "memory"] = "sqlite"
    status_hot_jobs: int = 50_000  # views of recently changed jobs kept in memory
    status_cache_mib: int = 64  # SQLite page cache of the job file
    # How long Scheduler.status and `dueflow job` wait for the status view before
    # they fall back to scanning the outcomes topic.
    status_lookup_timeout_ms: int = 2_000
    cluster_refresh_ms: int = 2_000  # how often the view re-reads offsets from Kafka

    @property
    def status_base_url(self) -> str:
        """URL of the status view: ``status_url`` or ``http(s)://<bind>:<port>``
        (https when the view serves TLS: ``status_tls_cert``)."""
        if self.status_url:
            return self.status_url.rstrip("/")
        host = "127.0.0.1" if self.status_bind in ("0.0.0.0", "") else self.status_bind
        scheme = "https" if self.status_tls_cert else "http"
        return f"{scheme}://{host}:{self.status_port}"


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """The scheduling clients (Scheduler, AsyncScheduler, schedule_many, `dueflow schedule`)."""

    # A Confluent-compatible schema registry: job values are written in its wire
    # format (magic byte, schema id, Avro) with the id it gives job.avsc under
    # `<prefix>.timers-value`; unset: plain Avro. Upgrade every worker first.
    schema_registry_url: str | None = None
    # User name for HTTP basic auth to the registry (with schema_registry_password).
    schema_registry_user: str | None = None
    # Its password: never shown in a repr or an error.
    schema_registry_password: str | None = field(default=None, repr=False)
    # Seconds registering job.avsc may take at the first schedule; a registry that
    # has not answered by then fails that schedule with an error naming its URL.
    schema_registry_timeout_s: float = 10.0
