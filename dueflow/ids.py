"""Job ids (pure): time-ordered UUIDv7 values as 32 lowercase hex digits.

A UUIDv7 starts with the creation time in milliseconds, so ids sort by the
time they were made and a job id in a log tells when it was scheduled. The
random digits are an argument (the caller draws them), so this module never
reads the clock or a random source.
"""

from __future__ import annotations

RANDOM_HEX_DIGITS = 18  # 72 random bits: 12 in rand_a, 60 in rand_b
_MASK_48 = (1 << 48) - 1


def uuid7_hex(*, now_ms: int, random_hex: str) -> str:
    """A UUIDv7 (RFC 9562) for time ``now_ms``, as 32 hex digits.

    ``random_hex`` holds 18 random hex digits. The variant nibble is ``8``
    (binary ``10`` plus two zero bits), the version nibble ``7``.
    """
    return f"{now_ms & _MASK_48:012x}7{random_hex[:3]}8{random_hex[3:18]}"


def uuid7_head(now_ms: int) -> str:
    """The first 13 digits of every UUIDv7 of ``now_ms`` (time and version):
    ``uuid7_head(t) + uuid7_tail(r) == uuid7_hex(now_ms=t, random_hex=r)``."""
    return f"{now_ms & _MASK_48:012x}7"


def uuid7_tails(random_hex: str) -> list[str]:
    """The last 19 digits (random bits and variant) of one UUIDv7 per 18 digits of
    ``random_hex``, in order: ids drawn in bulk pay one string join each."""
    n = RANDOM_HEX_DIGITS
    return [
        f"{random_hex[i : i + 3]}8{random_hex[i + 3 : i + n]}"
        for i in range(0, len(random_hex) - n + 1, n)
    ]


def uuid7_time_ms(job_id: str) -> int | None:
    """The creation time in a UUIDv7 job id; ``None`` for other ids."""
    text = job_id.replace("-", "")
    if len(text) != 32 or text[12] != "7" or text[16] not in "89ab":
        return None
    try:
        return int(text[:12], 16)
    except ValueError:
        return None
