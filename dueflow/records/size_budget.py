"""The size budget of a job: the most each hop adds to its records, and what fits (pure).

A job's bytes travel through several topics, and several hops add to them:

============================  =================  ====================================
hop                           topic              what it adds to the job's record
============================  =================  ====================================
timer record (the client)     timers             (the record as written)
cascade, placed again         timers             nothing (the same record)
fire                          exec.<queue>       ``df-fired``, ``df-src``, trace
retry                         retry.<queue>.<t>  ``df-attempt``, ``df-due``,
                                                 ``df-first-failure``,
                                                 ``df-last-failure``, ``df-error``
                                                 (200 characters), ``df-origin``,
                                                 ``df-trace-link``
retry through the wheel       timers             the retry's headers and
                                                 ``df-partition``
redrive                       exec.<queue>       ``df-redriven-by/-at/-from``
replay                        exec / retry       ``df-replayed-from/-by/-at``
dead letter                   dlq.<queue>        a ``DeadLetter`` around the value,
                                                 the headers twice, the error texts
quarantine                    quarantine         a ``Quarantined`` around key, value
                                                 and headers
============================  =================  ====================================

Headers a hop sets replace those of the same name, so every job record (exec,
retry, a retry's timer) carries at most the client's headers plus one of each
header above: :func:`header_allowance` bounds them from the field limits (the
topic names, ids of 255 characters, ``df-error`` of 200, epoch milliseconds
of 15 digits, offsets of 19, the operator's name of :data:`BY_MAX_CHARS`).
:class:`JobBudget` puts these bounds against a queue's :class:`QueueLimits`
(the ``max.message.bytes`` of each topic and the producers' ``message.max.bytes``):
a job is accepted only when the largest record every hop could make of it
fits. The dead letter keeps :data:`DEAD_LETTER_TEXT_RESERVE` bytes for its
error texts (its writer trims a longer traceback, see
:mod:`dueflow.records.set_aside`), the quarantine record
:data:`QUARANTINE_REASON_RESERVE` for its reason.

The check on the clients' hot path is one comparison of the timer record's
size with :attr:`JobBudget.fast_limit` (the largest timer record that fits
whatever its ids and headers); only a job above it is measured hop by hop
(:meth:`JobBudget.refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.records.record_size import (
    PRODUCER_OVERHEAD,
    RECORD_FIXED,
    batch_size,
    header_bytes,
    sized,
    varint_size,
)

# The broker's default max.message.bytes of a topic.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
# message.max.bytes of dueflow's producers unless the settings' [kafka] say otherwise
# (dueflow.kafka.clients.producer_config): above every topic's default, so the
# topics' limits are what counts.
PRODUCER_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# Field limits the bounds are made of.
MS_DIGITS = 15  # an epoch-ms time up to 9999-12-31 (dueflow.records.job_request.MAX_DUE_MS)
INT_DIGITS = 10  # a partition or an attempt (Avro int)
OFFSET_DIGITS = 19  # an offset (long)
NAME_BYTES = 255 * 4  # a job id, idempotency key or parent id: 255 characters of UTF-8
TASK_BYTES = 200  # a task name ([A-Za-z0-9_.:/-], dueflow.task_name)
ERROR_HEADER_BYTES = 200 * 4  # df-error: 200 characters (dueflow.consumers.failures)
BY_MAX_CHARS = 200  # who replays or redrives (--by)
BY_BYTES = BY_MAX_CHARS * 4
TRACEPARENT_BYTES = 55  # W3C traceparent, version 00
TRACESTATE_BYTES = 512  # W3C tracestate as propagators keep it
TRACE_ID_BYTES = 32
# Bytes a dead letter always has for error_type, error_message and traceback.
DEAD_LETTER_TEXT_RESERVE = 4_096
# Bytes a quarantine record always has for its reason (and component).
QUARANTINE_REASON_RESERVE = 1_024
# The fast limit stays this far below the largest timer record found to fit, for
# the varint lengths that a shape other than the worst one may round up.
FAST_MARGIN = 32

DEAD_LETTER_SCHEMA = b"dueflow.DeadLetter/1"
QUARANTINED_SCHEMA = b"dueflow.Quarantined/1"
# The header a dead letter carries when it keeps the job's value by reference:
# ``topic:partition:offset`` of the record to read it from.
VALUE_REF = hdr.VALUE_REF


@dataclass(frozen=True, slots=True)
class TopicLimit:
    """A topic and its ``max.message.bytes``."""

    topic: str
    max_bytes: int


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The record size limits a job of ``queue`` meets on its way: the
    ``max.message.bytes`` of every topic its records go to, and the
    ``message.max.bytes`` of dueflow's producers."""

    queue: str
    timers: TopicLimit
    exec: TopicLimit
    retries: tuple[TopicLimit, ...]
    dlq: TopicLimit
    quarantine: TopicLimit
    producer_max_bytes: int = PRODUCER_MAX_MESSAGE_BYTES

    @property
    def topics(self) -> list[TopicLimit]:
        return [self.timers, self.exec, *self.retries, self.dlq, self.quarantine]

    @property
    def longest_topic(self) -> int:
        """Bytes of the longest topic name of the queue (a ``df-src``, ``df-origin``, ...)."""
        return max(len(t.topic.encode()) for t in self.topics)


