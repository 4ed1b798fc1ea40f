"""Quarantine records: a malformed record set aside with the reason, never dropped."""

from __future__ import annotations

from collections.abc import Sequence

from dueflow import headers as hdr
from dueflow.observability.metrics import Metrics
from dueflow.records import codec
from dueflow.records.set_aside import RecordLimit, SetAside, fit_quarantined, quarantined_fields

COMPONENT = "emitter"
SCHEMA_HEADERS = [(hdr.SCHEMA, codec.schema_header("quarantined"))]


def quarantine_record(
    *,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    at_ms: int,
    limit: RecordLimit | None = None,
) -> SetAside:
    """Key, value and headers of the ``quarantined`` record for one bad input record,
    made to fit ``limit`` (the quarantine topic's, see
    :func:`dueflow.records.set_aside.fit_quarantined`)."""
    fields = quarantined_fields(
        reason=reason,
        component=COMPONENT,
        topic=topic,
        partition=partition,
        offset=offset,
        at_ms=at_ms,
        key=key,
        value=value,
        headers=headers,
    )
    return fit_quarantined(fields, headers=SCHEMA_HEADERS, limit=limit)


def count_cut(metrics: Metrics, record: SetAside) -> None:
    """Count a quarantine record that was cut to fit."""
    if record.cut is not None:
        metrics.set_aside_trimmed.labels(COMPONENT, "quarantine", record.cut).inc()
