"""The checks of :meth:`Settings.validate <dueflow.config.Settings.validate>`, one
function per section, in the order the settings are checked: the first bad setting
raises :class:`~dueflow.errors.ConfigError` naming it, its value and what is accepted."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from dueflow.config.sections import (
    EMITTER_MAX_PRODUCERS,
    FIRE_AHEAD_MAX_MS,
    EmitterSettings,
    ObservabilitySettings,
    ProducerSettings,
    QueueSpec,
    WorkerSettings,
)
from dueflow.errors import ConfigError

if TYPE_CHECKING:
    from dueflow.config.settings import Settings

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# host, host:port, [v6], [v6]:port (lower or upper case; compared lower-cased)
_ALLOWED_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?$")
# an address to listen on: IPv4, IPv6 (bare) or a host name
_BIND_RE = re.compile(r"^([0-9A-Fa-f:.]+|[A-Za-z0-9._-]+)$")
_REGISTRY_URL_RE = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
STATUS_TOKEN_MIN = 16


def validate_cluster(s: Settings) -> None:
    """The cluster, the topic prefix, the static queues, the route table and the app."""
    if not s.bootstrap or not all(
        re.match(r"^[^\s:,]+:\d{1,5}$", b.strip()) for b in s.bootstrap.split(",")
    ):
        raise ConfigError("bootstrap", s.bootstrap, "host:port[,host:port...]")
    if not _PREFIX_RE.match(s.topic_prefix):
        raise ConfigError("topic_prefix", s.topic_prefix, "1-100 of [A-Za-z0-9._-]")
    if not s.queues:
        raise ConfigError("queues", s.queues, "at least one queue")
    seen: set[str] = set()
    for i, q in enumerate(s.queues):
        validate_queue(q, f"queues[{i}]")
        if q.name in seen:
            raise ConfigError(f"queues[{i}].name", q.name, "a name not used by another queue")
        seen.add(q.name)
    for i, route in enumerate(s.routes):
        pattern, queue = route
        if not pattern or len(pattern) > 255:
            raise ConfigError(f"routes[{i}]", pattern, "a task name or glob of 1-255 chars")
        if not _NAME_RE.match(queue):
            raise ConfigError(f"routes[{pattern}]", queue, "a queue name: 1-100 of [A-Za-z0-9_-]")
    for module in s.app:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", module):
            raise ConfigError("app", module, "a dotted module name, e.g. myapp.tasks")


def validate_topics(s: Settings) -> None:
    """Replication of the topics ``dueflow topics ensure`` creates, and their partitions."""
    _positive("replication_factor", s.replication_factor)
    _positive("min_insync_replicas", s.min_insync_replicas)
    if s.min_insync_replicas > s.replication_factor:
        raise ConfigError(
            "min_insync_replicas",
            s.min_insync_replicas,
            f"at most replication_factor ({s.replication_factor})",
        )
    _positive("schedules_partitions", s.schedules_partitions)
    _positive("outcomes_partitions", s.outcomes_partitions)


def validate_emitter(em: EmitterSettings) -> None:
    for name in (
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "batch_max_records",
        "batch_max_ms",
        "transaction_timeout_ms",
        "housekeeping_interval_ms",
        "heap_budget",
        "cron_max_catchup",
    ):
        _positive(f"emitter.{name}", getattr(em, name))
    if not isinstance(em.batch_min_ms, int) or not (0 <= em.batch_min_ms <= em.batch_max_ms):
        raise ConfigError(
            "emitter.batch_min_ms",
            em.batch_min_ms,
            f"an integer from 0 to emitter.batch_max_ms ({em.batch_max_ms})",
        )
    producers = em.producers
    if not isinstance(producers, int) or not 1 <= producers <= EMITTER_MAX_PRODUCERS:
        raise ConfigError(
            "emitter.producers", producers, f"an integer from 1 to {EMITTER_MAX_PRODUCERS}"
        )
    if not isinstance(em.misfire_grace_ms, int) or em.misfire_grace_ms < 0:
        raise ConfigError("emitter.misfire_grace_ms", em.misfire_grace_ms, "an integer >= 0")
    if em.catchup_max_rate_per_s <= 0:
        raise ConfigError("emitter.catchup_max_rate_per_s", em.catchup_max_rate_per_s, "> 0")
    ahead = em.fire_ahead_ms
    if not isinstance(ahead, int) or isinstance(ahead, bool) or not 0 <= ahead <= FIRE_AHEAD_MAX_MS:
        raise ConfigError(
            "emitter.fire_ahead_ms", ahead, f"an integer from 0 to {FIRE_AHEAD_MAX_MS} ms"
        )


def validate_fire_ahead(em: EmitterSettings, ws: WorkerSettings) -> None:
    """A record fired ahead is due no later than the skew a worker allows past its
    write: further ahead, the worker would dead-letter it as out of range."""
    if em.fire_ahead_ms >= ws.max_clock_skew_ms:
        raise ConfigError(
            "emitter.fire_ahead_ms",
            em.fire_ahead_ms,
            f"below worker.max_clock_skew_ms ({ws.max_clock_skew_ms} ms)",
        )


def validate_worker(ws: WorkerSettings) -> None:
    for name in (
        "concurrency",
        "processes",
        "session_timeout_ms",
        "default_max_attempts",
        "max_clock_skew_ms",
        "commit_interval_ms",
        "commit_max_jobs",
        "transaction_timeout_ms",
        "fetch_batch",
        "isolated_processes",
        "max_orphaned_threads",
        "progress_interval_ms",
        "progress_max_per_s",
    ):
        _positive(f"worker.{name}", getattr(ws, name))
    _validate_results(ws)
    _validate_durations(ws)
    _validate_memory(ws)
    if ws.group_protocol not in ("consumer", "classic"):
        raise ConfigError("worker.group_protocol", ws.group_protocol, "'consumer' or 'classic'")
    beat = ws.heartbeat_interval_ms
    if beat is not None and not 0 < beat < ws.session_timeout_ms:
        raise ConfigError(
            "worker.heartbeat_interval_ms",
            beat,
            f"ms > 0 and below worker.session_timeout_ms ({ws.session_timeout_ms})",
        )
    grace = ws.steering_grace_ms
    if grace is not None and (type(grace) is not int or grace < 0):
        raise ConfigError("worker.steering_grace_ms", grace, "milliseconds >= 0, or unset")
    if ws.store not in ("memory", "disk"):
        raise ConfigError("worker.store", ws.store, "'memory' or 'disk'")
    margin = ws.steering_margin_ms
    if type(margin) is not int or not 0 <= margin <= FIRE_AHEAD_MAX_MS:
        raise ConfigError(
            "worker.steering_margin_ms", margin, f"an integer from 0 to {FIRE_AHEAD_MAX_MS} ms"
        )


def _validate_durations(ws: WorkerSettings) -> None:
    if not ws.hook_timeout_s > 0:
        raise ConfigError("worker.hook_timeout_s", ws.hook_timeout_s, "seconds > 0")
    for name in (
        "shutdown_grace_s",
        "rebalance_grace_s",
        "default_timeout_s",
        "watchdog_interval_s",
        "assignment_check_s",
    ):
        value = getattr(ws, name)
        if not value >= 0:
            raise ConfigError(f"worker.{name}", value, "seconds >= 0")
    for name in ("watchdog_stall_s", "watchdog_restart_s"):
        value = getattr(ws, name)
        if not value > 0:
            raise ConfigError(f"worker.{name}", value, "seconds > 0")


def validate_observability(obs: ObservabilitySettings) -> None:
    _validate_logs_and_listener(obs)
    _validate_status_access(obs)
    _validate_status_view(obs)
    if obs.log_level.upper() not in _LOG_LEVELS:
        raise ConfigError("observability.log_level", obs.log_level, " ".join(_LOG_LEVELS))


def _validate_logs_and_listener(obs: ObservabilitySettings) -> None:
    if obs.log_format not in ("json", "text"):
        raise ConfigError("observability.log_format", obs.log_format, "'json' or 'text'")
    if obs.job_log not in ("all", "failures"):
        raise ConfigError("observability.job_log", obs.job_log, "'all' or 'failures'")
    port = obs.metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError("observability.metrics_port", port, "0-65535, or unset")
    if not _BIND_RE.match(obs.metrics_bind):
        raise ConfigError(
            "observability.metrics_bind",
            obs.metrics_bind,
            "an address or host name to listen on: 127.0.0.1 (loopback), 0.0.0.0 or :: "
            "(every interface), or one interface's address",
        )
    if not obs.liveness_timeout_s > 0:
        raise ConfigError(
            "observability.liveness_timeout_s",
            obs.liveness_timeout_s,
            "seconds > 0",
        )


def _validate_status_access(obs: ObservabilitySettings) -> None:
    """The status view's port, its tokens and who may read payloads."""
    if not 0 <= obs.status_port <= 65535:
        raise ConfigError("observability.status_port", obs.status_port, "0-65535")
    token = obs.status_token
    if token is not None and (len(token) < STATUS_TOKEN_MIN or token != token.strip()):
        raise ConfigError(
            "observability.status_token",
            token,
            f"at least {STATUS_TOKEN_MIN} characters without surrounding spaces, or unset "
            "(a generated one: `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)",
            secret=True,
        )
    viewer = obs.status_viewer_token
    if viewer is not None and (
        len(viewer) < STATUS_TOKEN_MIN or viewer != viewer.strip() or viewer == token
    ):
        raise ConfigError(
            "observability.status_viewer_token",
            viewer,
            f"at least {STATUS_TOKEN_MIN} characters without surrounding spaces, not the "
            "operator's status_token, or unset",
            secret=True,
        )
    if obs.status_payloads not in ("operator", "viewer"):
        raise ConfigError(
            "observability.status_payloads",
            obs.status_payloads,
            "'operator' or 'viewer'",
        )


