"""Firing: how a due timer becomes a job in its exec topic (the one fire path).

Every fire goes through :meth:`Firing.at`'s function, whether the drainer fires
a timer as it reads it, from its heap, or from a slot of level 1 or up, and
the in-memory emitter of :mod:`dueflow.testing` too. A due timer of a cron
schedule goes to the :class:`CronFiring` (the keeper), which fires the
occurrence's job back through the same function.

Firing a job: when ``len(value) + len(key)`` is above the exec topic's bound
(:class:`~dueflow.streams.emitter.limits.EmitterLimits`), the exec record is
measured, and the timer is quarantined (``record too large``) instead when it
would not fit; else ``df-fired`` (and, for a timer's own record, ``df-src``)
is appended to its headers, the ``fire`` span is made (when tracing), the
record is sent with its value bytes unchanged, and its due time is noted for
the transaction (:meth:`Firing.take_fired`). The timer's own record is read
for its headers only: the hot path decodes no Avro.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import Message

from dueflow import headers as hdr
from dueflow.observability.metrics import Metrics, observe_ages
from dueflow.observability.tracing import JobTracer
from dueflow.reasons import RECORD_TOO_LARGE, with_detail
from dueflow.streams.emitter.limits import EmitterLimits

_FIRED = hdr.FIRED
_SOURCE = hdr.SOURCE


class Sender(Protocol):
    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Any, partition: int = -1
    ) -> None: ...


class Emit(Protocol):
    """Fire one job into its exec topic in the open transaction (adds df-fired and
    counts the fire); ``partition`` -1: the key's (Kafka's partitioner)."""

    def __call__(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[Any],
        due: int,
        partition: int = -1,
    ) -> None: ...


class CronFiring(Protocol):
    """What the drainer calls for a due cron occurrence instead of forwarding it."""

    def fire_occurrence(
        self,
        message: Message,
        due_ms: int,
        topic: str,
        headers: list[Any],
        now_ms: int,
        emit: Emit,
    ) -> None:
        """Handle one occurrence in the open transaction, firing through ``emit``."""


class FireTimer(Protocol):
    """Fire the timer ``message`` (at ``partition``/``offset`` of the timer topic), due
    at ``due``, into ``topic`` (exec partition ``target``; -1: by its key), with
    ``headers``, the timer's own (appended to in place). ``cron``: an occurrence of a
    schedule (handed to the keeper)."""

    def __call__(
        self,
        message: Message,
        partition: int,
        offset: int,
        due: int,
        topic: str,
        cron: bool,
        headers: list[Any],
        target: int = -1,
    ) -> None: ...


# Quarantine a timer: (message, partition, offset, reason, now_ms).
Quarantine = Callable[[Message, int, int, str, int], None]


class Firing:
    """Fires timers into exec topics and notes the due times fired, per exec topic."""

    def __init__(
        self,
        *,
        sender: Sender,
        timer_topic: str,
        partitions: int,
        limits: EmitterLimits,
        metrics: Metrics,
        quarantine: Quarantine,
        queue_of_topic: dict[str, str],
        cron: CronFiring | None = None,
        tracer: JobTracer | None = None,
        ahead_ms: int = 0,
    ) -> None:
        self._send = sender.send
        # The emitter's clock runs this far ahead (emitter.fire_ahead_ms): what a
        # fire stamps and measures is the wall clock's time of the write.
        self._ahead = ahead_ms
        self._limits = limits
        self._metrics = metrics
        self._quarantine = quarantine
        self._queue_of_topic = queue_of_topic  # kept current by the emitter (shared)
        self._cron = cron
        # Off unless OTEL_TRACES_EXPORTER says otherwise: then every fire is a span.
        self._tracer = tracer if tracer is not None and tracer.enabled else None
        # df-src value of a timer: self._sources[p] % offset.
        self._sources = [
            f"{timer_topic}:{p}:".encode().replace(b"%", b"%%") + b"%d" for p in range(partitions)
        ]
        # exec topic -> due times fired since the last take_fired (kept, cleared in place).
        self._fired: dict[str, list[int]] = {}
        self._at_ms = -1
        self._fire: FireTimer | None = None

    def take_fired(self) -> dict[str, list[int]]:
        """The due times fired since the last call, per exec topic."""
        fired = self._fired.copy()
        self._fired.clear()
        return fired

    def count_visible(
        self, fired: dict[str, list[int]], done_ms: int, *, refire_before_ms: int | None
    ) -> None:
        """Jobs fired at ``fired`` due times (per exec topic) are visible to consumers
        since ``done_ms``: count them and their lateness, and, among them, the fires
        of timers due by ``refire_before_ms`` as re-fires (None: none counted)."""
        metrics = self._metrics
        for topic, dues in fired.items():
            queue = self._queue_of_topic.get(topic, topic)
            metrics.fires.labels(queue).inc(len(dues))
            observe_ages(metrics.fire_lateness.labels(queue), done_ms, dues)
            if refire_before_ms is not None and min(dues) <= refire_before_ms:
                metrics.emitter_refires.inc(sum(1 for d in dues if d <= refire_before_ms))

    def at(self, now_ms: int) -> FireTimer:
        """The function that fires timers at ``now_ms`` (made once per clock reading)."""
        if now_ms != self._at_ms or self._fire is None:
            self._fire = self._fire_at(now_ms)
            self._at_ms = now_ms
        return self._fire

    def _fire_at(self, clock_ms: int) -> FireTimer:
        # Everything the hot path reads is a local of this closure: one call per fire.
        now_ms = clock_ms - self._ahead
        fire_pair = (_FIRED, str(now_ms).encode())
        send = self._send
        sources = self._sources
        fired = self._fired
        fast = self._limits.fast
        oversized = self._oversized
        tracer = self._tracer
        keeper = self._cron

        def fire(
            message: Message,
            partition: int,
            offset: int,
            due: int,
            topic: str,
            cron: bool,
            headers: list[Any],
            target: int = -1,
            job: tuple[bytes | None, bytes | None] | None = None,
        ) -> None:
            # job: (key, value) of the job a cron occurrence fires (its headers carry
            # df-src already); None: the timer's own record.
            if job is None:
                if cron and keeper is not None:
                    keeper.fire_occurrence(
                        message,
                        due,
                        topic,
                        headers,
                        clock_ms,
                        occurrence(message, partition, offset),
                    )
                    return
                key = message.key()
                value = message.value()
                size = len(message) + len(key)  # type: ignore[arg-type]
            else:
                key, value = job
                size = len(value or b"") + len(key or b"")
            if size > fast.get(topic, -1) and oversized(
                message, partition, offset, topic, key, value, headers, fire_pair, now_ms, job
            ):
                return
            headers.append(fire_pair)
            if job is None:
                headers.append((_SOURCE, sources[partition] % offset))
            if tracer is not None:
                step = tracer.span_for_fire(
                    headers,
                    job_id=(key or b"").decode("utf-8", "replace"),
                    queue=self._queue_of_topic.get(topic),
                    lateness_ms=now_ms - due,
                )
                headers = hdr.replace(headers, step.headers)
                step.end()
            send(topic, value, key, headers, target)
            dues = fired.get(topic)
            if dues is None:
                dues = fired[topic] = []
            dues.append(due)

        def occurrence(timer: Message, timer_partition: int, timer_offset: int) -> Emit:
            """How a cron occurrence (the timer ``timer``) fires its job: the
            occurrence is quarantined instead when the job's exec record would be too
            large (the schedule's next occurrence is placed all the same)."""

            def emit(
                topic: str,
                value: bytes | None,
                key: bytes | None,
                headers: list[Any],
                due: int,
                partition: int = -1,
            ) -> None:
                job = (key, value)
                fire(
                    timer, timer_partition, timer_offset, due, topic, False, headers, partition, job
                )

            return emit

        return fire

    def _oversized(
        self,
        message: Message,
        partition: int,
        offset: int,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[Any],
        fire_pair: tuple[str, bytes],
        now_ms: int,
        job: object,
    ) -> bool:
        """A record above the hot path's bound for ``topic``: measure its exec record
        (``headers`` and the fire headers, not added yet: ``df-fired``, and ``df-src``
        unless ``job`` is set, a cron occurrence's job, whose headers carry it already)
        and quarantine the timer when it would not fit. True: quarantined, not to be
        fired."""
        limits = self._limits
        size = len(value or b"") + len(key or b"")
        if size <= limits.fast_limit(topic, now_ms):
            return False  # the bound was not known yet
        fired = [*headers, fire_pair]
        if job is None:
            fired.append((_SOURCE, self._sources[partition] % offset))
        why = limits.too_large(topic, key, value, fired, what="exec record")
        if why is None:
            return False
        self._quarantine(message, partition, offset, with_detail(RECORD_TOO_LARGE, why), now_ms)
        self._metrics.too_large.labels("emitter", "exec record").inc()
        return True
