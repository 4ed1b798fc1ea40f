"""The dead-letter topics: read, filter and show what is in them.

``<prefix>.dlq.<queue>`` holds ``DeadLetter`` records (``dead_letter.avsc``),
keyed by idempotency key, on the partition the job ran from. A record that
does not decode is still listed (``problem`` says why), never skipped.

:class:`DlqFilter` is pure: which entries an operator asked for (queue is the
topic; task, reason, error type, job id, key, a dead-time range, partitions,
explicit ``partition:offset`` references).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.kafka.reading import Span, offsets_for_time, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.records.size_budget import VALUE_REF
from dueflow.timeutil import show_utc

# DLQ records are written at commit time, a little after their dead_ms: a
# time-bounded read starts this much earlier (the filter then decides).
TIME_SLACK_MS = 10 * 60_000


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One record of a DLQ topic, decoded (``record``) or not (``problem``)."""

    queue: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    record: Mapping[str, Any] | None
    problem: str | None = None

    @property
    def ref(self) -> str:
        """``partition:offset``: how commands name one record."""
        return f"{self.partition}:{self.offset}"

    def _get(self, name: str, default: Any = None) -> Any:
        return default if self.record is None else self.record.get(name, default)

    @property
    def job_id(self) -> str:
        found = self._get("job_id") or hdr.header_text(list(self.headers), hdr.JOB_ID)
        return str(found or "?")

    @property
    def task(self) -> str:
        found = self._get("task") or hdr.header_text(list(self.headers), hdr.TASK)
        return str(found or "?")

    @property
    def idempotency_key(self) -> str | None:
        found = self._get("idempotency_key")
        if found is None and self.key is not None:
            return self.key.decode("utf-8", "replace")
        return None if found is None else str(found)

    @property
    def reason(self) -> str:
        return str(self._get("reason", "undecodable" if self.problem else "other"))

    @property
    def error_type(self) -> str:
        return str(self._get("error_type", "UndecodableRecord" if self.problem else ""))

    @property
    def dead_ms(self) -> int:
        return int(self._get("dead_ms", self.timestamp_ms))

    @property
    def attempts(self) -> int:
        return int(self._get("attempts", 0))

    def summary(self) -> dict[str, Any]:
        """The fields a listing shows."""
        return {
            "ref": self.ref,
            "queue": self.queue,
            "partition": self.partition,
            "offset": self.offset,
            "job_id": self.job_id,
            "task": self.task,
            "idempotency_key": self.idempotency_key,
            "reason": self.reason,
            "error_type": self.error_type,
            "error_message": str(self._get("error_message", self.problem or "")),
            "attempts": self.attempts,
            "dead_ms": self.dead_ms,
            "dead_at": show_utc(self.dead_ms),
        }

    def details(self) -> dict[str, Any]:
        """Everything, for ``dlq show`` (bytes as text where they are text)."""
        out = self.summary()
        out["problem"] = self.problem
        out["headers"] = {k: _text(v) for k, v in self.headers}
        if self.record is not None:
            rec = dict(self.record)
            out["traceback"] = rec.get("traceback", "")
            out["first_failure_ms"] = rec.get("first_failure_ms")
            out["last_failure_ms"] = rec.get("last_failure_ms")
            out["original"] = (
                f"{rec.get('original_topic')}:{rec.get('original_partition')}:"
                f"{rec.get('original_offset')}"
            )
            out["trace_id"] = rec.get("trace_id")
            out["job_headers"] = {k: _text(v) for k, v in (rec.get("job_headers") or {}).items()}
            out["job_value_bytes"] = len(rec.get("job_value") or b"")
            ref = (rec.get("job_headers") or {}).get(VALUE_REF)
            if ref is not None:  # the value did not fit: it is in the record named here
                out["value_ref"] = _text(ref)
            out["job"] = _job_view(rec.get("job_value") or b"", rec.get("job_headers") or {})
        return out


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.hex()


def _job_view(value: bytes, job_headers: Mapping[str, bytes]) -> dict[str, Any] | None:
    """The dead job's own record, decoded for display (None when it does not decode)."""
    try:
        job = codec.decode_job_value(value, job_headers.get(hdr.SCHEMA))
    except UndecodableRecord:
        return None
    payload = job.get("payload")
    if isinstance(payload, bytes):
        job["payload"] = _text(payload)
    return job


