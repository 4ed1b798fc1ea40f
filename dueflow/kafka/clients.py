"""Factories for confluent-kafka clients with dueflow's defaults (I/O edge).

Every client dueflow creates goes through here, so security settings from
:class:`~dueflow.config.Settings` reach all of them and defaults live in one
place.

A command-line run wraps its work in :func:`client_scope`: every client made
inside it sends librdkafka's log lines to a :class:`ClientLog` (each distinct
line once, instead of a ``%3|...|FAIL|...`` line per reconnect attempt), and
the cluster is probed once (:func:`probe_cluster`) before the first client
connects, so an unreachable bootstrap fails in about a second with one clear
error instead of after the first operation's 15-60 s timeout. Outside a scope
(library use, long-running processes) clients are made as before.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from dueflow.config import Settings
from dueflow.errors import ClusterUnreachable, KafkaOperationError
from dueflow.records.size_budget import PRODUCER_MAX_MESSAGE_BYTES

# The exec partition of a job is chosen by its key. murmur2 is the hash of
# Java's default partitioner, so every Kafka client agrees on it.
PARTITIONER = "murmur2_random"


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "compression.type": "lz4",
        "partitioner": PARTITIONER,
        "queue.buffering.max.messages": 500_000,
    }
    if "message.max.bytes" not in settings.kafka:
        # Above every topic's limit, so that a record the topic takes can be sent
        # (librdkafka's default, 1,000,000, is below the broker's 1,048,588): the
        # topics' max.message.bytes is the limit (dueflow.records.size_budget).
        conf["message.max.bytes"] = PRODUCER_MAX_MESSAGE_BYTES
    conf.update(extra)
    return settings.client_config(**conf)


def make_producer(settings: Settings, **extra: Any) -> Producer:
    """An idempotent producer (acks=all)."""
    return Producer(_scoped(settings, producer_config(settings, **extra)))


def make_transactional_producer(
    settings: Settings, transactional_id: str, **extra: Any
) -> Producer:
    """A transactional producer; the caller runs ``init_transactions``."""
    conf = producer_config(settings, **{"transactional.id": transactional_id, **extra})
    return Producer(_scoped(settings, conf))


def consumer_config(settings: Settings, group_id: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "range",
    }
    conf.update(extra)
    if conf.get("group.protocol") == "consumer":
        # KIP-848: the broker assigns (group.remote.assignor); librdkafka refuses this.
        del conf["partition.assignment.strategy"]
    return settings.client_config(**conf)


def make_consumer(settings: Settings, group_id: str, **extra: Any) -> Consumer:
    """A read_committed consumer with manual commits and range assignment."""
    return Consumer(_scoped(settings, consumer_config(settings, group_id, **extra)))


def make_admin(settings: Settings, **extra: Any) -> AdminClient:
    return AdminClient(_scoped(settings, settings.client_config(**extra)))


def cluster_id_of(admin: AdminClient, timeout_s: float = 10.0) -> str | None:
    """The Kafka cluster's id (from metadata); None when the broker does not say."""
    try:
        cluster_id = admin.list_topics(timeout=timeout_s).cluster_id
    except KafkaException as exc:
        raise kafka_error("reading the cluster metadata", exc) from exc
    return str(cluster_id) if cluster_id else None


def kafka_error(what: str, exc: BaseException) -> KafkaOperationError:
    """Wrap a client exception, keeping the original and its retriability."""
    err = KafkaOperationError(f"{what}: {exc}", cause=exc)
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err.retriable = bool(exc.args[0].retriable())
    return err


# ----------------------------------------------------------------- client logs

# What varies between two reports of the same problem: the client's name
# (rdkafka#producer-3), durations ("after 12ms"), counts of suppressed lines.
_VARYING = re.compile(
    r"\s*\(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)"
    r"|rdkafka#\w+-\d+|\d+ms"
)


# A broker that is still starting up, which librdkafka waits out by itself: not a
# problem to report unless asked (``verbose``). E.g. "Failed to acquire
# idempotence PID from broker ...: Broker: Coordinator load in progress: retrying".
_PASSING = re.compile(
    r"(Coordinator load in progress|Coordinator not available|Not coordinator)\b.*: retrying$"
)


def log_line_key(fac: str, message: str) -> tuple[str, str]:
    """What makes two librdkafka log lines "the same": facility and message, with the
    parts that change from one attempt to the next removed (pure)."""
    return fac, _VARYING.sub("", message).strip()


