"""Read the queue registry (I/O edge of :mod:`dueflow.records.queue_registry`).

:class:`QueueRegistryReader` is an assign-only, read_committed consumer of
``<prefix>.queues`` (one partition, from the beginning) that folds every
record into a :class:`~dueflow.records.queue_registry.QueueCatalog`. One thread
uses it at a time: the emitter calls :meth:`~QueueRegistryReader.poll` from
its loop; the SDK and the workers run it on a thread of its own
(:class:`QueueWatcher`). :meth:`~QueueRegistryReader.catch_up` reads up to
the end the topic has now, which is how a process makes sure it knows a queue
that was created a moment ago before it calls it unknown.

A record that is no queue is logged and remembered in ``bad`` (at most
:data:`MAX_REMEMBERED_BAD`); it changes nothing. The active emitter
quarantines those (``<prefix>.quarantine``, once per record); other
processes only skip them. A registry topic that does not exist (a cluster
whose topics predate the registry) leaves the static queues only, with a
warning: ``dueflow topics ensure`` creates it. The client answers "missing" also
while the partition's leader is down; the metadata tells the two apart, and a
topic it names is asked again until the read's deadline.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from dueflow.config import QueueSpec, Settings
from dueflow.errors import UndecodableRecord
from dueflow.kafka.clients import make_consumer
from dueflow.kafka.reading import topic_exists
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.records.queue_registry import QueueCatalog, QueueConflict, QueueView

log = logging.getLogger("dueflow.queues")

MAX_REMEMBERED_BAD = 1_000
_MISSING = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION)


@dataclass(frozen=True, slots=True)
class BadQueueRecord:
    """A registry record that is no queue, and why."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    reason: str


class QueueRegistryReader:
    """The queue registry, folded into a catalog; one thread at a time."""

    def __init__(
        self,
        settings: Settings,
        *,
        group: str | None = None,
        static: Sequence[QueueSpec] | None = None,
        component: str = "",
    ) -> None:
        self._settings = settings
        self.topic = names(settings).queues
        self._group = group or f"{settings.topic_prefix}.queues.reader"
        self._component = component
        self.catalog = QueueCatalog(settings.queues if static is None else static)
        self.bad: list[BadQueueRecord] = []
        self.position = 0  # the next offset to read
        self.missing = False  # the topic was not found (last time it was asked)
        self._changes: set[str] = set()
        self._logged: set[QueueConflict] = set()
        self._consumer: Consumer | None = None

    @property
    def view(self) -> QueueView:
        return self.catalog.view

    @property
    def started(self) -> bool:
        return self._consumer is not None

    def start(self) -> None:
        self._consumer = make_consumer(
            self._settings,
            self._group,  # assign-only: never joined, nothing committed
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 100},
        )
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])

    def take_changes(self) -> set[str]:
        """Names of the queues whose spec changed since the last call."""
        changes, self._changes = self._changes, set()
        return changes

    def poll(self, timeout_s: float = 0.0) -> set[str]:
        """Read what arrived (waiting up to ``timeout_s`` for the first record);
        the names of the queues that changed (also kept for :meth:`take_changes`)."""
        consumer = self._consumer
        if consumer is None:
            return set()
        first = consumer.poll(timeout_s)
        if first is None:
            return set()
        changed: set[str] = set()
        for msg in [first, *consumer.consume(500, 0)]:
            self._apply(msg, changed)
        if changed:
            self._changes |= changed
            self._log_conflicts()
        return changed

    def catch_up(self, timeout_s: float = 10.0) -> bool:
        """Read up to the end the topic has now; False when it could not (the topic is
        missing, the broker does not answer in time): the view is then what was read."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        tp = TopicPartition(self.topic, 0)
        while True:
            try:
                _low, high = consumer.get_watermark_offsets(
                    tp, timeout=max(0.1, deadline - time.monotonic()), cached=False
                )
                break
            except KafkaException as exc:
                missing = self._missing(consumer, exc, deadline)
                if not missing and time.monotonic() < deadline:
                    time.sleep(0.1)  # e.g. "not leader" while a new topic settles
                    continue
                self._unreadable(exc, missing)
                return False
        self.missing = False
        while self.position < high:
            if time.monotonic() > deadline:
                event(
                    log,
                    "queue registry not read to its end in time",
                    logging.WARNING,
                    topic=self.topic,
                    at=self.position,
                    end=high,
                )
                return False
            self.poll(0.05)
            if self.position < high:
                # Transaction markers (a transactional writer) are never delivered.
                (pos,) = consumer.position([tp])
                self.position = max(self.position, pos.offset)
        return True

    def _missing(self, consumer: Consumer, exc: KafkaException, deadline: float) -> bool:
        """Whether ``exc`` says the topic does not exist. The client answers so also
        while the partition's leader is down; the metadata tells the two apart."""
        err = exc.args[0] if exc.args else None
        if not (isinstance(err, KafkaError) and err.code() in _MISSING):
            return False
        try:
            return not topic_exists(consumer, self.topic, max(0.1, deadline - time.monotonic()))
        except KafkaException:
            return False  # the metadata did not answer either: the broker is away

    def _unreadable(self, exc: KafkaException, missing: bool) -> None:
        if missing:
            if not self.missing:
                event(
                    log,
                    "queue registry topic missing: only the static queues are known "
                    "(create it with `dueflow topics ensure`)",
                    logging.WARNING,
                    topic=self.topic,
                    component=self._component,
                )
            self.missing = True
            return
        event(log, "queue registry not read", logging.WARNING, topic=self.topic, error=str(exc))

    def _apply(self, msg: Any, changed: set[str]) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self.position = max(self.position, msg.offset())
            elif err.code() in _MISSING:
                self.missing = True
            else:
                event(log, "queue registry consumer error", logging.WARNING, error=str(err))
            return
        offset = msg.offset()
        self.position = max(self.position, offset + 1)
        headers = msg.headers()
        try:
            name = self.catalog.apply(msg.key(), msg.value(), headers, offset=offset)
        except UndecodableRecord as exc:
            self._remember(msg, headers, str(exc))
            return
        if name is not None:
            changed.add(name)
            spec = self.catalog.view.get(name)
            event(
                log,
                "queue registered" if spec is not None else "queue removed from the registry",
                queue=name,
                component=self._component,
                **({"partitions": spec.partitions} if spec is not None else {}),
            )

    def _remember(self, msg: Any, headers: Any, reason: str) -> None:
        event(
            log,
            "bad queue registry record skipped",
            logging.WARNING,
            reason=reason,
            offset=msg.offset(),
            component=self._component,
        )
        if len(self.bad) < MAX_REMEMBERED_BAD:
            pairs = list(headers.items()) if isinstance(headers, dict) else headers
            self.bad.append(
                BadQueueRecord(
                    msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value(), pairs, reason
                )
            )

    def _log_conflicts(self) -> None:
        conflicts = set(self.catalog.view.conflicts)
        for conflict in sorted(conflicts - self._logged, key=str):
            event(log, "queue spec conflict", logging.WARNING, conflict=str(conflict))
        self._logged = conflicts

    def log_conflicts(self) -> None:
        """Log the conflicts of the view not logged yet (call after the first read)."""
        self._log_conflicts()

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