def _validate_status_view(obs: ObservabilitySettings) -> None:
    """The status view's trace links, TLS files, host names, job store and sizes."""
    trace_url = obs.status_trace_url
    if trace_url is not None and (
        "{trace_id}" not in trace_url or not trace_url.startswith(("http://", "https://"))
    ):
        raise ConfigError(
            "observability.status_trace_url",
            trace_url,
            "an http(s) URL with {trace_id} in it, e.g. http://jaeger:16686/trace/{trace_id}",
        )
    _validate_status_tls(obs)
    for i, host in enumerate(obs.status_allowed_hosts):
        if not _ALLOWED_HOST_RE.match(host):
            raise ConfigError(
                f"observability.status_allowed_hosts[{i}]",
                host,
                "a host name or address, optionally with :port (no scheme, no path)",
            )
    if obs.status_store not in ("sqlite", "memory"):
        raise ConfigError(
            "observability.status_store",
            obs.status_store,
            "'sqlite' or 'memory'",
        )
    for name in (
        "status_retention_ms",
        "status_hot_jobs",
        "status_cache_mib",
        "status_lookup_timeout_ms",
        "cluster_refresh_ms",
    ):
        _positive(f"observability.{name}", getattr(obs, name))


def validate_producer(producer: ProducerSettings) -> None:
    url = producer.schema_registry_url
    if url is not None and "@" in url:  # credentials in the URL would reach logs
        raise ConfigError(
            "producer.schema_registry_url",
            url,
            "a URL without credentials: set producer.schema_registry_user and _password",
            secret=True,
        )
    if url is not None and not _REGISTRY_URL_RE.match(url):
        raise ConfigError(
            "producer.schema_registry_url", url, "an http:// or https:// URL, or unset"
        )
    if (producer.schema_registry_user is None) != (producer.schema_registry_password is None):
        raise ConfigError(
            "producer.schema_registry_user",
            producer.schema_registry_user,
            "set together with producer.schema_registry_password (basic auth), or both unset",
        )
    if not producer.schema_registry_timeout_s > 0:
        raise ConfigError(
            "producer.schema_registry_timeout_s",
            producer.schema_registry_timeout_s,
            "a number of seconds > 0",
        )