def uniform_limits(
    queue: str,
    *,
    timers: str,
    exec_topic: str,
    retries: Sequence[str],
    dlq: str,
    quarantine: str,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    producer_max_bytes: int = PRODUCER_MAX_MESSAGE_BYTES,
) -> QueueLimits:
    """Limits where every topic has ``max_bytes`` (a cluster's defaults)."""
    return QueueLimits(
        queue,
        TopicLimit(timers, max_bytes),
        TopicLimit(exec_topic, max_bytes),
        tuple(TopicLimit(t, max_bytes) for t in retries),
        TopicLimit(dlq, max_bytes),
        TopicLimit(quarantine, max_bytes),
        producer_max_bytes,
    )


class JobShape(NamedTuple):
    """The lengths (bytes) of a job's timer record that its later records grow from."""

    key: int  # the record key: the idempotency key
    value: int  # the Avro Job value
    headers: int  # the timer record's headers (record_size.header_bytes)
    header_count: int
    job_id: int
    task: int
    payload: int

    def with_payload(self, payload: int) -> JobShape:
        """The same job with a payload of ``payload`` bytes."""
        value = self.value - sized(self.payload) + sized(payload)
        return self._replace(value=value, payload=payload)


def job_shape(
    key: bytes, value: bytes, headers: Sequence[tuple[str, bytes | None]], *, payload: int
) -> JobShape:
    """The shape of a timer record (key, value, headers as written)."""
    return JobShape(
        len(key),
        len(value),
        header_bytes(headers),
        len(headers),
        len(hdr.header(headers, hdr.JOB_ID) or b""),
        len(hdr.header(headers, hdr.TASK) or b""),
        payload,
    )


class Allowance(NamedTuple):
    """Bytes (``size``) and number of headers a hop may add."""

    size: int
    entries: int


def _entries(pairs: Iterable[tuple[str, int]]) -> Allowance:
    items = list(pairs)
    return Allowance(sum(sized(len(n)) + sized(size) for n, size in items), len(items))


def header_allowance(limits: QueueLimits) -> Allowance:
    """The most the later hops add to the headers of a job's record (each header
    once: a hop replaces the headers it sets)."""
    ref = limits.longest_topic + 2 + INT_DIGITS + OFFSET_DIGITS  # topic:partition:offset
    return _entries(
        [
            (hdr.FIRED, MS_DIGITS),
            (hdr.SOURCE, ref),
            (hdr.ATTEMPT, INT_DIGITS),
            (hdr.DUE, MS_DIGITS),
            (hdr.FIRST_FAILURE, MS_DIGITS),
            (hdr.LAST_FAILURE, MS_DIGITS),
            (hdr.ERROR, ERROR_HEADER_BYTES),
            (hdr.ORIGIN, ref),
            (hdr.PARTITION, INT_DIGITS),
            (hdr.REDRIVEN_BY, BY_BYTES),
            (hdr.REDRIVEN_AT, MS_DIGITS),
            (hdr.REDRIVEN_FROM, ref),
            (hdr.REPLAYED_FROM, ref),
            (hdr.REPLAYED_BY, BY_BYTES),
            (hdr.REPLAYED_AT, MS_DIGITS),
            (hdr.TRACEPARENT, TRACEPARENT_BYTES),
            (hdr.TRACESTATE, TRACESTATE_BYTES),
            (hdr.TRACE_LINK, TRACEPARENT_BYTES),
        ]
    )


