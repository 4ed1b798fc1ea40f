"""Dead letters and quarantine records that always fit their topic (pure).

A record is set aside because something is wrong with it, so it may be as
large as its topic allows, or larger (written by another client, or a limit
lowered since). Its dead letter or quarantine record wraps all of it, and
more; ``dueflow topics ensure`` gives those topics headroom
(:data:`~dueflow.kafka.topics.SET_ASIDE_HEADROOM`), and when that is not
enough these writers make the record fit instead of failing, each step
further only when the one before does not fit:

dead letter (:func:`fit_dead_letter`)
  1. ``texts``: the traceback is cut from the top (its end, where the error
     was raised, is kept), then the error message from the end, then the
     error type; a cut is marked in the text (:data:`CUT_MARK`);
  2. ``reference``: the job's value is left where it is: ``job_value`` is
     empty and the header :data:`~dueflow.records.size_budget.VALUE_REF`
     (in ``job_headers`` and on the record) names the record
     (``topic:partition:offset``) that holds it; ``dueflow dlq redrive``
     reads it from there. The texts are fitted again;
  3. ``minimal``: the job's headers are left there too (only the reference
     is kept), and the record carries only its schema, attempt, error and
     reference headers.

quarantine (:func:`fit_quarantined`)
  1. ``value``: the value is truncated (its start is kept);
  2. ``headers``: the headers are not kept;
  3. ``key``: the key is not kept (neither in the record nor as its key).
  The reason says what was cut and where the record is
  (``source_topic:partition:offset``, which the record names anyway).

The reason of a quarantine record is at most :data:`REASON_MAX_CHARS`
characters whatever happens. Both writers return what they did (``cut``), so
the caller counts it (``dueflow_set_aside_trimmed_total``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dueflow import headers as hdr
from dueflow.records import codec
from dueflow.records.record_size import producer_size, record_size
from dueflow.records.size_budget import VALUE_REF

REASON_MAX_CHARS = 500
CUT_MARK = "[... {n} characters cut to fit {topic} ...]"
_TEXTS = ("traceback", "error_message", "error_type")  # cut in this order


@dataclass(frozen=True, slots=True)
class RecordLimit:
    """Where a set-aside record goes: the topic, its ``max.message.bytes`` and the
    producer's ``message.max.bytes``."""

    topic: str
    max_bytes: int
    producer_max_bytes: int

    def fits(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> bool:
        return (
            record_size(key, value, headers) <= self.max_bytes
            and producer_size(key, value, headers) <= self.producer_max_bytes
        )

    def excess(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> int:
        """How many bytes too large the record is (<= 0: it fits)."""
        return max(
            record_size(key, value, headers) - self.max_bytes,
            producer_size(key, value, headers) - self.producer_max_bytes,
        )


class SetAside(NamedTuple):
    """A set-aside record ready to write, and how it was made to fit (None: whole)."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    cut: str | None


# ------------------------------------------------------------------ dead letters


def fit_dead_letter(
    fields: Mapping[str, Any],
    *,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    limit: RecordLimit | None,
    value_ref: str,
    version: int | None = None,
) -> SetAside:
    """The ``DeadLetter`` of ``fields`` (its Avro fields) with record key ``key`` and
    ``headers``, made to fit ``limit`` (None: written whole), written as schema
    ``version`` (None: the current one; the record's ``df-schema`` in ``headers``
    must say the same). ``value_ref``: ``topic:partition:offset`` of the record
    that holds the job's value (the failed delivery), for a dead letter that keeps
    it by reference."""
    record = dict(fields)
    out = list(headers)

    def encode(rec: Mapping[str, Any]) -> bytes:
        return codec.encode("dead_letter", rec, version=version)

    value = encode(record)
    if limit is None or limit.fits(key, value, out):
        return SetAside(key, value, out, None)
    fitted = _fit_texts(record, key, out, limit, encode)
    if fitted is not None:
        return SetAside(key, fitted, out, "texts")
    # The value by reference: its bytes stay in the record that failed.
    ref = value_ref.encode()
    record = dict(fields)
    record["job_value"] = b""
    record["job_headers"] = {**dict(fields.get("job_headers") or {}), VALUE_REF: ref}
    out = hdr.replace(headers, [(VALUE_REF, ref)])
    fitted = _fit_texts(record, key, out, limit, encode, whole_first=True)
    if fitted is not None:
        return SetAside(key, fitted, out, "reference")
    # The job's headers by reference too.
    record["job_headers"] = {VALUE_REF: ref}
    keep = {hdr.SCHEMA, hdr.ATTEMPT, hdr.ERROR, VALUE_REF}
    out = [(k, v) for k, v in out if k in keep]
    fitted = _fit_texts(record, key, out, limit, encode, whole_first=True)
    if fitted is None:  # a limit below a few kilobytes: the texts are gone
        for name in _TEXTS:
            record[name] = ""
        fitted = encode(record)
    return SetAside(key, fitted, out, "minimal")


def _fit_texts(
    record: dict[str, Any],
    key: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    limit: RecordLimit,
    encode: Callable[[Mapping[str, Any]], bytes],
    *,
    whole_first: bool = False,
) -> bytes | None:
    """Cut the error texts of ``record`` (in place) until it fits; None when it does
    not fit even without them (``record``'s texts are then empty)."""
    if whole_first:
        value = encode(record)
        if limit.fits(key, value, headers):
            return value
    for name in _TEXTS:
        text = str(record.get(name) or "")
        if not text:
            continue
        record[name] = ""
        bare = encode(record)
        room = -limit.excess(key, bare, headers)
        if room < 0:
            continue  # even without this text it does not fit: cut the next one too
        record[name] = cut_text(text, room, keep_end=name == "traceback", topic=limit.topic)
        value = encode(record)
        while not limit.fits(key, value, headers) and record[name]:
            # the length prefix grew, or the mark: cut a little more
            room -= max(1, limit.excess(key, value, headers))
            record[name] = cut_text(text, room, keep_end=name == "traceback", topic=limit.topic)
            value = encode(record)
        if limit.fits(key, value, headers):
            return value
    return None


def cut_text(text: str, room: int, *, keep_end: bool, topic: str) -> str:
    """``text`` cut to at most about ``room`` bytes of UTF-8 (fewer for the length
    prefix), with a mark that says how much was cut; its end kept when
    ``keep_end`` (a traceback), else its start. Empty when nothing useful fits."""
    raw = text.encode("utf-8", "replace")
    budget = room - 4  # the string's length prefix (up to 4 bytes here)
    if len(raw) <= budget:
        return text
    mark = CUT_MARK.format(n=len(text), topic=topic)
    keep = budget - len(mark.encode()) - 2
    if keep <= 0:
        return ""
    if keep_end:
        kept = raw[len(raw) - keep :].decode("utf-8", "ignore")
        cut = len(text) - len(kept)
        return CUT_MARK.format(n=cut, topic=topic) + "\n" + kept
    kept = raw[:keep].decode("utf-8", "ignore")
    cut = len(text) - len(kept)
    return kept + "\n" + CUT_MARK.format(n=cut, topic=topic)


# ------------------------------------------------------------------ quarantine


def quarantined_fields(
    *,
    reason: str,
    component: str,
    topic: str,
    partition: int,
    offset: int,
    at_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Any,
) -> dict[str, Any]:
    """The Avro fields of a ``Quarantined`` record (headers: pairs or a mapping;
    values that are not bytes are left out)."""
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or [])
    return {
        "reason": reason[:REASON_MAX_CHARS],
        "component": component,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "at_ms": at_ms,
        "key": key,
        "value": value,
        "headers": {k: v for k, v in pairs if isinstance(v, bytes)},
    }


def fit_quarantined(
    fields: Mapping[str, Any],
    *,
    headers: Sequence[tuple[str, bytes]],
    limit: RecordLimit | None,
) -> SetAside:
    """The ``Quarantined`` record of ``fields`` (:func:`quarantined_fields`), keyed
    by the source record's key, made to fit ``limit`` (None: written whole)."""
    record = dict(fields)
    key = record.get("key")
    out = list(headers)
    value = codec.encode("quarantined", record)
    if limit is None or limit.fits(key, value, out):
        return SetAside(key, value, out, None)
    where = f"{record['source_topic']}:{record['source_partition']}:{record['source_offset']}"
    original = record.get("value") or b""
    note = (
        f"value truncated from {len(original)} bytes to fit max.message.bytes "
        f"{limit.max_bytes} of {limit.topic}; the whole record is at {where}"
    )
    record["reason"] = _noted(str(fields["reason"]), note)
    record["value"] = b""
    bare = codec.encode("quarantined", record)
    room = -limit.excess(key, bare, out) - 8  # the value's length prefix and union
    if room > 0:
        record["value"] = original[:room]
        value = codec.encode("quarantined", record)
        if limit.fits(key, value, out):
            return SetAside(key, value, out, "value")
    record["value"] = None
    over = f"over max.message.bytes {limit.max_bytes} of {limit.topic}"
    note = f"value and headers not kept ({over}); the record is at {where}"
    record["reason"] = _noted(str(fields["reason"]), note)
    record["headers"] = {}
    value = codec.encode("quarantined", record)
    if limit.fits(key, value, out):
        return SetAside(key, value, out, "headers")
    note = f"key, value and headers not kept ({over}); the record is at {where}"
    record["reason"] = _noted(str(fields["reason"]), note)
    record["key"] = None
    return SetAside(None, codec.encode("quarantined", record), out, "key")


def _noted(reason: str, note: str) -> str:
    """``reason`` with ``note`` added, the stable part (before the first ``": "``) kept."""
    text = f"{reason} ({note})" if ": " in reason else f"{reason}: {note}"
    if len(text) <= REASON_MAX_CHARS:
        return text
    head = reason[: max(0, REASON_MAX_CHARS - len(note) - 8)]
    return f"{head}... ({note})" if ": " in head else f"{head}: ({note})"
