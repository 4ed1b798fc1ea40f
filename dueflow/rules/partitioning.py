"""Kafka's default key partitioner (murmur2), as a pure function.

dueflow's producers use librdkafka's ``murmur2_random`` partitioner, which
agrees with Java's default partitioner: a keyed record goes to partition
``(murmur2(key) & 0x7fffffff) % partitions``. Readers use this to go straight
to the one partition that holds a key (``dueflow job ID`` scanning the
outcomes topic) instead of reading them all.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``: a signed 32-bit integer."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h >= (1 << 31) else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Partition of a keyed record among ``partitions`` (Java default partitioner)."""
    if partitions < 1:
        raise ValueError(f"partitions: got {partitions}; accepted: an integer >= 1")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
