"""Set malformed records aside (``<prefix>.quarantine``) instead of dying on them."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Producer

from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.reasons import reason_label
from dueflow.records import codec

_LOG = logging.getLogger("dueflow.worker")


class Quarantine:
    """Writes :mod:`quarantined.avsc` records; the producer is created on first use."""

    def __init__(self, settings: Settings, metrics: Metrics, *, component: str) -> None:
        self._settings = settings
        self._metrics = metrics
        self._component = component
        self._topic = names(settings).quarantine
        self._producer: Producer | None = None

    def put(self, msg: Any, reason: str) -> None:
        """Quarantine confluent-kafka message ``msg`` with ``reason`` (never raises).

        ``reason``: one of :data:`dueflow.reasons.QUARANTINE_REASONS`, with a detail
        (:func:`dueflow.reasons.with_detail`) or not."""
        self.put_raw(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            key=msg.key(),
            value=msg.value(),
            headers=msg.headers(),
            reason=reason,
        )

    def put_raw(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        reason: str,
    ) -> None:
        """Quarantine a record given by its parts (never raises)."""
        self._metrics.quarantined.labels(self._component, reason_label(reason)).inc()
        event(
            _LOG,
            "record quarantined",
            logging.WARNING,
            reason=reason,
            topic=topic,
            partition=partition,
            offset=offset,
        )
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        try:
            if self._producer is None:
                self._producer = make_producer(self._settings)
            record = codec.encode(
                "quarantined",
                {
                    "reason": reason,
                    "component": self._component,
                    "source_topic": topic,
                    "source_partition": partition,
                    "source_offset": offset,
                    "at_ms": int(time.time() * 1000),
                    "key": key,
                    "value": value,
                    "headers": {k: v for k, v in pairs if isinstance(v, bytes)},
                },
            )
            self._producer.produce(
                self._topic,
                record,
                key,
                headers=[("df-schema", codec.schema_header("quarantined"))],
            )
            served(self._producer.poll, 0)
        except Exception as exc:  # quarantine is best effort: the record is counted and logged
            event(_LOG, "quarantine write failed", logging.ERROR, error=str(exc))

    def close(self) -> None:
        if self._producer is not None:
            served(self._producer.flush, 5.0)
            self._producer = None
