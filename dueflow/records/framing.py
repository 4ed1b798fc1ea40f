"""Job values in the Confluent wire format, beside plain Avro (pure).

A team that runs a schema registry may write job values the way its other
Kafka records are written: the magic byte ``0``, the schema id (4 bytes,
big-endian) that the registry gave ``schemas/dueflow/schemas/job.avsc``, then
the same Avro binary a plain value holds. Such a record says so in its
``df-schema`` header: ``dueflow.Job/1+confluent`` instead of ``dueflow.Job/1``
(the writer's schema version stays in the header: a reader resolves it from
its own released schemas and never has to ask the registry).

How a reader tells the two apart (:func:`unframe_job`): by the header. A
``df-schema`` ending in ``+confluent`` means framed, and the value must then
start with the magic byte and a schema id (else it is undecodable); any
other value of the header, or none, means plain Avro, as always. The header
is therefore required on a framed value: without it the value reads as a
plain job that does not decode (or, for a schema id whose bytes happen to
parse, as a job with an empty job id and task, which no worker runs).

Only job values are ever framed (timer, exec, retry records and a dead
letter's ``job_value``); dueflow's own records (outcomes, idempotency
states, dead letters, schedules) stay plain. A worker of a release that does
not know the suffix reads ``df-schema: dueflow.Job/1+confluent`` as a bad
header and dead-letters the job as ``undecodable``: upgrade every worker
before any writer turns the registry option on.
"""

from __future__ import annotations

from dueflow.errors import UndecodableRecord

MAGIC_BYTE = 0
# Appended to the df-schema header of a framed job value.
CONFLUENT_SUFFIX = b"+confluent"
HEADER_BYTES = 5  # magic byte + schema id
MAX_SCHEMA_ID = (1 << 31) - 1  # the registry's ids are positive Java ints


def frame_confluent(schema_id: int, avro: bytes) -> bytes:
    """``avro`` in the Confluent wire format with registry schema ``schema_id``."""
    if not 0 <= schema_id <= MAX_SCHEMA_ID:
        raise ValueError(f"schema id: got {schema_id}; accepted: 0 to {MAX_SCHEMA_ID}")
    return bytes((MAGIC_BYTE,)) + schema_id.to_bytes(4, "big") + avro


def framed_header(plain: bytes) -> bytes:
    """The ``df-schema`` header of a framed value whose plain header is ``plain``."""
    return plain + CONFLUENT_SUFFIX


def unframe_job(data: bytes, schema: bytes | None) -> tuple[bytes, bytes | None, int | None]:
    """``(Avro bytes, df-schema header without the suffix, schema id or None)`` of a
    job value and its ``df-schema`` header (None when absent: plain).

    Raises :class:`UndecodableRecord` when the header says framed and the value
    does not start with the magic byte and a schema id.
    """
    if schema is None or not schema.endswith(CONFLUENT_SUFFIX):
        return data, schema, None
    if len(data) < HEADER_BYTES or data[0] != MAGIC_BYTE:
        raise UndecodableRecord(
            f"df-schema {schema.decode('utf-8', 'replace')!r} says Confluent framing, "
            "but the value does not start with the magic byte 0 and a 4-byte schema id"
        )
    schema_id = int.from_bytes(data[1:HEADER_BYTES], "big")
    return data[HEADER_BYTES:], schema[: -len(CONFLUENT_SUFFIX)], schema_id
