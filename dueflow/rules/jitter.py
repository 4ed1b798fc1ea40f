"""Deterministic jitter: spread fire times without randomness (pure core).

Many schedules on the same expression (``0 * * * *``) would all fire at the
same instant; each occurrence is delayed by a jitter in ``[0, window_ms]``
derived from a seed, so every process (emitter, failover standby, replay)
computes the same delay for the same occurrence, in any version of dueflow
and in any language:

    n = window_ms + 1
    for i = 0, 1, 2, ...:
        h = BLAKE2b(utf8(seed), digest_size=8, person=b"dueflow-jitter",
                    salt=i as 16 big-endian bytes) read as a big-endian uint64
        if h < 2**64 - (2**64 mod n): return h mod n

Rejecting the top sliver of hash values makes the draw exactly uniform; it is
almost never taken more than once. Python's ``hash()`` is salted per process
and is never used.
"""

from __future__ import annotations

from hashlib import blake2b

from dueflow.errors import InvalidInput

_PERSON = b"dueflow-jitter"
_SPACE = 1 << 64
MAX_WINDOW_MS = (1 << 62) - 1


def deterministic_jitter_ms(seed: str, window_ms: int) -> int:
    """A delay in ``[0, window_ms]`` (both inclusive), uniform over seeds and
    stable across processes and versions."""
    if not isinstance(seed, str):
        raise InvalidInput("seed", seed, "a string")
    if isinstance(window_ms, bool) or not isinstance(window_ms, int):
        raise InvalidInput("jitter_ms", window_ms, f"an integer in [0, {MAX_WINDOW_MS}]")
    if not 0 <= window_ms <= MAX_WINDOW_MS:
        raise InvalidInput("jitter_ms", window_ms, f"an integer in [0, {MAX_WINDOW_MS}]")
    if window_ms == 0:
        return 0
    n = window_ms + 1
    limit = _SPACE - _SPACE % n
    data = seed.encode("utf-8")
    i = 0
    while True:
        digest = blake2b(data, digest_size=8, person=_PERSON, salt=i.to_bytes(16, "big")).digest()
        h = int.from_bytes(digest, "big")
        if h < limit:
            return h % n
        i += 1


def occurrence_jitter_ms(schedule_id: str, occurrence_ms: int, window_ms: int) -> int:
    """The jitter of one occurrence of a schedule: seed ``"<schedule_id>@<occurrence_ms>"``."""
    return deterministic_jitter_ms(f"{schedule_id}@{occurrence_ms}", window_ms)


__all__ = ["MAX_WINDOW_MS", "deterministic_jitter_ms", "occurrence_jitter_ms"]