class ClientLog:
    """A librdkafka ``logger``: each distinct line once, or every line when ``verbose``.

    librdkafka writes a line per failed connection attempt, several a second
    per client while a broker is down; this keeps the first of each kind (a
    real error, such as a failed TLS handshake, still shows) and counts the
    rest. A line about a coordinator that is still loading, which librdkafka
    retries by itself, is counted and not shown. ``emit(level, text)``
    receives what is kept (default: the ``dueflow.kafka`` logger). librdkafka
    calls :meth:`log` from the thread that polls the client, so it is
    thread-safe.
    """

    def __init__(
        self,
        *,
        verbose: bool = False,
        emit: Callable[[int, str], None] | None = None,
    ) -> None:
        self.verbose = verbose
        self._emit = emit or logging.getLogger("dueflow.kafka").log
        self._seen: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """Called by librdkafka as ``log(level, "%s [%s] %s", fac, client, message)``."""
        fac, client, message = (str(a) for a in (*args, "", "", "")[:3])
        key = log_line_key(fac, message)
        with self._lock:
            count = self._seen.get(key, 0)
            self._seen[key] = count + 1
        if self.verbose or (count == 0 and not _PASSING.search(message)):
            self._emit(level, f"{fac} [{client}] {message}")

    @property
    def suppressed(self) -> int:
        """Lines not emitted (repeats of one already shown)."""
        with self._lock:
            return sum(n - 1 for n in self._seen.values())

    def distinct(self) -> list[tuple[str, str]]:
        """Each kind of line seen, as :func:`log_line_key` gives it, in order."""
        with self._lock:
            return list(self._seen)


# ----------------------------------------------------------------- the probe

# librdkafka reports these when no broker of the bootstrap list can be reached.
_UNREACHABLE = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})
_BROKER_PREFIX = re.compile(r"^\S+/(bootstrap|\d+): ")
_ATTEMPT_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)$")


