"""Dead letters and quarantine records always fit their topic: trimmed, by
reference, or cut down, and saying so."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.consumers.failures import Failure
from dueflow.consumers.outputs import dead_letter_fields, dead_letter_headers
from dueflow.reasons import BAD_PARTITION, MISSING_DUE, reason_label, with_detail
from dueflow.records import codec
from dueflow.records.record_size import record_size
from dueflow.records.set_aside import (
    CUT_MARK,
    REASON_MAX_CHARS,
    RecordLimit,
    cut_text,
    fit_dead_letter,
    fit_quarantined,
    quarantined_fields,
)
from dueflow.records.size_budget import VALUE_REF

DLQ = "dueflow.dlq.billing"
SOURCE = "dueflow.exec.billing:3:1200"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + "".join(f'  File "app.py", line {i}, in step_{i}\n    step_{i + 1}()\n' for i in range(400))
    + "ValueError: the card was declined\n"
)
JOB_HEADERS = {"df-due": b"1800000000000", "df-queue": b"billing", "df-attempt": b"4"}


def _dead(value_bytes: int, *, traceback: str = TRACEBACK, message: str = "declined") -> Any:
    failure = Failure("ValueError", message, traceback)
    fields = dead_letter_fields(
        job_id="job-1",
        queue="billing",
        task="charge",
        idempotency_key="job-1",
        reason="exhausted",
        failure=failure,
        attempts=4,
        first_failure_ms=1,
        last_failure_ms=2,
        dead_ms=3,
        origin=("dueflow.exec.billing", 3, 1000),
        trace_id=None,
        value=b"v" * value_bytes,
        headers=JOB_HEADERS,
    )
    headers = dead_letter_headers(list(JOB_HEADERS.items()), failure=failure, attempts=4)
    return fields, headers


def _limit(max_bytes: int) -> RecordLimit:
    return RecordLimit(DLQ, max_bytes, 16 * 1024 * 1024)


def test_a_dead_letter_that_fits_is_written_whole() -> None:
    fields, headers = _dead(1_000)
    out = fit_dead_letter(
        fields, key=b"job-1", headers=headers, limit=_limit(1_000_000), value_ref=SOURCE
    )
    assert out.cut is None
    assert codec.decode("dead_letter", out.value) == fields


def test_the_traceback_is_cut_from_the_top_and_the_cut_marked() -> None:
    fields, headers = _dead(30_000)
    whole = fit_dead_letter(fields, key=b"job-1", headers=headers, limit=None, value_ref=SOURCE)
    limit = _limit(len(whole.value) + 200 - len(TRACEBACK) // 2)  # about half must go
    out = fit_dead_letter(fields, key=b"job-1", headers=headers, limit=limit, value_ref=SOURCE)
    assert out.cut == "texts"
    assert limit.fits(out.key, out.value, out.headers)
    got = codec.decode("dead_letter", out.value)
    assert got["job_value"] == fields["job_value"]
    assert got["error_message"] == "declined"
    tb = got["traceback"]
    assert tb.startswith("[... ")
    assert "characters cut to fit dueflow.dlq.billing ...]" in tb
    assert tb.endswith("ValueError: the card was declined\n")  # the end is kept
    assert len(tb) < len(TRACEBACK)
    # as much as fits: a few bytes more would not have fitted
    assert limit.excess(out.key, out.value, out.headers) > -40


def test_a_value_that_does_not_fit_is_kept_by_reference() -> None:
    fields, headers = _dead(200_000)
    limit = _limit(150_000)
    out = fit_dead_letter(fields, key=b"job-1", headers=headers, limit=limit, value_ref=SOURCE)
    assert out.cut == "reference"
    assert limit.fits(out.key, out.value, out.headers)
    got = codec.decode("dead_letter", out.value)
    assert got["job_value"] == b""
    assert got["job_headers"][VALUE_REF] == SOURCE.encode()
    assert got["job_headers"]["df-queue"] == b"billing"
    assert hdr.header(out.headers, VALUE_REF) == SOURCE.encode()
    assert got["traceback"] == TRACEBACK  # the room the value left holds the texts whole


def test_headers_that_do_not_fit_either_leave_the_minimal_dead_letter() -> None:
    fields, headers = _dead(5_000)
    fields["job_headers"] = {**JOB_HEADERS, "big": b"h" * 50_000}
    headers = [*headers, ("big", b"h" * 50_000)]
    limit = _limit(20_000)
    out = fit_dead_letter(fields, key=b"job-1", headers=headers, limit=limit, value_ref=SOURCE)
    assert out.cut == "minimal"
    assert limit.fits(out.key, out.value, out.headers)
    got = codec.decode("dead_letter", out.value)
    assert got["job_headers"] == {VALUE_REF: SOURCE.encode()}
    assert {k for k, _ in out.headers} <= {hdr.SCHEMA, hdr.ATTEMPT, hdr.ERROR, VALUE_REF}


@pytest.mark.parametrize(
    "without",
    [("traceback",), ("traceback", "error_message"), ("traceback", "error_message", "error_type")],
)
def test_a_dead_letter_that_fits_to_the_byte_without_some_texts_loses_only_those(
    without: tuple[str, ...],
) -> None:
    """Cut texts until the record is at most the limit, not below it: the value
    stays, and so do the texts the record had room for."""
    fields, headers = _dead(30_000)
    bare = codec.encode("dead_letter", {**fields, **dict.fromkeys(without, "")})
    limit = _limit(record_size(b"job-1", bare, headers))
    out = fit_dead_letter(fields, key=b"job-1", headers=headers, limit=limit, value_ref=SOURCE)
    assert out.cut == "texts"
    assert limit.excess(out.key, out.value, out.headers) == 0
    got = codec.decode("dead_letter", out.value)
    assert got["job_value"] == fields["job_value"]
    for name in ("traceback", "error_message", "error_type"):
        assert got[name] == ("" if name in without else fields[name]), name


@given(
    value=st.integers(min_value=0, max_value=60_000),
    limit=st.integers(min_value=3_000, max_value=80_000),
    message=st.text(max_size=3_000),
)
@settings(max_examples=80, deadline=None)
def test_a_dead_letter_always_fits(value: int, limit: int, message: str) -> None:
    fields, headers = _dead(value, message=message)
    out = fit_dead_letter(
        fields, key=b"job-1", headers=headers, limit=_limit(limit), value_ref=SOURCE
    )
    assert _limit(limit).fits(out.key, out.value, out.headers)
    got = codec.decode("dead_letter", out.value)
    assert got["job_id"] == "job-1"
    assert got["job_value"] in (fields["job_value"], b"")


@pytest.mark.parametrize("keep_end", [True, False])
def test_cut_text_keeps_an_end_and_marks_the_cut(keep_end: bool) -> None:
    text = "".join(f"line {i} €\n" for i in range(1_000))
    out = cut_text(text, 2_000, keep_end=keep_end, topic="t")
    assert len(out.encode()) <= 2_000
    if keep_end:
        assert out.endswith("line 999 €\n")
        assert out.startswith("[... ")
    else:
        assert out.startswith("line 0 €\n")
        assert out.endswith("characters cut to fit t ...]")
    cut = len(text) - len(out) + len(CUT_MARK.format(n=0, topic="t")) + 1
    assert any(
        CUT_MARK.format(n=n, topic="t") in out for n in range(cut - 10, cut + 10)
    )  # the count is of characters cut
    assert cut_text(text, len(text.encode()) + 10, keep_end=keep_end, topic="t") == text
    assert cut_text(text, 20, keep_end=keep_end, topic="t") == ""


# ------------------------------------------------------------------ quarantine

QUARANTINE = "dueflow.quarantine"


def _quarantined(reason: str, value: int, headers: int = 0, key: int = 10) -> Any:
    return quarantined_fields(
        reason=reason,
        component="emitter",
        topic="dueflow.timers",
        partition=7,
        offset=99,
        at_ms=1,
        key=b"k" * key,
        value=b"v" * value,
        headers=[("df-due", b"1"), ("big", b"h" * headers)],
    )


def _qlimit(max_bytes: int) -> RecordLimit:
    return RecordLimit(QUARANTINE, max_bytes, 16 * 1024 * 1024)


SCHEMA = [(hdr.SCHEMA, codec.schema_header("quarantined"))]


@pytest.mark.parametrize(
    ("reason", "value", "headers", "key", "cut"),
    [
        (MISSING_DUE, 1_000, 0, 10, None),
        (MISSING_DUE, 100_000, 0, 10, "value"),
        (with_detail(BAD_PARTITION, "99"), 100_000, 0, 10, "value"),
        (MISSING_DUE, 100_000, 100_000, 10, "headers"),
        (MISSING_DUE, 100_000, 100_000, 100_000, "key"),
    ],
)
def test_a_quarantine_record_always_fits_and_its_reason_says_what_was_cut(
    reason: str, value: int, headers: int, key: int, cut: str | None
) -> None:
    fields = _quarantined(reason, value, headers, key)
    limit = _qlimit(50_000)
    out = fit_quarantined(fields, headers=SCHEMA, limit=limit)
    assert out.cut == cut
    assert limit.fits(out.key, out.value, out.headers)
    got = codec.decode("quarantined", out.value)
    assert reason_label(got["reason"]) == reason_label(reason)  # the stable part is kept
    assert (got["source_topic"], got["source_partition"], got["source_offset"]) == (
        "dueflow.timers",
        7,
        99,
    )
    if cut is None:
        assert got == fields
        return
    assert "the whole record is at dueflow.timers:7:99" in got["reason"] or (
        "the record is at dueflow.timers:7:99" in got["reason"]
    )
    if cut == "value":
        assert got["reason"].count("value truncated from 100000 bytes") == 1
        assert 0 < len(got["value"]) < 100_000
        assert got["value"] == fields["value"][: len(got["value"])]
        assert got["headers"] == fields["headers"]
    if cut in ("headers", "key"):
        assert got["value"] is None
        assert got["headers"] == {}
    if cut == "key":
        assert got["key"] is None
        assert out.key is None


def test_a_reason_is_never_longer_than_its_limit() -> None:
    fields = _quarantined(with_detail(BAD_PARTITION, "9" * 10_000), 100_000)
    assert len(fields["reason"]) == REASON_MAX_CHARS
    out = fit_quarantined(fields, headers=SCHEMA, limit=_qlimit(50_000))
    got = codec.decode("quarantined", out.value)
    assert len(got["reason"]) <= REASON_MAX_CHARS
    assert reason_label(got["reason"]) == BAD_PARTITION
    assert "value truncated" in got["reason"]


@given(
    value=st.integers(min_value=0, max_value=80_000),
    headers=st.integers(min_value=0, max_value=80_000),
    key=st.integers(min_value=0, max_value=80_000),
    limit=st.integers(min_value=2_000, max_value=100_000),
)
@settings(max_examples=80, deadline=None)
def test_any_quarantine_record_fits(value: int, headers: int, key: int, limit: int) -> None:
    fields = _quarantined(MISSING_DUE, value, headers, key)
    out = fit_quarantined(fields, headers=SCHEMA, limit=_qlimit(limit))
    assert _qlimit(limit).fits(out.key, out.value, out.headers)
