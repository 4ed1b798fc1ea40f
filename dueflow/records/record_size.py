"""How many bytes a Kafka record takes where a limit is checked (pure).

Two limits apply to every record dueflow writes:

- the broker refuses a record batch larger than the topic's
  ``max.message.bytes``. A record written on its own is one v2 batch:

  ======================  ===================================================
  part                    bytes
  ======================  ===================================================
  batch header            61 (base offset 8, batch length 4, leader epoch 4,
                          magic 1, CRC 4, attributes 2, last offset delta 4,
                          first and max timestamp 8 + 8, producer id 8,
                          producer epoch 2, base sequence 4, record count 4)
  record length           varint of the record's size
  record                  attributes 1, timestamp delta varint (0: 1 byte),
                          offset delta varint (0: 1 byte), key length varint
                          (-1: null) and key, value length varint and value,
                          header count varint, then per header its name length
                          varint and name, value length varint (-1: null) and
                          value
  ======================  ===================================================

  (:func:`record_size`). A batch holding one record is never compressed
  larger: librdkafka sends it uncompressed when compression does not help,
  so this size bounds what the broker sees with any ``compression.type``.
  dueflow's producers keep ``batch.size`` at most the topic limits they
  write to, so a record that fits alone also fits in any batch it joins.

- librdkafka refuses, at ``produce()``, a record whose key, value and
  serialized headers plus :data:`PRODUCER_OVERHEAD` (its worst-case record
  framing) exceed the producer's ``message.max.bytes``
  (:func:`producer_size`).

Varints are zig-zag encoded, as in Avro (:mod:`dueflow.records.varint`), so
:func:`varint_size` also gives the length prefix of an Avro string or bytes.
``tests/unit/test_record_size.py`` checks these sizes against records
serialized byte by byte, and ``tests/integration/test_record_size_broker.py``
against the broker and librdkafka at the exact limit.
"""

from __future__ import annotations

from collections.abc import Sequence

BATCH_HEADER = 61
# attributes, timestamp delta 0 and offset delta 0 of the only record of a batch
RECORD_FIXED = 3
# librdkafka's RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: length 5, attributes 1,
# timestamp delta 10, offset delta 5, key, value and header-count lengths 5 each.
PRODUCER_OVERHEAD = 36

Header = tuple[str, bytes | None]


def varint_size(n: int) -> int:
    """Bytes of the zig-zag varint of ``n`` (Kafka's record varints, Avro's int and long)."""
    z = (n << 1) ^ (n >> 63) if n < 0 else n << 1
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def sized(n: int) -> int:
    """Bytes of ``n`` bytes with their varint length in front (a key, a value, a
    header name or value, an Avro string or bytes)."""
    if n < 64:
        return n + 1
    if n < 8192:
        return n + 2
    return n + varint_size(n)


def header_bytes(headers: Sequence[Header] | None) -> int:
    """Bytes of ``headers`` in a record, without the header count."""
    total = 0
    for name, value in headers or ():
        total += sized(len(name.encode())) + (1 if value is None else sized(len(value)))
    return total


def body_size(key: int, value: int, headers: int, count: int) -> int:
    """Bytes of a record (without its length varint) from the lengths of its parts:
    ``key``/``value`` -1 when null, ``headers`` from :func:`header_bytes`, ``count``
    headers."""
    return (
        RECORD_FIXED
        + (1 if key < 0 else sized(key))
        + (1 if value < 0 else sized(value))
        + varint_size(count)
        + headers
    )


def batch_size(body: int) -> int:
    """Bytes of a batch holding one record of ``body`` bytes (:func:`body_size`)."""
    return BATCH_HEADER + varint_size(body) + body


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None) -> int:
    """Bytes of a record written on its own: what the broker compares with the
    topic's ``max.message.bytes``."""
    return batch_size(
        body_size(
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            header_bytes(headers),
            len(headers or ()),
        )
    )


def producer_size(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None) -> int:
    """What librdkafka compares with the producer's ``message.max.bytes``."""
    return PRODUCER_OVERHEAD + len(key or b"") + len(value or b"") + header_bytes(headers)


def producer_size_of(key: int, value: int, headers: int) -> int:
    """:func:`producer_size` from lengths (-1: null)."""
    return PRODUCER_OVERHEAD + max(key, 0) + max(value, 0) + headers
