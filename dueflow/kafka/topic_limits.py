"""The record size limits of a queue's topics, read from the cluster (I/O edge).

:class:`TopicLimits` asks for the ``max.message.bytes`` of every topic a job
of a queue goes to (timers, ``exec.<queue>``, its retry tiers,
``dlq.<queue>``, quarantine) in one ``describe_configs`` call, the first time
the queue is asked for, and keeps the answer (:meth:`TopicLimits.forget`
drops it, to be read again: the emitter does after a record was refused as
too large). The producers' ``message.max.bytes`` is the one dueflow gives
them (:func:`producer_max_bytes`). :class:`BudgetBook` keeps a
:class:`~dueflow.records.size_budget.JobBudget` per queue made from them.

A topic that cannot be described (missing, not allowed) counts with the
broker's default limit, and the reason is logged once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from dueflow.config import QueueSpec, Settings
from dueflow.kafka.clients import make_admin, producer_config
from dueflow.kafka.topics import SET_ASIDE_HEADROOM, TopicNames, names
from dueflow.observability.logs import event
from dueflow.records.size_budget import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PRODUCER_MAX_MESSAGE_BYTES,
    JobBudget,
    QueueLimits,
    TopicLimit,
)

log = logging.getLogger("dueflow.kafka.limits")


# What Kafka and librdkafka answer for a record or batch larger than a limit.
TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


def is_too_large(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an error it wraps) is a Kafka "too large" error
    (MSG_SIZE_TOO_LARGE / MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KafkaException) and exc.args:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() in TOO_LARGE_CODES:
                return True
        exc = getattr(exc, "cause", None) or exc.__cause__
        seen += 1
    return False


def producer_max_bytes(settings: Settings) -> int:
    """``message.max.bytes`` of the producers dueflow makes with ``settings``."""
    return int(producer_config(settings)["message.max.bytes"])


def default_limits(
    settings: Settings,
    spec: QueueSpec,
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    timers_max_bytes: int | None = None,
) -> QueueLimits:
    """The limits of a cluster whose topics ``dueflow topics ensure`` created on a
    broker with the default ``max.message.bytes``: ``max_bytes``, and
    :data:`~dueflow.kafka.topics.SET_ASIDE_HEADROOM` more for the DLQ and quarantine
    (the in-memory pipeline's limits, and what counts before a topic is read)."""
    return default_limits_of(
        names(settings),
        spec,
        max_bytes=max_bytes,
        timers_max_bytes=timers_max_bytes,
        producer_max_bytes=producer_max_bytes(settings),
    )


def default_limits_of(
    n: TopicNames,
    spec: QueueSpec,
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    timers_max_bytes: int | None = None,
    producer_max_bytes: int = PRODUCER_MAX_MESSAGE_BYTES,
) -> QueueLimits:
    """:func:`default_limits` from topic names and the producers' limit (pure)."""
    set_aside = max_bytes + SET_ASIDE_HEADROOM
    return QueueLimits(
        spec.name,
        TopicLimit(n.timers, max_bytes if timers_max_bytes is None else timers_max_bytes),
        TopicLimit(n.exec(spec.name), max_bytes),
        tuple(TopicLimit(n.retry(spec.name, t), max_bytes) for t in spec.retry_tiers_ms),
        TopicLimit(n.dlq(spec.name), set_aside),
        TopicLimit(n.quarantine, set_aside),
        producer_max_bytes,
    )


def queue_topic_names(n: TopicNames, spec: QueueSpec) -> list[str]:
    """The topics a job of ``spec`` goes to, in the order of :class:`QueueLimits`."""
    return [
        n.timers,
        n.exec(spec.name),
        *(n.retry(spec.name, t) for t in spec.retry_tiers_ms),
        n.dlq(spec.name),
        n.quarantine,
    ]


class TopicLimits:
    """``max.message.bytes`` of a queue's topics: one ``describe_configs`` call per
    queue, kept until :meth:`forget`. Thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        admin: Callable[[], AdminClient] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._settings = settings
        self._names = names(settings)
        self._make_admin = admin or (lambda: make_admin(settings))
        self._admin: AdminClient | None = None
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._known: dict[str, QueueLimits] = {}
        self._warned: set[str] = set()
        self.reads = 0  # describe_configs calls made (for tests)

    def cached(self, queue: str) -> QueueLimits | None:
        return self._known.get(queue)

    def of(self, spec: QueueSpec) -> QueueLimits:
        """The limits of ``spec``'s topics (read once, then kept)."""
        found = self._known.get(spec.name)
        if found is not None:
            return found
        with self._lock:
            found = self._known.get(spec.name)
            if found is None:
                found = self._known[spec.name] = self._read(spec)
        return found

    def forget(self, queue: str | None = None) -> None:
        """Read the limits again on the next ask (of ``queue``, or of every queue)."""
        with self._lock:
            if queue is None:
                self._known.clear()
            else:
                self._known.pop(queue, None)

    def _read(self, spec: QueueSpec) -> QueueLimits:
        topics = queue_topic_names(self._names, spec)
        found = self.describe(topics)
        limits = [found.get(t, DEFAULT_MAX_MESSAGE_BYTES) for t in topics]
        tiers = len(spec.retry_tiers_ms)
        return QueueLimits(
            spec.name,
            TopicLimit(topics[0], limits[0]),
            TopicLimit(topics[1], limits[1]),
            tuple(
                TopicLimit(t, m)
                for t, m in zip(topics[2 : 2 + tiers], limits[2 : 2 + tiers], strict=True)
            ),
            TopicLimit(topics[-2], limits[-2]),
            TopicLimit(topics[-1], limits[-1]),
            producer_max_bytes(self._settings),
        )

    def describe(self, topics: list[str]) -> dict[str, int]:
        """``max.message.bytes`` of each of ``topics`` that could be described."""
        self.reads += 1
        out: dict[str, int] = {}
        try:
            if self._admin is None:
                self._admin = self._make_admin()
            resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
            futures = self._admin.describe_configs(resources, request_timeout=self._timeout)
        except (KafkaException, ValueError) as exc:
            self._warn("*", exc)
            return out
        for res, future in futures.items():
            try:
                entries: dict[str, Any] = future.result(self._timeout)
            except KafkaException as exc:
                self._warn(res.name, exc)
                continue
            except Exception as exc:  # a timeout of the future, ...
                self._warn(res.name, exc)
                continue
            entry = entries.get("max.message.bytes")
            if entry is not None and entry.value:
                out[res.name] = int(entry.value)
        return out

    def _warn(self, topic: str, exc: BaseException) -> None:
        if topic in self._warned:
            return
        self._warned.add(topic)
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        missing = isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        event(
            log,
            "topic limit not read: the broker's default counts",
            logging.WARNING,
            topic=topic,
            max_bytes=DEFAULT_MAX_MESSAGE_BYTES,
            error="the topic does not exist" if missing else str(exc),
        )


class BudgetBook:
    """A :class:`JobBudget` per queue, made from its limits on first use."""

    def __init__(self, limits: Callable[[str], QueueLimits]) -> None:
        self._limits = limits
        self._budgets: dict[str, JobBudget] = {}

    def __call__(self, queue: str) -> JobBudget:
        found = self._budgets.get(queue)
        if found is None:
            found = self._budgets[queue] = JobBudget(self._limits(queue))
        return found

    def cached(self, queue: str) -> JobBudget | None:
        return self._budgets.get(queue)

    def forget(self, queue: str | None = None) -> None:
        if queue is None:
            self._budgets.clear()
        else:
            self._budgets.pop(queue, None)
