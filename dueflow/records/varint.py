"""Avro's zig-zag varint (``int`` and ``long``), encoded from tables.

Both hand-written encoders (:mod:`dueflow.records.job_binary` for Job records,
:mod:`dueflow.records.worker_codec` for Outcome and IdempotencyRecord) write their
numbers with :func:`varint`, so the two cannot disagree on a byte.

A long ``n`` is written as ``z = (n << 1) ^ (n >> 63)`` in groups of 7 bits,
low group first, each byte but the last with the continuation bit 0x80 set.
"""

from __future__ import annotations

# Varints of 0..16383 (the zig-zag forms of -8192..8191), precomputed, and
# every 14-bit group as two bytes with the continuation bit set: a varint of
# up to 42 bits (epoch milliseconds until 2039) is then three table lookups.
VARINTS: list[bytes] = []
LOW_GROUPS: list[bytes] = []
for _z in range(1 << 14):
    VARINTS.append(bytes([_z]) if _z < 0x80 else bytes([(_z & 0x7F) | 0x80, _z >> 7]))
    LOW_GROUPS.append(bytes([(_z & 0x7F) | 0x80, (_z >> 7) | 0x80]))
del _z


def varint(n: int) -> bytes:
    """Zig-zag varint of a long (Avro ``int`` and ``long``).

    ``ValueError`` when ``n`` does not fit a long (64 bits, signed)."""
    z = (n << 1) ^ (n >> 63)
    if 0 <= z < 1 << 14:
        return VARINTS[z]
    if 0 < z < 1 << 28:
        return LOW_GROUPS[z & 0x3FFF] + VARINTS[z >> 14]
    if 0 < z < 1 << 42:
        return LOW_GROUPS[z & 0x3FFF] + LOW_GROUPS[(z >> 14) & 0x3FFF] + VARINTS[z >> 28]
    if not -(1 << 63) <= n < (1 << 63):
        raise ValueError(f"{n} does not fit an Avro long")
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def long_varint(n: int) -> bytes:
    """:func:`varint` with the common epoch-millisecond case first."""
    z = (n << 1) ^ (n >> 63)
    if (1 << 28) <= z < (1 << 42):
        return LOW_GROUPS[z & 0x3FFF] + LOW_GROUPS[(z >> 14) & 0x3FFF] + VARINTS[z >> 28]
    return varint(n)