def validate_queue(q: QueueSpec, where: str = "queue") -> QueueSpec:
    """Check one queue's spec; :class:`ConfigError` names ``where.<field>``."""
    if not isinstance(q.name, str) or not _NAME_RE.match(q.name):
        raise ConfigError(f"{where}.name", q.name, "1-100 of [A-Za-z0-9_-]")
    _positive(f"{where}.partitions", q.partitions)
    if q.partitions > _MAX_PARTITIONS:
        raise ConfigError(f"{where}.partitions", q.partitions, f"at most {_MAX_PARTITIONS}")
    if not q.retry_tiers_ms or any(not isinstance(t, int) or t <= 0 for t in q.retry_tiers_ms):
        raise ConfigError(f"{where}.retry_tiers_ms", q.retry_tiers_ms, "one or more delays > 0 ms")
    if list(q.retry_tiers_ms) != sorted(set(q.retry_tiers_ms)):
        raise ConfigError(
            f"{where}.retry_tiers_ms", q.retry_tiers_ms, "distinct delays in increasing order"
        )
    _positive(f"{where}.idempotency_retention_ms", q.idempotency_retention_ms)
    rate = q.rate_limit_per_s
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
        raise ConfigError(f"{where}.rate_limit_per_s", rate, "a number > 0, or unset")
    if rate is not None and not 0 < rate < math.inf:
        raise ConfigError(f"{where}.rate_limit_per_s", rate, "a finite number > 0, or unset")
    return q


