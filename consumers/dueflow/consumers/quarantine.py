"""Set malformed records aside (``<prefix>.quarantine``) instead of dying on them."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Producer

from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.fatal import served
from dueflow.kafka.topic_limits import producer_max_bytes
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.reasons import reason_label
from dueflow.records import codec
from dueflow.records.set_aside import RecordLimit, fit_quarantined, quarantined_fields
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES

_LOG = logging.getLogger("dueflow.worker")
_HEADERS = [("df-schema", codec.schema_header("quarantined"))]


class Quarantine:
    """Writes :mod:`quarantined.avsc` records; the producer is created on first use."""

    def __init__(self, settings: Settings, metrics: Metrics, *, component: str) -> None:
        self._settings = settings
        self._metrics = metrics
        self._component = component
        self._topic = names(settings).quarantine
        self._producer: Producer | None = None
        # The quarantine topic's limits: the broker's default until a reader of them
        # sets it (the worker's queues do at start); records are cut to fit
        # (dueflow.records.set_aside).
        self.limit: RecordLimit | None = RecordLimit(
            self._topic, DEFAULT_MAX_MESSAGE_BYTES, producer_max_bytes(settings)
        )

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
        try:
            if self._producer is None:
                self._producer = make_producer(self._settings)
            fields = quarantined_fields(
                reason=reason,
                component=self._component,
                topic=topic,
                partition=partition,
                offset=offset,
                at_ms=int(time.time() * 1000),
                key=key,
                value=value,
                headers=headers,
            )
            record = fit_quarantined(fields, headers=_HEADERS, limit=self.limit)
            if record.cut is not None:
                self._metrics.set_aside_trimmed.labels(
                    self._component, "quarantine", record.cut
                ).inc()
            out: Any = record.headers
            self._producer.produce(self._topic, record.value, record.key, headers=out)
            served(self._producer.poll, 0)
        except Exception as exc:  # quarantine is best effort: the record is counted and logged
            event(_LOG, "quarantine write failed", logging.ERROR, error=str(exc))

    def close(self) -> None:
        if self._producer is not None:
            served(self._producer.flush, 5.0)
            self._producer = None