class QueueWatcher:
    """A :class:`QueueRegistryReader` on a daemon thread of its own.

    ``on_change(view, changed)`` runs on that thread (or on the caller's, for
    :meth:`refresh`) after queues changed; keep it short and thread-safe.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        on_change: Callable[[QueueView, set[str]], None] | None = None,
        component: str = "",
        poll_s: float = 0.2,
    ) -> None:
        self.reader = QueueRegistryReader(settings, component=component)
        self._on_change = on_change
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def view(self) -> QueueView:
        return self.reader.view

    def start(self, timeout_s: float = 10.0) -> bool:
        """Read the registry to its end, then follow it; False: the first read failed
        (the static queues only, until the topic can be read)."""
        with self._lock:
            self.reader.start()
            caught_up = self.reader.catch_up(timeout_s)
            self.reader.log_conflicts()
            changes = self.reader.take_changes()
        self._notify(changes)
        self._thread = threading.Thread(target=self._main, name="dueflow-queues", daemon=True)
        self._thread.start()
        return caught_up

    def refresh(self, timeout_s: float = 5.0) -> bool:
        """Read the registry to its current end now (from any thread)."""
        with self._lock:
            if not self.reader.started:
                return False
            caught_up = self.reader.catch_up(timeout_s)
            changes = self.reader.take_changes()
        self._notify(changes)
        return caught_up

    def knows(self, queue: str, timeout_s: float = 5.0) -> bool:
        """Whether ``queue`` exists, after reading the registry to its end if it
        is not known yet."""
        if queue in self.view:
            return True
        self.refresh(timeout_s)
        return queue in self.view

    def _main(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self.reader.started:
                    return
                self.reader.poll(self._poll_s)
                changes = self.reader.take_changes()
            self._notify(changes)
            # Let a refresh() waiting for the lock have it.
            self._stop.wait(0.001)

    def _notify(self, changes: set[str]) -> None:
        if changes and self._on_change is not None:
            self._on_change(self.view, changes)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        with self._lock:
            self.reader.close()


def read_registry(settings: Settings, timeout_s: float = 5.0) -> QueueRegistryReader:
    """The registry read once to its end (a closed reader: ``view``, ``bad``,
    ``missing``); for commands that run once."""
    reader = QueueRegistryReader(settings, group=f"{settings.topic_prefix}.ops")
    reader.start()
    try:
        reader.catch_up(timeout_s)
    finally:
        reader.close()
    return reader


def with_registered_queues(settings: Settings, timeout_s: float = 5.0) -> Settings:
    """``settings`` whose queues are the merged view: static + registry (registry wins)."""
    view = read_registry(settings, timeout_s).view
    return dataclasses.replace(settings, queues=tuple(view.specs.values()))
