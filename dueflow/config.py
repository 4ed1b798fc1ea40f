"""One settings object for every dueflow process.

Sources, later ones win: defaults, an optional TOML file (``--config`` or
``DUEFLOW_CONFIG``), environment variables (``DUEFLOW_*``), then CLI flags
(passed in as ``overrides``). Every validation error names the setting, the
value and what is accepted.

Environment variables:

- ``DUEFLOW_BOOTSTRAP``, ``DUEFLOW_TOPIC_PREFIX``, ``DUEFLOW_REPLICATION_FACTOR``,
  ``DUEFLOW_MIN_INSYNC_REPLICAS``, ... : top-level settings by upper-case name.
- ``DUEFLOW_QUEUES=billing:12,default``: queue names with optional partition count
  (static queues: a bootstrap beside the queue registry, see docs/queues.md).
- ``DUEFLOW_ROUTES=report=reports,billing.*=billing``: the route table (task name or
  glob -> queue), ``[routes]`` in the TOML file.
- ``DUEFLOW_APP=myapp.tasks``: modules whose ``@task`` declarations route jobs.
- ``DUEFLOW_<SECTION>_<FIELD>`` for the sections ``wheel``, ``emitter``, ``worker``
  and ``observability`` (e.g. ``DUEFLOW_EMITTER_SESSION_TIMEOUT_MS=3000``).
- ``DUEFLOW_KAFKA_<KEY>``: passed to librdkafka with ``_`` turned into ``.``
  (e.g. ``DUEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL``): security settings.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dueflow.errors import ConfigError
from dueflow.kafka.kafka_settings import KafkaSettings
from dueflow.rules.wheel import DEFAULT_LEVELS, WheelGeometry, WheelLevel

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_ENV_PREFIX = "DUEFLOW_"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# host, host:port, [v6], [v6]:port (lower or upper case; compared lower-cased)
_ALLOWED_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?$")
STATUS_TOKEN_MIN = 16


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue: its exec, retry-tier, DLQ and idempotency topics share ``partitions``."""

    name: str
    partitions: int = 6
    retry_tiers_ms: tuple[int, ...] = (1_000, 10_000, 60_000)
    idempotency_retention_ms: int = 7 * 24 * 3_600_000
    rate_limit_per_s: float | None = None


# Transactional ids every takeover fences (emitter.producers is at most this).
EMITTER_MAX_PRODUCERS = 4


