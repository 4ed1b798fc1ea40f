"""Record sizes and what each hop does with a record too large, for the wire fuzzer (pure).

Written out again from docs/wire-format.md#size-budget, as the fuzzer's oracle
(tests/support/wire_fuzz.py) does for every other limit: it must not import what
it checks. ``tests/unit/test_wire_fuzz_oracle.py`` compares these numbers with
``dueflow.records.record_size``, the emitter's drainer and the worker's recorder.

- A record's size is what the broker compares with the topic's
  ``max.message.bytes``: one v2 record batch, 61 bytes of batch header, then the
  record's length and the record (attributes, timestamp and offset deltas,
  key, value, header count, each header's name and value), every length a
  zig-zag varint (:func:`record_len`).
- The emitter fires a timer as its exec record: the timer's key, value and
  headers plus ``df-fired`` (the fire time, epoch ms) and ``df-src``
  (``topic:partition:offset`` of the timer); a timer whose exec record would
  exceed the exec topic's limit is quarantined, reason ``record too large``
  (:func:`fired_headers`).
- A worker retries a failed job with ``df-attempt``, ``df-due``,
  ``df-first-failure``, ``df-last-failure``, ``df-error`` (``<type>: <message>``,
  200 characters) and ``df-origin`` set (each replaces the header of its name);
  a retry record that would not fit its tier is not written: the job is
  dead-lettered, reason ``other``, its message beginning ``not retried:``
  (:func:`retry_headers`).
- A dead letter is a ``DeadLetter`` around the job's value and headers, with
  the job's headers (and ``df-schema``, ``df-attempt``, ``df-error``) on the
  record. One that would not fit the DLQ has its error texts cut; when even
  without them it does not fit, the value stays where it is (by reference)
  (:class:`DeadLetterSize`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The fuzzer's cluster: its topics as `dueflow topics ensure` creates them on a broker
# with the default max.message.bytes (the test checks that the topics have these).
TOPIC_MAX_BYTES = 1_048_588  # the timer topic, the exec topic, each retry tier
SET_ASIDE_MAX_BYTES = TOPIC_MAX_BYTES + 128 * 1024  # the DLQ and the quarantine

BATCH_HEADER = 61
RECORD_FIXED = 3  # attributes, timestamp delta 0, offset delta 0: a record alone in its batch
EPOCH_MS_DIGITS = 13  # df-fired, df-due, ... in this century
ERROR_CHARS = 200  # df-error
TRACEBACK_CHARS = 16_000  # a traceback is cut to its last 16,000 characters
DEAD_LETTER_SCHEMA = b"dueflow.DeadLetter/1"

HeaderLens = Sequence[tuple[str, int]]  # (name, bytes of the value)


def varint_len(n: int) -> int:
    """Bytes of the zig-zag varint of ``n`` (Kafka's record varints, Avro's int and long)."""
    z = n << 1 if n >= 0 else ((-n) << 1) - 1
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def sized(n: int) -> int:
    """``n`` bytes with their varint length in front (an Avro string or bytes, a key...)."""
    return varint_len(n) + n


def lens(headers: Sequence[tuple[str, bytes]]) -> list[tuple[str, int]]:
    return [(name, len(value)) for name, value in headers]


def record_len(key: int, value: int, headers: HeaderLens) -> int:
    """The size of a record written on its own, from the lengths of its parts (a key
    or value of -1 is null)."""
    body = (
        RECORD_FIXED
        + (1 if key < 0 else sized(key))
        + (1 if value < 0 else sized(value))
        + varint_len(len(headers))
        + sum(sized(len(name.encode())) + sized(size) for name, size in headers)
    )
    return BATCH_HEADER + varint_len(body) + body


def record_bytes(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> int:
    """:func:`record_len` of a record."""
    return record_len(
        -1 if key is None else len(key), -1 if value is None else len(value), lens(headers)
    )


# ------------------------------------------------------------------ the hops


def source(topic: str, partition: int, offset: int) -> str:
    """``topic:partition:offset``: the value of ``df-src`` and ``df-origin``."""
    return f"{topic}:{partition}:{offset}"


def fired_headers(headers: HeaderLens, *, src: str) -> list[tuple[str, int]]:
    """The headers of the exec record the emitter fires a timer of ``headers`` as."""
    return [*headers, ("df-fired", EPOCH_MS_DIGITS), ("df-src", len(src.encode()))]


def summary(error_type: str, message: str) -> str:
    """``df-error``: ``<type>: <message>``, 200 characters at most."""
    return (f"{error_type}: {message}" if message else error_type)[:ERROR_CHARS]


def retry_headers(
    headers: HeaderLens, *, attempt: int, error: str, origin: str
) -> list[tuple[str, int]]:
    """The headers of the retry record of a failed attempt (``attempt``: the next one)."""
    updates = [
        ("df-attempt", len(str(attempt))),
        ("df-due", EPOCH_MS_DIGITS),
        ("df-first-failure", EPOCH_MS_DIGITS),
        ("df-last-failure", EPOCH_MS_DIGITS),
        ("df-error", len(error.encode())),
        ("df-origin", len(origin.encode())),
    ]
    names = {name for name, _ in updates}
    return [(n, size) for n, size in headers if n not in names] + updates


def not_retried(why_size: int, limit: int, topic: str, message: str) -> str:
    """The message of a dead letter whose retry record would not fit its tier."""
    return (
        f"not retried: the retry record would be {why_size} bytes, over max.message.bytes "
        f"{limit} of {topic}; the attempt failed with: {message}"
    )


@dataclass(frozen=True)
class DeadLetterSize:
    """The dead letter of a job, its error texts empty (``bare``), and what its texts
    add; :meth:`verdict` says what the worker makes of it against a DLQ limit."""

    key: int
    value: int  # the DeadLetter value with empty error_type, error_message, traceback
    headers: tuple[tuple[str, int], ...]
    error_type: int  # bytes of the error type and message
    message: int

    @property
    def bare(self) -> int:
        return record_len(self.key, self.value, self.headers)

    def with_texts(self, traceback: int) -> int:
        """The whole dead letter, with a traceback of ``traceback`` bytes."""
        texts = sized(self.error_type) + sized(self.message) + sized(traceback) - 3
        return record_len(self.key, self.value + texts, self.headers)

    def verdict(self, limit: int) -> str:
        """``whole`` (it fits as it is), ``texts`` (its error texts are cut), ``reference``
        (the job's value stays in the record that failed), or ``kept`` (whole or texts
        cut: that depends on the traceback's length)."""
        if self.bare > limit:
            return "reference"
        if self.with_texts(1) > limit:  # a handler's traceback has a character at least
            return "texts"
        if self.with_texts(TRACEBACK_CHARS * 4) <= limit:
            return "whole"
        return "kept"


def avro_map_len(entries: HeaderLens) -> int:
    """An Avro map of bytes, in one block (the last of equal keys counts)."""
    unique = dict(entries)
    if not unique:
        return 1
    body = sum(sized(len(k.encode())) + sized(v) for k, v in unique.items())
    return varint_len(len(unique)) + body + 1


def dead_letter_size(
    *,
    key: int,
    ids: tuple[str, str, str, str],
    attempts: int,
    times: tuple[int, int, int],
    origin: tuple[str, int, int],
    value: int,
    headers: HeaderLens,
    error_type: str,
    message: str,
) -> DeadLetterSize:
    """The dead letter of a job record of ``key``, ``value`` and ``headers`` (lengths):
    ``ids`` are its job id, queue, task and idempotency key, ``times`` its first
    failure, last failure and death (epoch ms), ``origin`` the record that failed."""
    topic, partition, offset = origin
    fields = (
        sum(sized(len(text.encode())) for text in ids)
        + 1  # reason
        + 3  # error_type, error_message, traceback: empty
        + varint_len(attempts)
        + sum(varint_len(t) for t in times)
        + sized(len(topic.encode()))
        + varint_len(partition)
        + varint_len(offset)
        + 1  # trace_id: null
        + sized(value)
        + avro_map_len(headers)
    )
    error = summary(error_type, message)
    updates = [
        ("df-schema", len(DEAD_LETTER_SCHEMA)),
        ("df-attempt", len(str(attempts))),
        ("df-error", len(error.encode())),
    ]
    names = {n for n, _ in updates}
    record_headers = tuple([(n, s) for n, s in headers if n not in names] + updates)
    return DeadLetterSize(
        key, fields, record_headers, len(error_type.encode()), len(message.encode())
    )


# ------------------------------------------------------------------ padding


def fit(target: int, measure: Callable[[int, int], int], *, most: int) -> tuple[int, int]:
    """``(n, fill)`` for which ``measure(n, fill)`` is ``target``: the largest ``n`` in
    ``[0, most]`` with ``measure(n, 0) <= target``, then the ``fill`` in ``[0, 64)``
    that makes up the rest (a varint that grows can skip a size: then the largest
    fill still at most ``target``; ``(0, 0)`` when even that is over)."""
    if measure(0, 0) > target:
        return 0, 0
    low, high = 0, most
    while low < high:
        mid = (low + high + 1) // 2
        if measure(mid, 0) <= target:
            low = mid
        else:
            high = mid - 1
    best = 0
    for fill in range(64):
        got = measure(low, fill)
        if got == target:
            return low, fill
        if got > target:
            break
        best = fill
    return low, best
