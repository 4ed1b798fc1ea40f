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
    ``uuid7_head(t) + tail`` for a tail of :func:`uuid7_tails` is a UUIDv7."""
    return f"{now_ms & _MASK_48:012x}7"


TAIL_BYTES = 10  # random bytes per tail: 18 of their 20 hex digits are used


def uuid7_tails(random: bytes) -> list[str]:
    """One UUIDv7 tail (19 digits: 3 random, the variant ``8``, 15 random) per 10
    bytes of ``random``, in order. The tail of bytes ``r`` is
    ``r.hex()[:3] + "8" + r.hex()[4:19]``: equal to the random digits
    ``uuid7_hex`` takes, ``r.hex()[:3] + r.hex()[4:19]``. Ids drawn in bulk
    cost a slice each: the variant digits are set on all bytes at once."""
    count = len(random) // TAIL_BYTES
    size = count * TAIL_BYTES
    # clear the low nibble of every id's second byte and set it to 8
    mask, variant = _variant_masks(count)
    marked = (int.from_bytes(random[:size]) & mask) | variant
    digits = marked.to_bytes(size).hex()
    step = 2 * TAIL_BYTES
    return [digits[i : i + 19] for i in range(0, 2 * size, step)]


_MASKS: dict[int, tuple[int, int]] = {}


def _variant_masks(count: int) -> tuple[int, int]:
    found = _MASKS.get(count)
    if found is None:
        found = (
            int.from_bytes(b"\xff\xf0" + b"\xff" * (TAIL_BYTES - 2)) * _repeat(count),
            int.from_bytes(b"\x00\x08" + b"\x00" * (TAIL_BYTES - 2)) * _repeat(count),
        )
        if len(_MASKS) < 16:
            _MASKS[count] = found
    return found


def _repeat(count: int) -> int:
    """The number whose base-2**80 digits are ``count`` ones (a pattern times it
    repeats the pattern ``count`` times)."""
    return int.from_bytes((b"\x00" * (TAIL_BYTES - 1) + b"\x01") * count)


def uuid7_time_ms(job_id: str) -> int | None:
    """The creation time in a UUIDv7 job id; ``None`` for other ids."""
    text = job_id.replace("-", "")
    if len(text) != 32 or text[12] != "7" or text[16] not in "89ab":
        return None
    try:
        return int(text[:12], 16)
    except ValueError:
        return None