def dead_letter_allowance(limits: QueueLimits) -> Allowance:
    """Headers a dead letter has besides the job's own: its schema and a value reference."""
    ref = limits.longest_topic + 2 + INT_DIGITS + OFFSET_DIGITS
    return _entries([(hdr.SCHEMA, len(DEAD_LETTER_SCHEMA)), (VALUE_REF, ref)])


def _map(count: int, entries: int) -> int:
    """Bytes of an Avro map of ``count`` entries of ``entries`` bytes (one block)."""
    return (varint_size(count) if count else 0) + entries + 1


class HopSize(NamedTuple):
    """The largest record one hop could write of a job, against its limits."""

    hop: str
    topic: str
    max_bytes: int  # the topic's max.message.bytes
    size: int  # the record as the broker counts it (record_size.batch_size)
    producer_size: int  # as librdkafka counts it (record_size.producer_size)


@dataclass(frozen=True, slots=True)
class Overflow:
    """A hop whose record would not fit: its size against the limit it exceeds."""

    hop: str
    topic: str
    size: int
    limit: int
    by_producer: bool  # over the producers' message.max.bytes (else the topic's limit)

    @property
    def excess(self) -> int:
        return self.size - self.limit

    def describe(self) -> str:
        if self.by_producer:
            return (
                f"the {self.hop} would be {self.size} bytes to dueflow's producers, over "
                f"their message.max.bytes {self.limit}"
            )
        return (
            f"the {self.hop} would be {self.size} bytes, over max.message.bytes "
            f"{self.limit} of {self.topic}"
        )


class RecordTooLarge(InvalidInput):
    """A job whose records would not fit a topic on its way (or the producers):
    ``overflow`` names the hop, ``max_payload`` is the most payload that fits
    (-1: none). The message says both, as every :class:`InvalidInput` does::

        payload: got 1048000 bytes: the exec record would be 1052003 bytes, over
        max.message.bytes 1048588 of dueflow.exec.default; accepted: at most
        1044586 bytes of payload
    """

    def __init__(self, payload: int, overflow: Overflow, max_payload: int) -> None:
        fits = (
            f"at most {max_payload} bytes of payload"
            if max_payload >= 0
            else "no payload fits: the job's ids and headers alone are too large"
        )
        super().__init__("payload", payload, fits)
        self.message = f"payload: got {payload} bytes: {overflow.describe()}; accepted: {fits}"
        self.args = (self.message,)
        self.overflow = overflow
        self.max_payload = max_payload