_MIN_MEMORY = 16 * 2**20  # below this no Python worker process even starts


def _validate_memory(ws: WorkerSettings) -> None:
    if ws.max_memory is not None and not ws.watchdog_interval_s > 0:
        raise ConfigError(
            "worker.watchdog_interval_s",
            ws.watchdog_interval_s,
            "seconds > 0 while worker.max_memory is set (the watchdog reads the memory)",
        )
    for name in ("max_memory", "max_memory_hard"):
        value = getattr(ws, name)
        if value is not None and (not isinstance(value, int) or value < _MIN_MEMORY):
            raise ConfigError(
                f"worker.{name}", value, f"bytes >= {_MIN_MEMORY} (16 MiB, e.g. '512MiB'), or unset"
            )
    if ws.max_memory_hard is not None:
        if ws.max_memory is None:
            raise ConfigError(
                "worker.max_memory_hard", ws.max_memory_hard, "unset while max_memory is unset"
            )
        if ws.max_memory_hard <= ws.max_memory:
            raise ConfigError(
                "worker.max_memory_hard",
                ws.max_memory_hard,
                f"more bytes than worker.max_memory ({ws.max_memory}), or unset (twice it)",
            )


# A handler's result goes into one outcome record, and into the status view's record
# of the job (one changelog record: dueflow.rules.job_state.JSON_FIELD_MAX_BYTES),
# which must each fit in one Kafka record (1 MB by default) with the rest.
RESULT_MAX_BYTES_LIMIT = 262_144


def _validate_results(ws: WorkerSettings) -> None:
    cap = ws.result_max_bytes
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= RESULT_MAX_BYTES_LIMIT:
        raise ConfigError(
            "worker.result_max_bytes", cap, f"an integer from 1 to {RESULT_MAX_BYTES_LIMIT}"
        )
    after = ws.report_running_after_ms
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ConfigError("worker.report_running_after_ms", after, "an integer >= 0 (0: never)")


def _validate_status_tls(obs: ObservabilitySettings) -> None:
    """Both TLS files of the status view or neither (whether they load is checked
    where the view starts: :mod:`dueflow.streams.status.tls`)."""
    pair = {"status_tls_cert": obs.status_tls_cert, "status_tls_key": obs.status_tls_key}
    for name, other in (
        ("status_tls_key", "status_tls_cert"),
        ("status_tls_cert", "status_tls_key"),
    ):
        if pair[name] is None and pair[other] is not None:
            raise ConfigError(
                f"observability.{name}",
                None,
                f"a PEM file too: observability.{other} is set ({pair[other]!r}); the status "
                "view serves HTTPS with both the certificate and its key, plain HTTP with "
                "neither",
            )


_MAX_PARTITIONS = (1 << 31) - 1  # an Avro int (a queue registry record holds one)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an integer >= 1")
