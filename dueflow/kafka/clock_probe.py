"""Measure this process's clock against the broker's (I/O edge of dueflow.rules.clock_offset).

Once a second a daemon thread produces an empty record to ``<prefix>.clock``
(one partition, ``LogAppendTime``, short retention) and reads the broker's
append time from the acknowledgement; :class:`~dueflow.rules.clock_offset.ClockOffset`
turns the samples into bounds of the offset. The emitter and the workers
read their "now" through it (:meth:`ClockProbe.due_now_ms`), so a process
whose clock runs ahead never starts a job early.

If the topic is missing (a deployment whose topics predate it) or is not
``LogAppendTime``, the probe says so once in the log and the offset stays 0:
the process trusts its own clock, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Producer

from dueflow.config import Settings
from dueflow.kafka.fatal import served
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.rules.clock_offset import ClockOffset
from dueflow.wall_clock import wall_ms

_LOG = logging.getLogger("dueflow.rules.clock_offset")


class ClockProbe:
    """Samples the broker's clock every ``interval_s`` on a daemon thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        interval_s: float = 1.0,
        offset: ClockOffset | None = None,
        component: str = "dueflow",
    ) -> None:
        self._settings = settings
        self._topic = names(settings).clock
        self._interval_s = interval_s
        self.offset = offset or ClockOffset()
        self._component = component
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._gauge: Any = None

    def report_to(self, gauge: Any) -> None:
        """Set ``gauge`` (seconds, local minus broker) after every sample."""
        self._gauge = gauge

    def start(self) -> ClockProbe:
        self._thread = threading.Thread(target=self._main, name="dueflow-clock", daemon=True)
        self._thread.start()
        return self

    def wait_first(self, timeout_s: float = 5.0) -> bool:
        """Block until the first sample (or the probe gave up on this topic)."""
        return self._first.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)

    # ------------------------------------------------------------------ now

    def due_now_ms(self) -> int:
        """The earliest the broker's clock can read now: compare due times with it."""
        return wall_ms() - self.offset.upper

    def stamp_now_ms(self) -> int:
        """The latest the broker's clock can read now: base "not before" stamps on it."""
        return wall_ms() - self.offset.lower

    # ------------------------------------------------------------------ thread

    def _main(self) -> None:
        producer = Producer(
            self._settings.client_config(
                **{
                    "acks": 1,
                    "enable.idempotence": False,
                    "linger.ms": 0,
                    "message.timeout.ms": 5_000,
                    "log_level": 0,  # the worker's own clients report the broker's state
                }
            )
        )
        try:
            while not self._stop.is_set():
                self._sample(producer)
                self._stop.wait(self._interval_s)
        finally:
            served(producer.flush, 1.0)

    def _sample(self, producer: Producer) -> None:
        sent = wall_ms()

        def delivered(err: KafkaError | None, msg: Any) -> None:
            acked = wall_ms()
            if err is not None:
                if err.code() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError._UNKNOWN_TOPIC,
                ):
                    self._give_up(f"topic {self._topic} does not exist")
                return
            kind, appended = msg.timestamp()
            if kind != TIMESTAMP_LOG_APPEND_TIME:
                self._give_up(f"topic {self._topic} is not LogAppendTime")
                return
            self.offset.add(sent_ms=sent, appended_ms=appended, acked_ms=acked)
            if self._gauge is not None:
                self._gauge.set(self.offset.upper / 1000.0)
            self._first.set()

        try:
            producer.produce(self._topic, b"", self._component.encode(), on_delivery=delivered)
        except BufferError:
            return
        deadline = time.monotonic() + 5.0
        while (
            served(producer.flush, 0.1) and time.monotonic() < deadline and not self._stop.is_set()
        ):
            pass

    def _give_up(self, why: str) -> None:
        self._first.set()  # nothing to wait for
        if not self._warned:
            self._warned = True
            event(
                _LOG,
                "clock offset not measured: trusting the local clock",
                logging.WARNING,
                reason=why,
                fix="dueflow topics ensure",
            )