def decode_entry(queue: str, msg: Any) -> DeadLetterEntry:
    """A DLQ message as an entry; undecodable bytes give ``problem``, not an error."""
    raw_headers = msg.headers() or []
    headers = tuple((k, v) for k, v in raw_headers if v is not None)
    record: dict[str, Any] | None = None
    problem = None
    try:
        version = codec.parse_schema_header(
            hdr.header(raw_headers, hdr.SCHEMA), expected="dead_letter"
        )
        record = codec.decode("dead_letter", msg.value() or b"", writer_version=version)
    except UndecodableRecord as exc:
        problem = str(exc)
    return DeadLetterEntry(
        queue=queue,
        topic=msg.topic(),
        partition=int(msg.partition()),
        offset=int(msg.offset()),
        timestamp_ms=int(msg.timestamp()[1]),
        key=msg.key(),
        headers=headers,
        record=record,
        problem=problem,
    )


def parse_ref(text: str) -> tuple[int, int]:
    """``"3:120"`` -> ``(3, 120)``; :class:`InvalidInput` for anything else."""
    part, sep, off = text.strip().partition(":")
    if not sep or not part.isdigit() or not off.isdigit():
        raise InvalidInput("ref", text, "PARTITION:OFFSET of a DLQ record, e.g. 3:120")
    return int(part), int(off)


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """Which DLQ entries an operator means. Empty fields match everything."""

    tasks: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()
    error_types: frozenset[str] = frozenset()
    job_ids: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    since_ms: int | None = None  # dead_ms >= since_ms
    until_ms: int | None = None  # dead_ms < until_ms
    partitions: frozenset[int] = frozenset()
    refs: frozenset[tuple[int, int]] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        since, until = self.since_ms, self.until_ms
        if since is not None and until is not None and until <= since:
            raise InvalidInput("until", self.until_ms, f"a time after since ({self.since_ms})")

    def matches(self, e: DeadLetterEntry) -> bool:
        if self.partitions and e.partition not in self.partitions:
            return False
        if self.refs and (e.partition, e.offset) not in self.refs:
            return False
        if self.tasks and e.task not in self.tasks:
            return False
        if self.reasons and e.reason not in self.reasons:
            return False
        if self.error_types and e.error_type not in self.error_types:
            return False
        if self.job_ids and e.job_id not in self.job_ids:
            return False
        if self.keys and e.idempotency_key not in self.keys:
            return False
        if self.since_ms is not None and e.dead_ms < self.since_ms:
            return False
        return not (self.until_ms is not None and e.dead_ms >= self.until_ms)


def read_dead_letters(
    settings: Settings,
    consumer: Consumer,
    queue: str,
    *,
    where: DlqFilter | None = None,
    timeout_s: float = 120.0,
) -> list[DeadLetterEntry]:
    """Every committed entry of ``queue``'s DLQ that ``where`` matches, in
    (partition, offset) order."""
    settings.queue(queue)  # ConfigError naming the queue when it is not configured
    where = where or DlqFilter()
    topic = names(settings).dlq(queue)
    parts = partitions_of(consumer, topic)
    if where.partitions:
        parts = [p for p in parts if p in where.partitions]
    if where.refs:
        parts = [p for p in parts if p in {p for p, _ in where.refs}]
    marks = watermarks(consumer, topic, parts)
    starts = {p: low for p, (low, _high) in marks.items()}
    if where.since_ms is not None:
        found = offsets_for_time(consumer, topic, parts, where.since_ms - TIME_SLACK_MS)
        for p, offset in found.items():
            starts[p] = marks[p][1] if offset is None else max(starts[p], offset)
    if where.refs:
        for p in parts:
            wanted = [o for q, o in where.refs if q == p]
            starts[p] = max(starts[p], min(wanted))
            marks[p] = (marks[p][0], min(marks[p][1], max(wanted) + 1))
    spans = [Span(topic, p, starts[p], marks[p][1]) for p in parts]
    found_entries: list[DeadLetterEntry] = []

    def take(msg: Any) -> None:
        entry = decode_entry(queue, msg)
        if where.matches(entry):
            found_entries.append(entry)

    read_spans(consumer, spans, take, timeout_s=timeout_s)
    found_entries.sort(key=lambda e: (e.partition, e.offset))
    return found_entries


def latest_per_key(entries: Iterable[DeadLetterEntry]) -> dict[tuple[int, str], DeadLetterEntry]:
    """The newest entry of each (partition, idempotency key)."""
    out: dict[tuple[int, str], DeadLetterEntry] = {}
    for e in entries:
        key = e.idempotency_key
        if key is None:
            continue
        prev = out.get((e.partition, key))
        if prev is None or e.offset > prev.offset:
            out[(e.partition, key)] = e
    return out
