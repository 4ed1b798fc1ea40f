"""Avro contract of dueflow: the ``.avsc`` files and their codec."""

from dueflow.schemas.codec import SCHEMAS, AvroCodec, decode, encode, schema_header

__all__ = ["SCHEMAS", "AvroCodec", "decode", "encode", "schema_header"]