@dataclass(frozen=True)
class JobBudget:
    """What fits through every hop of one queue (see the module docstring)."""

    limits: QueueLimits
    allowance: Allowance = field(init=False)
    dead_letter_headers: Allowance = field(init=False)
    fast_limit: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowance", header_allowance(self.limits))
        object.__setattr__(self, "dead_letter_headers", dead_letter_allowance(self.limits))
        object.__setattr__(self, "fast_limit", self._fast_limit())

    # ------------------------------------------------------------------ hops
    def hops(self, shape: JobShape) -> list[HopSize]:
        """The largest record each hop could write of a job of ``shape``."""
        lim = self.limits
        k, v = shape.key, shape.value
        out = [_hop("timer record", lim.timers, k, v, shape.headers, shape.header_count)]
        jh = shape.headers + self.allowance.size
        jn = shape.header_count + self.allowance.entries
        job_hops = [("exec record", lim.exec)]
        job_hops += [("retry record", t) for t in lim.retries]
        job_hops.append(("retry timer", lim.timers))
        out += [_hop(name, topic, k, v, jh, jn) for name, topic in job_hops]
        out.append(self._dead_letter(shape, jh, jn))
        out.append(self._quarantined(shape, jh, jn))
        return out

    def _dead_letter(self, shape: JobShape, jh: int, jn: int) -> HopSize:
        lim = self.limits
        value = (
            sized(shape.job_id)
            + sized(len(lim.queue.encode()))
            + sized(shape.task)
            + sized(shape.key)
            + 1  # reason
            + DEAD_LETTER_TEXT_RESERVE
            + 5  # attempts
            + 3 * 10  # first and last failure, dead (ms)
            + sized(lim.longest_topic)  # original topic
            + 5
            + 10  # original partition and offset
            + 1
            + sized(TRACE_ID_BYTES)
            + sized(shape.value)  # job_value
            + _map(jn, jh)  # job_headers
        )
        extra = self.dead_letter_headers
        return _hop(
            "dead-letter record", lim.dlq, shape.key, value, jh + extra.size, jn + extra.entries
        )

    def _quarantined(self, shape: JobShape, jh: int, jn: int) -> HopSize:
        lim = self.limits
        value = (
            QUARANTINE_REASON_RESERVE
            + sized(lim.longest_topic)  # source topic
            + 5
            + 10
            + 10  # source partition, offset, at_ms
            + 1
            + sized(shape.key)
            + 1
            + sized(shape.value)
            + _map(jn, jh)
        )
        return _hop(
            "quarantine record",
            lim.quarantine,
            shape.key,
            value,
            sized(len(hdr.SCHEMA)) + sized(len(QUARANTINED_SCHEMA)),
            1,
        )

    # ------------------------------------------------------------------ checks
    def overflow(self, shape: JobShape) -> Overflow | None:
        """The hop that exceeds its limit by the most (the first of equals), or None."""
        worst: Overflow | None = None
        producer = self.limits.producer_max_bytes
        for h in self.hops(shape):
            for size, limit, by_producer in (
                (h.size, h.max_bytes, False),
                (h.producer_size, producer, True),
            ):
                if size > limit and (worst is None or size - limit > worst.excess):
                    worst = Overflow(h.hop, h.topic, size, limit, by_producer)
        return worst

    def max_payload(self, shape: JobShape) -> int:
        """The most payload bytes a job of ``shape`` may carry; -1 when none fits."""
        if self.overflow(shape.with_payload(0)) is not None:
            return -1
        low, high = 0, max(shape.payload, max(t.max_bytes for t in self.limits.topics))
        while low < high:
            mid = (low + high + 1) // 2
            if self.overflow(shape.with_payload(mid)) is None:
                low = mid
            else:
                high = mid - 1
        return low

    def refusal(self, shape: JobShape) -> RecordTooLarge | None:
        """The error for a job of ``shape`` that would not fit, or None when it fits."""
        found = self.overflow(shape)
        if found is None:
            return None
        return RecordTooLarge(shape.payload, found, self.max_payload(shape))

    def _fast_limit(self) -> int:
        """The largest timer record that fits every hop whatever its ids and headers
        (the longest the scheduling client and ctx.schedule write)."""
        worst = _worst_headers(len(self.limits.queue.encode()))
        base = JobShape(NAME_BYTES, 0, worst.size, worst.entries, NAME_BYTES, TASK_BYTES, 0)
        if self.overflow(base) is not None:
            return 0
        low, high = 0, max(t.max_bytes for t in self.limits.topics)
        while low < high:
            mid = (low + high + 1) // 2
            if self.overflow(base._replace(value=mid)) is None:
                low = mid
            else:
                high = mid - 1
        timer = self.hops(base._replace(value=low))[0]
        return max(0, timer.size - FAST_MARGIN)


def _hop(name: str, limit: TopicLimit, key: int, value: int, headers: int, count: int) -> HopSize:
    body = RECORD_FIXED + sized(key) + sized(value) + varint_size(count) + headers
    return HopSize(
        name,
        limit.topic,
        limit.max_bytes,
        batch_size(body),
        PRODUCER_OVERHEAD + key + value + headers,
    )


def _worst_headers(queue_bytes: int) -> Allowance:
    """The largest headers the scheduling client or ctx.schedule write on a timer."""
    return _entries(
        [
            (hdr.DUE, MS_DIGITS),
            (hdr.QUEUE, queue_bytes),
            (hdr.KIND, len(hdr.KIND_CRON)),
            (hdr.JOB_ID, NAME_BYTES),
            (hdr.TASK, TASK_BYTES),
            # framed (the schema registry option) is the longer of the two
            (hdr.SCHEMA, len(b"dueflow.Job/1+confluent")),
            (hdr.TRACEPARENT, TRACEPARENT_BYTES),
            (hdr.TRACESTATE, TRACESTATE_BYTES),
            (hdr.EXPIRES, MS_DIGITS),
            (hdr.PARENT, NAME_BYTES),
        ]
    )
