"""Encode and decode dueflow records with fastavro.

Values are plain Avro binary (no registry framing) of the schemas in this
folder; a job value may also come in the Confluent wire format
(:func:`decode_job_value`, :mod:`dueflow.records.framing`). The writer's
schema travels in the ``df-schema`` header as ``<full name>/<version>``
(e.g. ``dueflow.Job/1``); a reader resolves it against its own current
schema, so writers and readers of different released versions interoperate
(rolling upgrades). Every released version of every schema is kept under
``v<N>/``; the files at the top are the current ones.

A reader resolves only the versions it knows, so writers write the oldest
version that holds what they write: a record that needs nothing of version 2
is written as version 1 (``encode(..., version=1)``, or the hand-written
encoders of :mod:`dueflow.records.worker_codec`), and a process of the previous
release still reads it. Only records that need the new field or symbol
(a reschedule, an ``expired`` outcome, a retry handed on) are written as
the version that has it.

Parsed schemas are cached per (name, version).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

import fastavro

from dueflow.errors import UndecodableRecord
from dueflow.records.framing import unframe_job

# short name -> (full Avro name, file name, current version)
SCHEMAS: dict[str, tuple[str, str, int]] = {
    "job": ("dueflow.Job", "job.avsc", 1),
    "schedule": ("dueflow.Schedule", "schedule.avsc", 2),
    "outcome": ("dueflow.Outcome", "outcome.avsc", 3),
    "dead_letter": ("dueflow.DeadLetter", "dead_letter.avsc", 2),
    "idempotency": ("dueflow.IdempotencyRecord", "idempotency_record.avsc", 3),
    "quarantined": ("dueflow.Quarantined", "quarantined.avsc", 1),
    "queue": ("dueflow.Queue", "queue.avsc", 1),
    "command": ("dueflow.Command", "command.avsc", 1),
    "steering_state": ("dueflow.SteeringState", "steering_state.avsc", 1),
}
_BY_FULL_NAME = {full: short for short, (full, _, _) in SCHEMAS.items()}


def _entry(name: str) -> tuple[str, str, int]:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise UndecodableRecord(f"unknown schema {name!r}; known: {sorted(SCHEMAS)}") from None


def schema_json(name: str, version: int | None = None) -> dict[str, Any]:
    """The schema document of ``name``: current, or released ``version``."""
    full, filename, current = _entry(name)
    root = resources.files("dueflow.schemas")
    if version is not None and version != current:
        path = root / f"v{version}" / filename
    else:
        path = root / filename
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise UndecodableRecord(f"no released version {version} of schema {full}") from None
    return doc


@lru_cache(maxsize=64)
def parsed_schema(name: str, version: int | None = None) -> Any:
    """Parsed (fastavro) schema, cached."""
    return fastavro.parse_schema(schema_json(name, version), named_schemas={})


def schema_header(name: str, version: int | None = None) -> bytes:
    """Value of the ``df-schema`` header for records written with the current schema
    (or released ``version``)."""
    full, _, current = _entry(name)
    return f"{full}/{current if version is None else version}".encode()


def parse_schema_header(raw: bytes | None, *, expected: str) -> int | None:
    """Writer version from a ``df-schema`` header (``None`` when absent)."""
    if raw is None:
        return None
    full, _, _current = _entry(expected)
    text = raw.decode("utf-8", "replace")
    got_name, sep, got_version = text.partition("/")
    if got_name != full or not sep or not got_version.isdigit():
        raise UndecodableRecord(f"df-schema header {text!r}: expected {full}/<version>")
    return int(got_version)


def encode(name: str, record: Mapping[str, Any], *, version: int | None = None) -> bytes:
    """Avro binary of ``record`` with the current schema ``name`` (or released
    ``version``: fields it does not have are left out)."""
    _, _, current = _entry(name)
    schema = parsed_schema(name, None if version in (None, current) else version)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def decode(name: str, data: bytes, *, writer_version: int | None = None) -> dict[str, Any]:
    """Decode ``data`` written with version ``writer_version`` (default: current) of ``name``.

    Raises :class:`UndecodableRecord` naming the schema when the bytes do not fit.
    """
    _, _, current = _entry(name)
    reader = parsed_schema(name)
    writer = reader if writer_version in (None, current) else parsed_schema(name, writer_version)
    buf = io.BytesIO(data)
    try:
        out = fastavro.schemaless_reader(buf, writer, reader if writer is not reader else None)
    except Exception as exc:  # fastavro raises many types on bad bytes
        raise UndecodableRecord(
            f"value is not a valid {SCHEMAS[name][0]} record ({type(exc).__name__}: {exc})",
            cause=exc,
        ) from exc
    if buf.tell() != len(data):
        raise UndecodableRecord(
            f"value is not a valid {SCHEMAS[name][0]} record: "
            f"{len(data) - buf.tell()} trailing bytes"
        )
    if not isinstance(out, dict):
        raise UndecodableRecord(f"value is not a {SCHEMAS[name][0]} record")
    return out


def decode_job_value(data: bytes, schema: bytes | None) -> dict[str, Any]:
    """A ``dueflow.Job`` value, plain Avro or in the Confluent wire format
    (:mod:`dueflow.records.framing`), with its ``df-schema`` header (None when
    absent). Raises :class:`UndecodableRecord` when it is neither."""
    avro, plain, _schema_id = unframe_job(data, schema)
    return decode("job", avro, writer_version=parse_schema_header(plain, expected="job"))


class AvroCodec:
    """The codec as a collaborator object (for injection into I/O classes)."""

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        return encode(name, record)

    def decode(
        self, name: str, data: bytes, *, writer_version: int | None = None
    ) -> dict[str, Any]:
        return decode(name, data, writer_version=writer_version)

    def header(self, name: str) -> bytes:
        return schema_header(name)


def short_name(full_name: str) -> str:
    """``dueflow.Job`` -> ``job``."""
    return _BY_FULL_NAME[full_name]