def is_unreachable(exc: BaseException) -> bool:
    """True for a client error that means the cluster could not be reached at all."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and err.code() in _UNREACHABLE


def probe_cluster(
    settings: Settings,
    *,
    timeout_s: float = 4.0,
    settle_s: float = 0.5,
    log: ClientLog | None = None,
) -> None:
    """Check that the cluster at ``settings.bootstrap`` answers a metadata request.

    Raises :class:`~dueflow.errors.ClusterUnreachable` with librdkafka's reason
    (connection refused, name not resolved, TLS or SASL failure, ...) when it
    does not answer within ``timeout_s``, or sooner: once every bootstrap
    server has been reported down and ``settle_s`` have passed (a refused
    connection does not get better by waiting). Its log lines go to ``log``
    (default: nowhere; the error carries the reason).
    """
    errors: list[KafkaError] = []
    lines = _FailLines(log)  # the connection failures may say why
    admin = AdminClient(
        settings.client_config(
            logger=lines,
            error_cb=errors.append,
            **{"socket.connection.setup.timeout.ms": max(1000, int(timeout_s * 1000))},
        )
    )
    started = time.monotonic()
    deadline = started + timeout_s
    last: KafkaException | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            admin.list_topics(timeout=max(0.05, min(0.25, left)))
            return
        except KafkaException as exc:
            last = exc
        admin.poll(0)  # serves error_cb (and the log lines)
        now = time.monotonic()
        down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors)
        if now >= deadline or (down and now - started >= settle_s):
            reason = _reason(errors, last, timeout_s)
            hint = security_hint(
                str(settings.kafka.get("security.protocol", "PLAINTEXT")),
                lines.failures,
            )
            raise ClusterUnreachable(
                settings.bootstrap,
                f"{reason}; {hint}" if hint else reason,
                waited_s=now - started,
                refused=bool(hint) or any(e.code() in _REFUSALS for e in errors),
            )


# Errors of a cluster that answered and said no.
_REFUSALS = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._SSL,
    }
)


def wait_for_cluster(
    settings: Settings,
    *,
    timeout_s: float,
    say: Callable[[str], None],
    log: ClientLog | None = None,
    clock: Callable[[], float] = time.monotonic,
    probe: Callable[..., None] | None = None,
) -> None:
    """:func:`probe_cluster` again until the cluster answers, for services (a
    worker, an emitter) started beside a cluster that may be restarting: the
    first refusal is said once through ``say``; after ``timeout_s`` the last
    :class:`~dueflow.errors.ClusterUnreachable` is raised."""
    probe = probe or probe_cluster
    deadline = clock() + timeout_s
    said = False
    while True:
        left = deadline - clock()
        try:
            probe(settings, timeout_s=max(0.5, min(4.0, left)), log=log)
            if said:
                say(f"the Kafka cluster at {settings.bootstrap} answers")
            return
        except ClusterUnreachable as exc:
            if exc.refused or clock() >= deadline:  # a wrong password stays wrong
                raise
            if not said:
                say(
                    f"the Kafka cluster at {settings.bootstrap} does not answer yet "
                    f"({exc.reason}); waiting up to {timeout_s:g} s"
                )
                said = True
            time.sleep(min(1.0, max(0.0, deadline - clock())))


class _FailLines:
    """A librdkafka logger that keeps the first connection failures (FAIL lines) as
    they are, and hands every line on to ``log`` (if any)."""

    KEEP = 20

    def __init__(self, log: ClientLog | None) -> None:
        self._log = log
        self.failures: list[str] = []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if args and args[0] == "FAIL" and len(args) >= 3 and len(self.failures) < self.KEEP:
            self.failures.append(str(args[2]))
        if self._log is not None:
            self._log.log(level, fmt, *args)


# A listener that expects TLS closes a connection whose first bytes are not a TLS
# ClientHello: librdkafka sees the peer close while it waits for ApiVersions and says
# no more than that (the other way round it asks "connecting to a PLAINTEXT broker
# listener?" itself).
_CLOSED_BEFORE_ANSWER = re.compile(r"connection closed by peer.*state APIVERSION_QUERY")


def security_hint(protocol: str, failures: list[str]) -> str | None:
    """What to check when the connections failed as ``failures`` (librdkafka's FAIL log
    lines) say, for a client of ``security.protocol`` ``protocol`` (pure)."""
    tls = protocol.strip().upper() in ("SSL", "SASL_SSL")
    if not tls and any(_CLOSED_BEFORE_ANSWER.search(f) for f in failures):
        return (
            "the broker closed the connection before answering: the port may expect TLS "
            f"(security.protocol is {protocol.upper()}); set DUEFLOW_KAFKA_SECURITY_PROTOCOL "
            "(e.g. SASL_SSL) and its SASL and CA settings, as `dueflow broker env` prints "
            "them for the local broker"
        )
    return None


def _reason(errors: list[KafkaError], last: KafkaException | None, timeout_s: float) -> str:
    """The most telling of the errors seen: a broker's own (refused, TLS, SASL) first."""
    for err in errors:
        if err.code() != KafkaError._ALL_BROKERS_DOWN:
            text = _ATTEMPT_SUFFIX.sub("", _BROKER_PREFIX.sub("", err.str()))
            if text:
                return text
    if last is not None and last.args and isinstance(last.args[0], KafkaError):
        if last.args[0].code() == KafkaError._TIMED_OUT:
            return f"no answer within {timeout_s:g} s"
        return str(last.args[0].str())
    return f"no answer within {timeout_s:g} s"


# ----------------------------------------------------------------- the scope


@dataclass
class ClientScope:
    """What every client made inside :func:`client_scope` gets."""

    log: ClientLog
    probe: Callable[[Settings], None] | None = None
    probed: set[str] = field(default_factory=set)


_SCOPE: ContextVar[ClientScope | None] = ContextVar("dueflow_client_scope", default=None)


@contextlib.contextmanager
def client_scope(
    log: ClientLog, *, probe: Callable[[Settings], None] | None = probe_cluster
) -> Iterator[ClientScope]:
    """Clients made in this block (this thread and tasks started from it) log through
    ``log``, and ``probe(settings)`` runs once per bootstrap list before the first of
    them is made (it raises to stop the command). The CLI runs each command in one."""
    scope = ClientScope(log, probe)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def check_cluster(settings: Settings) -> None:
    """Run the scope's probe now (once per bootstrap list), if a scope is active:
    for commands that start processes rather than clients (worker, emitter)."""
    scope = _SCOPE.get()
    if scope is not None and scope.probe is not None and settings.bootstrap not in scope.probed:
        scope.probe(settings)
        scope.probed.add(settings.bootstrap)


def _scoped(settings: Settings, conf: dict[str, Any]) -> dict[str, Any]:
    scope = _SCOPE.get()
    if scope is None:
        return conf
    check_cluster(settings)
    conf.setdefault("logger", scope.log)
    return conf
