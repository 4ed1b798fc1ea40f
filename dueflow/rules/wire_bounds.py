"""The accepted range of the numbers and names read from the wire, and their readers (pure).

Every header and Avro field a dueflow process acts on is read through these
functions before it is used: a value outside its range raises
:class:`~dueflow.errors.FieldOutOfRange`, which names the field, the value
and what is accepted. The SDK (:mod:`dueflow.records.job_request`) refuses at the door what
is out of these limits: whatever the SDK writes, every reader accepts, and nothing a reader accepts
can fail later (an Avro int or long that does not fit, a time no
:class:`~datetime.datetime` holds). docs/wire-format.md#accepted-ranges is
the table of them all.

Numbers in headers are ASCII decimal: an optional ``-`` and 1 to 19 digits
(``" 5"``, ``"+5"``, ``"1_000"`` or non-ASCII digits are not numbers, whatever
Python's ``int`` makes of them).
"""

from __future__ import annotations

import math

from dueflow.errors import FieldOutOfRange
from dueflow.model import Backoff, BackoffKind

__all__ = [
    "ATTEMPT_ACCEPTED",
    "DEFAULT_CLOCK_SKEW_MS",
    "MAX_DUE_MS",
    "MAX_ID_CHARS",
    "MAX_INT32",
    "MAX_KEY_BYTES",
    "MAX_LONG",
    "MAX_MULTIPLIER",
    "MAX_NAME_CHARS",
    "MIN_TIME_MS",
    "MS_ACCEPTED",
    "check_backoff",
    "decimal",
    "header_ms",
    "in_range",
    "name",
]

MAX_NAME_CHARS = 255  # a job id, an idempotency key, a queue or schedule id (the SDK's)
MAX_INT32 = (1 << 31) - 1  # an Avro int
MAX_LONG = (1 << 63) - 1  # an Avro long
# The latest time: 9999-12-31T23:59:59.999Z, the last millisecond a datetime
# holds (results and logs show due times as datetimes), far inside an Avro long.
MAX_DUE_MS = 253_402_300_799_999
# The earliest time: 0001-01-01T00:00:00Z, the first millisecond a datetime holds (a
# due time before 1970 is overdue: the job fires at once).
MIN_TIME_MS = -62_135_596_800_000

# Job ids and idempotency keys read from the wire: the SDK's names (at most
# MAX_NAME_CHARS) and a cron occurrence's id (its schedule id, "@" and the
# occurrence's epoch ms) fit.
MAX_ID_CHARS = 2 * MAX_NAME_CHARS + 2
# A record key (an idempotency key): what the longest id takes in UTF-8.
MAX_KEY_BYTES = 4 * MAX_ID_CHARS
# How far apart two processes' clocks may be (the worker's
# ``worker.max_clock_skew_ms``): an exec record's df-due is no later than its
# df-fired plus this (the emitter and the worker measure their clocks against
# the broker's, so they rarely differ by more than a round trip).
DEFAULT_CLOCK_SKEW_MS = 30_000
MAX_MULTIPLIER = 1000.0  # a backoff's multiplier (the SDK's limit)
MAX_DIGITS = 19  # a long has at most 19 decimal digits

MS_ACCEPTED = (
    f"an integer from {MIN_TIME_MS} to {MAX_DUE_MS} "
    "(UTC epoch ms, 0001-01-01 to 9999-12-31T23:59:59.999Z)"
)
ATTEMPT_ACCEPTED = f"an integer from 1 to {MAX_INT32}"


def decimal(raw: bytes, field: str, *, low: int, high: int, accepted: str) -> int:
    """``raw`` (a header value) as an integer in ``[low, high]``; else
    :class:`FieldOutOfRange` naming ``field`` with ``accepted``."""
    digits = raw[1:] if raw[:1] == b"-" else raw
    if not digits.isdigit() or len(digits) > MAX_DIGITS:
        raise FieldOutOfRange(field, raw, accepted)
    value = int(raw)
    if not low <= value <= high:
        raise FieldOutOfRange(field, raw, accepted)
    return value


def header_ms(raw: bytes, field: str) -> int:
    """A time header (UTC epoch ms): an integer from :data:`MIN_TIME_MS` to
    :data:`MAX_DUE_MS`."""
    # The common case first: 13 digits, no sign (a time between 2001 and 2286).
    if len(raw) == 13 and raw.isdigit():
        return int(raw)
    return decimal(raw, field, low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED)


def in_range(value: object, field: str, *, low: int, high: int, accepted: str) -> int:
    """An integer field (Avro ``int``/``long``, JSON number) in ``[low, high]``."""
    if type(value) is not int or not low <= value <= high:
        raise FieldOutOfRange(field, value, accepted)
    return value


def name(value: object, field: str, *, most: int = MAX_NAME_CHARS) -> str:
    """An id or name: a string of 1 to ``most`` characters."""
    if type(value) is not str or not 0 < len(value) <= most:
        raise FieldOutOfRange(field, value, f"a string of 1 to {most} characters")
    return value


def finite(value: object, field: str, *, low: float, high: float, accepted: str) -> float:
    """A float field (Avro ``double``) in ``[low, high]``: never NaN nor infinite."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise FieldOutOfRange(field, value, accepted)
    return float(value)


LONG_MS_ACCEPTED = f"an integer from 0 to {MAX_LONG}"


BACKOFF_MS_ACCEPTED = f"an integer from 0 to {MAX_LONG} ms"


def check_backoff(b: Backoff, field: str = "backoff") -> Backoff:
    """A backoff policy read from the wire: the SDK's rule (times 0 to an Avro long,
    ``max_ms`` >= ``base_ms``, a multiplier from 1 to 1000)."""
    if not isinstance(b.kind, BackoffKind):
        raise FieldOutOfRange(f"{field}.kind", b.kind, "exponential, fixed or none")
    in_range(b.base_ms, f"{field}.base_ms", low=0, high=MAX_LONG, accepted=BACKOFF_MS_ACCEPTED)
    in_range(b.max_ms, f"{field}.max_ms", low=0, high=MAX_LONG, accepted=BACKOFF_MS_ACCEPTED)
    if b.max_ms < b.base_ms:
        raise FieldOutOfRange(f"{field}.max_ms", b.max_ms, f">= base_ms ({b.base_ms})")
    finite(
        b.multiplier,
        f"{field}.multiplier",
        low=1.0,
        high=MAX_MULTIPLIER,
        accepted=f"a number from 1 to {MAX_MULTIPLIER:g}",
    )
    if not isinstance(b.jitter, bool):
        raise FieldOutOfRange(f"{field}.jitter", b.jitter, "true or false")
    return b
