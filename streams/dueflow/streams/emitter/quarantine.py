"""Quarantine records: a malformed record set aside with the reason, never dropped."""

from __future__ import annotations

from dueflow import headers as hdr
from dueflow.records import codec

COMPONENT = "emitter"


def quarantine_record(
    *,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None,
    at_ms: int,
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Value and headers of the ``quarantined`` record for one bad input record."""
    record = {
        "reason": reason,
        "component": COMPONENT,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "at_ms": at_ms,
        "key": key,
        "value": value,
        "headers": {k: v for k, v in (headers or []) if v is not None},
    }
    value_bytes = codec.encode("quarantined", record)
    return value_bytes, [(hdr.SCHEMA, codec.schema_header("quarantined"))]