@dataclass(frozen=True, slots=True)
class EmitterSettings:
    """The active emitter and its standbys."""

    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 1_000
    batch_max_records: int = 20_000
    # A transaction commits once every due timer fired; while a backlog is due,
    # every batch_max_records records or batch_max_ms milliseconds.
    batch_max_ms: int = 100
    # When caught up, a transaction stays open at least this long after its first
    # record (0: commit as soon as every due timer fired): fewer transactions, so
    # fewer commit markers in the exec partitions, for that much later visibility.
    # At 5k jobs/s on the 2-core machine 20 ms did not measurably lower the
    # broker's CPU, so the default keeps the lowest lateness.
    batch_min_ms: int = 0
    # Transactional producers the active emitter writes with, in turn: with 2 or
    # more it keeps firing into the next one while a commit is in flight (1: the
    # loop waits for every commit). At most 4 (every takeover fences 4 ids).
    producers: int = 2
    catchup_max_rate_per_s: float = 200_000.0
    transaction_timeout_ms: int = 10_000
    # Pending-timer gauges, DeleteRecords and the clock offset run this often.
    housekeeping_interval_ms: int = 5_000
    # Timers the emitter reads ahead into memory while a backlog drains (beyond
    # those due within one level-0 slot of the earliest): memory vs. throughput.
    heap_budget: int = 50_000
    # Cron: an occurrence fired later than this after its instant is a misfire
    # (its schedule's misfire policy decides); at most this many runs per misfire.
    misfire_grace_ms: int = 60_000
    cron_max_catchup: int = 100


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Worker processes.

    ``group_protocol``: ``consumer`` (KIP-848, Kafka 4.0+: incremental
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
    """

    concurrency: int = 64
    processes: int = 1
    group_protocol: Literal["consumer", "classic"] = "consumer"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int | None = None  # default: a third of the session, 100 ms-3 s
    shutdown_grace_s: float = 25.0
    default_timeout_s: float = 300.0
    default_max_attempts: int = 4
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

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat interval: as set, else a third of the session (100 ms to 3 s)."""
        if self.heartbeat_interval_ms is not None:
            return self.heartbeat_interval_ms
        return max(100, min(3_000, self.session_timeout_ms // 3))


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """Metrics, logs and traces."""

    metrics_port: int | None = None
    log_format: Literal["json", "text"] = "json"
    log_level: str = "INFO"
    # Worker job events: "all" logs the start and the success of every job too
    # (a few microseconds per line); "failures" only failed attempts, retries
    # and dead letters.
    job_log: Literal["all", "failures"] = "all"
    # The status view (faust app over the outcomes topic) and its HTTP server.
    status_bind: str = "127.0.0.1"
    status_port: int = 6066
    status_url: str | None = None  # where `dueflow status`/`job` ask; default from bind/port
    # Bearer token of the status view's state-changing calls (the redrive button).
    # Unset: the view makes one at start and prints the page URL with it once.
    # Required to bind beyond loopback. Never shown in repr, errors or logs.
    status_token: str | None = field(default=None, repr=False)
    # Host names (``name`` or ``name:port``) the status view answers to besides
    # the address a request arrived at (and ``localhost`` on loopback): names
    # that are not listed are refused (a DNS-rebinding defence).
    status_allowed_hosts: tuple[str, ...] = ()
    status_data_dir: str = ".dueflow/status"
    status_retention_ms: int = 7 * 24 * 3_600_000  # finished jobs leave the table after this
    cluster_refresh_ms: int = 2_000  # how often the view re-reads offsets from Kafka

    @property
    def status_base_url(self) -> str:
        """URL of the status view: ``status_url`` or ``http://<bind>:<port>``."""
        if self.status_url:
            return self.status_url.rstrip("/")
        host = "127.0.0.1" if self.status_bind in ("0.0.0.0", "") else self.status_bind
        return f"http://{host}:{self.status_port}"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a dueflow process needs to know about its cluster and topics."""

    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "dueflow"
    queues: tuple[QueueSpec, ...] = (QueueSpec("default"),)
    wheel: WheelGeometry = WheelGeometry()
    replication_factor: int = 1
    min_insync_replicas: int = 1
    schedules_partitions: int = 3
    outcomes_partitions: int = 6
    # librdkafka settings for every client; may hold passwords: the repr hides them.
    kafka: Mapping[str, str] = field(default_factory=KafkaSettings)
    # Task name or glob -> queue, in the order given (see dueflow.rules.routing).
    routes: tuple[tuple[str, str], ...] = ()
    # Modules whose @task declarations tell the SDK a task's queue.
    app: tuple[str, ...] = ()
    emitter: EmitterSettings = EmitterSettings()
    worker: WorkerSettings = WorkerSettings()
    observability: ObservabilitySettings = ObservabilitySettings()

    def __post_init__(self) -> None:
        if not isinstance(self.kafka, KafkaSettings):
            # frozen: the one place the field is replaced, by its read-only, redacting form
            object.__setattr__(self, "kafka", KafkaSettings(self.kafka))

    def queue(self, name: str) -> QueueSpec:
        """The queue called ``name``; :class:`ConfigError` if it is not configured."""
        for q in self.queues:
            if q.name == name:
                return q
        raise ConfigError("queue", name, f"one of the configured queues {self.queue_names}")

    @property
    def queue_names(self) -> list[str]:
        return [q.name for q in self.queues]

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration: bootstrap, pass-through settings, then ``extra``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        conf.update(self.kafka)
        conf.update(extra)
        return conf

    def validate(self) -> Settings:
        """Check every setting; raise :class:`ConfigError` naming the first bad one."""
        if not self.bootstrap or not all(
            re.match(r"^[^\s:,]+:\d{1,5}$", b.strip()) for b in self.bootstrap.split(",")
        ):
            raise ConfigError("bootstrap", self.bootstrap, "host:port[,host:port...]")
        if not _PREFIX_RE.match(self.topic_prefix):
            raise ConfigError("topic_prefix", self.topic_prefix, "1-100 of [A-Za-z0-9._-]")
        if not self.queues:
            raise ConfigError("queues", self.queues, "at least one queue")
        seen: set[str] = set()
        for i, q in enumerate(self.queues):
            validate_queue(q, f"queues[{i}]")
            if q.name in seen:
                raise ConfigError(f"queues[{i}].name", q.name, "a name not used by another queue")
            seen.add(q.name)
        for i, route in enumerate(self.routes):
            pattern, queue = route
            if not pattern or len(pattern) > 255:
                raise ConfigError(f"routes[{i}]", pattern, "a task name or glob of 1-255 chars")
            if not _NAME_RE.match(queue):
                raise ConfigError(
                    f"routes[{pattern}]", queue, "a queue name: 1-100 of [A-Za-z0-9_-]"
                )
        for module in self.app:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", module):
                raise ConfigError("app", module, "a dotted module name, e.g. myapp.tasks")
        self.wheel.validate()
        _positive("replication_factor", self.replication_factor)
        _positive("min_insync_replicas", self.min_insync_replicas)
        if self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                "min_insync_replicas",
                self.min_insync_replicas,
                f"at most replication_factor ({self.replication_factor})",
            )
        _positive("schedules_partitions", self.schedules_partitions)
        _positive("outcomes_partitions", self.outcomes_partitions)
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
            _positive(f"emitter.{name}", getattr(self.emitter, name))
        if not isinstance(self.emitter.batch_min_ms, int) or not (
            0 <= self.emitter.batch_min_ms <= self.emitter.batch_max_ms
        ):
            raise ConfigError(
                "emitter.batch_min_ms",
                self.emitter.batch_min_ms,
                f"an integer from 0 to emitter.batch_max_ms ({self.emitter.batch_max_ms})",
            )
        producers = self.emitter.producers
        if not isinstance(producers, int) or not 1 <= producers <= EMITTER_MAX_PRODUCERS:
            raise ConfigError(
                "emitter.producers", producers, f"an integer from 1 to {EMITTER_MAX_PRODUCERS}"
            )
        if not isinstance(self.emitter.misfire_grace_ms, int) or self.emitter.misfire_grace_ms < 0:
            raise ConfigError(
                "emitter.misfire_grace_ms", self.emitter.misfire_grace_ms, "an integer >= 0"
            )
        if self.emitter.catchup_max_rate_per_s <= 0:
            raise ConfigError(
                "emitter.catchup_max_rate_per_s", self.emitter.catchup_max_rate_per_s, "> 0"
            )
        for name in (
            "concurrency",
            "processes",
            "session_timeout_ms",
            "default_max_attempts",
            "commit_interval_ms",
            "commit_max_jobs",
            "transaction_timeout_ms",
            "fetch_batch",
            "isolated_processes",
            "max_orphaned_threads",
        ):
            _positive(f"worker.{name}", getattr(self.worker, name))
        if not self.worker.hook_timeout_s > 0:
            raise ConfigError("worker.hook_timeout_s", self.worker.hook_timeout_s, "seconds > 0")
        for name in ("shutdown_grace_s", "rebalance_grace_s", "default_timeout_s"):
            value = getattr(self.worker, name)
            if not value >= 0:
                raise ConfigError(f"worker.{name}", value, "seconds >= 0")
        if self.worker.group_protocol not in ("consumer", "classic"):
            raise ConfigError(
                "worker.group_protocol", self.worker.group_protocol, "'consumer' or 'classic'"
            )
        beat = self.worker.heartbeat_interval_ms
        if beat is not None and not 0 < beat < self.worker.session_timeout_ms:
            raise ConfigError(
                "worker.heartbeat_interval_ms",
                beat,
                f"ms > 0 and below worker.session_timeout_ms ({self.worker.session_timeout_ms})",
            )
        if self.worker.store not in ("memory", "disk"):
            raise ConfigError("worker.store", self.worker.store, "'memory' or 'disk'")
        if self.observability.log_format not in ("json", "text"):
            raise ConfigError(
                "observability.log_format", self.observability.log_format, "'json' or 'text'"
            )
        if self.observability.job_log not in ("all", "failures"):
            raise ConfigError(
                "observability.job_log", self.observability.job_log, "'all' or 'failures'"
            )
        port = self.observability.metrics_port
        if port is not None and not 0 <= port <= 65535:
            raise ConfigError("observability.metrics_port", port, "0-65535, or unset")
        if not 0 <= self.observability.status_port <= 65535:
            raise ConfigError(
                "observability.status_port", self.observability.status_port, "0-65535"
            )
        token = self.observability.status_token
        if token is not None and (len(token) < STATUS_TOKEN_MIN or token != token.strip()):
            raise ConfigError(
                "observability.status_token",
                token,
                f"at least {STATUS_TOKEN_MIN} characters without surrounding spaces, or unset "
                "(a generated one: `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)",
                secret=True,
            )
        for i, host in enumerate(self.observability.status_allowed_hosts):
            if not _ALLOWED_HOST_RE.match(host):
                raise ConfigError(
                    f"observability.status_allowed_hosts[{i}]",
                    host,
                    "a host name or address, optionally with :port (no scheme, no path)",
                )
        for name in ("status_retention_ms", "cluster_refresh_ms"):
            _positive(f"observability.{name}", getattr(self.observability, name))
        if self.observability.log_level.upper() not in _LOG_LEVELS:
            raise ConfigError(
                "observability.log_level", self.observability.log_level, " ".join(_LOG_LEVELS)
            )
        return self


def validate_queue(q: QueueSpec, where: str = "queue") -> QueueSpec:
    """Check one queue's spec; :class:`ConfigError` names ``where.<field>``."""
    if not isinstance(q.name, str) or not _NAME_RE.match(q.name):
        raise ConfigError(f"{where}.name", q.name, "1-100 of [A-Za-z0-9_-]")
    _positive(f"{where}.partitions", q.partitions)
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
    if rate is not None and not rate > 0:
        raise ConfigError(f"{where}.rate_limit_per_s", rate, "a number > 0, or unset")
    return q


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an integer >= 1")


# --------------------------------------------------------------------------- loading

_SECTIONS = ("wheel", "emitter", "worker", "observability")
_SECRET_SETTINGS = frozenset({"observability.status_token"})


def load_settings(
    *,
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge defaults, TOML file, environment and overrides into valid :class:`Settings`.

    ``overrides`` uses the same nested shape as the TOML file; ``None`` values are
    ignored so CLI flags that were not given do not override anything.
    """
    env = {} if env is None else env
    data: dict[str, Any] = {}
    path = config_file or env.get(_ENV_PREFIX + "CONFIG")
    if path:
        data = _merge(data, _read_toml(Path(path)))
    data = _merge(data, _from_env(env))
    if overrides:
        data = _merge(data, _drop_none(overrides))
    return settings_from_dict(data).validate()


def settings_from_dict(data: Mapping[str, Any]) -> Settings:
    """Build :class:`Settings` from a nested mapping (TOML shape), coercing types."""
    data = dict(data)
    if "queues" in data:
        data["queues"] = _queues(data["queues"])
    if "routes" in data:
        data["routes"] = _routes(data["routes"])
    if "wheel" in data:
        wheel = dict(data["wheel"])
        if "levels" in wheel:
            wheel["levels"] = _levels(wheel["levels"])
        if "shard" in wheel:  # a property of each emitter's session, not a setting
            raise ConfigError(
                "wheel.shard", wheel["shard"], "no value: set wheel.shards (how many) instead"
            )
        data["wheel"] = wheel
    built = _build(Settings, data, "")
    assert isinstance(built, Settings)
    return built


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError("config", str(path), "the path of an existing TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"valid TOML ({exc})") from exc


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    top = (
        {f.name for f in dataclasses.fields(Settings)}
        - set(_SECTIONS)
        - {
            "kafka",
            "queues",
            "routes",
        }
    )
    for key, value in env.items():
        if not key.startswith(_ENV_PREFIX) or key == _ENV_PREFIX + "CONFIG":
            continue
        name = key[len(_ENV_PREFIX) :].lower()
        if name == "queues":
            out["queues"] = _queues_from_text(value)
        elif name == "routes":
            out["routes"] = value
        elif name.startswith("kafka_"):
            out.setdefault("kafka", {})[name[len("kafka_") :].replace("_", ".")] = value
        elif name in top:
            out[name] = value
        else:
            for section in _SECTIONS:
                if name.startswith(section + "_"):
                    out.setdefault(section, {})[name[len(section) + 1 :]] = value
                    break
    return out


def _queues_from_text(text: str) -> list[dict[str, Any]]:
    queues: list[dict[str, Any]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, partitions = part.partition(":")
        entry: dict[str, Any] = {"name": name.strip()}
        if partitions:
            entry["partitions"] = partitions.strip()
        queues.append(entry)
    return queues


def _queues(value: Any) -> tuple[QueueSpec, ...]:
    if isinstance(value, str):
        value = _queues_from_text(value)
    if not isinstance(value, list | tuple):
        raise ConfigError("queues", value, "a list of queues or 'name[:partitions],...'")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, QueueSpec):
            out.append(item)
        elif isinstance(item, str):
            out.append(QueueSpec(item))
        elif isinstance(item, Mapping):
            q = _build(QueueSpec, item, f"queues[{i}].")
            assert isinstance(q, QueueSpec)
            out.append(q)
        else:
            raise ConfigError(f"queues[{i}]", item, "a table with at least `name`")
    return tuple(out)


def _routes(value: Any) -> tuple[tuple[str, str], ...]:
    """The route table from a TOML table, ``PATTERN=QUEUE,...`` text, or pairs."""
    accepted = "a table of task name or glob = queue, or 'PATTERN=QUEUE,...'"
    if isinstance(value, str):
        pairs = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            pattern, sep, queue = part.rpartition("=")
            if not sep or not pattern.strip():
                raise ConfigError("routes", part, accepted)
            pairs.append((pattern.strip(), queue.strip()))
        return tuple(pairs)
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError("routes", value, accepted)
    out = []
    for item in items:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise ConfigError("routes", item, accepted)
        pattern, queue = item
        if not isinstance(pattern, str) or not isinstance(queue, str):
            raise ConfigError(f"routes[{pattern}]", queue, "a queue name (a string)")
        out.append((pattern.strip(), queue.strip()))
    return tuple(out)


def _levels(value: Any) -> tuple[WheelLevel, ...]:
    if isinstance(value, str):
        # "64x1000,64x60000": slots x width_ms
        try:
            pairs = [tuple(int(x) for x in part.split("x")) for part in value.split(",")]
        except ValueError as exc:
            raise ConfigError("wheel.levels", value, "'SLOTSxWIDTH_MS,...'") from exc
        value = [list(p) for p in pairs]
    out = []
    for i, item in enumerate(value):
        if isinstance(item, WheelLevel):
            out.append(item)
        elif isinstance(item, Mapping):
            lv = _build(WheelLevel, item, f"wheel.levels[{i}].")
            assert isinstance(lv, WheelLevel)
            out.append(lv)
        elif isinstance(item, list | tuple) and len(item) == 2:
            out.append(WheelLevel(int(item[0]), int(item[1])))
        else:
            raise ConfigError(f"wheel.levels[{i}]", item, "[slots, width_ms]")
    return tuple(out) or DEFAULT_LEVELS


def _build(cls: type, data: Mapping[str, Any], path: str) -> object:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{path}{key}", value, f"one of the known settings {sorted(names)}")
        kwargs[key] = _coerce(hints[key], value, f"{path}{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - a required field is missing
        raise ConfigError(path.rstrip(".") or "settings", dict(data), str(exc)) from exc


def _coerce(tp: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        empty = value is None or (isinstance(value, str) and value.lower() in ("", "none"))
        if empty and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, name)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(name, value, "a table of settings")
        return _build(tp, value, name + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(name, value, " or ".join(repr(a) for a in args))
        return value
    if origin is tuple:
        items = (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        )
        if isinstance(value, tuple) and all(isinstance(v, QueueSpec | WheelLevel) for v in value):
            return value
        return tuple(_coerce(args[0], v, f"{name}[{i}]") for i, v in enumerate(items))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            # `kafka` holds passwords: name it, never show what was given.
            raise ConfigError(name, value, "a table of key = value strings", secret=True)
        return {str(k): str(v) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, value, "true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(name, value, "an integer")
        try:
            return int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError as exc:
            raise ConfigError(name, value, "an integer") from exc
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(name, value, "a number") from exc
    if tp is str:
        if not isinstance(value, str | int | float):
            raise ConfigError(name, value, "a string", secret=name in _SECRET_SETTINGS)
        return str(value)
    return value


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _drop_none(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            inner = _drop_none(value)
            if inner:
                out[key] = inner
        elif value is not None:
            out[key] = value
    return out
