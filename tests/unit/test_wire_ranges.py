"""Every header and field read from the wire is range-checked before it is used (pure).

Tables of values at and around each limit (0, -1, max, max + 1, 2**63, 2**64,
not a number, empty) for each record kind's check: the timer headers
(``classify_timer``), the exec and retry records (``job_checks``, and
``prepare`` which the worker runs at the head of a partition), idempotency,
control and outcome records. The limits are docs/wire-format.md#accepted-ranges.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.consumers import TaskRegistry, task
from dueflow.consumers.failures import permanent
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.outputs import DEAD_LETTER_V1, DEAD_LETTER_V2, dead_letter_headers
from dueflow.consumers.store import MemoryKeyStore
from dueflow.consumers.testing import exec_headers
from dueflow.errors import FieldOutOfRange, UndecodableRecord
from dueflow.model import Backoff, BackoffKind, Job
from dueflow.records import codec
from dueflow.records import worker_codec as fast
from dueflow.records.job_checks import (
    attempt_of,
    check_job,
    exec_not_before,
    expires_of,
    longest_retry_delay_ms,
    ms_or,
    overlap_of,
    retry_not_before,
)
from dueflow.records.outcome_checks import check_outcome
from dueflow.records.pause_command import decode_control
from dueflow.records.queue_registry import decode_queue
from dueflow.rules.drain import classify_timer
from dueflow.rules.wire_bounds import (
    MAX_DUE_MS,
    MAX_INT32,
    MAX_LONG,
    MIN_TIME_MS,
    decimal,
    header_ms,
)
from dueflow.testing.log import MemoryRecord

NOW = 1_800_000_000_000
SKEW = 30_000
INT64_OVER = [2**63, 2**64, 2**69]  # what a 10-byte Avro varint can still hold
NOT_NUMBERS = [b"", b"-", b" 5", b"5 ", b"+5", b"1_000", b"0x10", b"\xd9\xa5", b"1e3", b"soon"]


# --------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"0", 0),
        (b"1", 1),
        (b"1800000000000", 1_800_000_000_000),
        (str(MAX_DUE_MS).encode(), MAX_DUE_MS),
        (b"0000000000001", 1),  # leading zeros are digits
        (b"-1", -1),  # before 1970: overdue
        (str(MIN_TIME_MS).encode(), MIN_TIME_MS),
    ],
)
def test_a_time_header_in_range_is_read(raw: bytes, value: int) -> None:
    assert header_ms(raw, hdr.DUE) == value


@pytest.mark.parametrize(
    "raw",
    [
        str(MIN_TIME_MS - 1).encode(),
        str(MAX_DUE_MS + 1).encode(),
        str(2**63).encode(),
        str(2**64).encode(),
        b"9" * 20,
        b"9" * 5000,  # past Python's int digit limit: never handed to int()
        *NOT_NUMBERS,
    ],
)
def test_a_time_header_out_of_range_names_the_field_the_value_and_the_range(raw: bytes) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        header_ms(raw, hdr.DUE)
    text = str(info.value)
    assert text.startswith("df-due: ")
    assert f"accepted: an integer from {MIN_TIME_MS} to {MAX_DUE_MS}" in text
    assert len(text) < 300  # the value is shortened


def test_decimal_bounds_are_inclusive() -> None:
    assert decimal(b"1", "f", low=1, high=2, accepted="x") == 1
    assert decimal(b"2", "f", low=1, high=2, accepted="x") == 2
    for raw in (b"0", b"3", b"-0"):
        if raw == b"-0":
            assert decimal(raw, "f", low=0, high=2, accepted="x") == 0
            continue
        with pytest.raises(FieldOutOfRange):
            decimal(raw, "f", low=1, high=2, accepted="x")


# --------------------------------------------------------------- timer headers

EXEC = {b"q": "p.exec.q"}


def timer(**headers: bytes) -> list[tuple[str, bytes]]:
    base = {"df-due": b"1800000000000", "df-queue": b"q"}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    return list(base.items())


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (timer(), None),
        (timer(df_due=b"0"), None),
        (timer(df_due=str(MAX_DUE_MS).encode()), None),
        (timer(df_due=b"-1"), None),  # 1969: overdue, fires at once
        (timer(df_due=str(MIN_TIME_MS - 1).encode()), reasons.DUE_OUT_OF_RANGE),
        (timer(df_due=str(MAX_DUE_MS + 1).encode()), reasons.DUE_OUT_OF_RANGE),
        (timer(df_due=str(2**63).encode()), reasons.DUE_OUT_OF_RANGE),
        (timer(df_due=str(2**64).encode()), reasons.DUE_OUT_OF_RANGE),
        (timer(df_due=b"9" * 5000), reasons.DUE_OUT_OF_RANGE),
        (timer(df_due=b" 1800000000000"), reasons.BAD_DUE),
        (timer(df_due=b"+1800000000000"), reasons.BAD_DUE),
        (timer(df_due=b"1_800_000_000_000"), reasons.BAD_DUE),
        (timer(df_due=b""), reasons.BAD_DUE),
        (timer(df_partition=b"0"), None),
        (timer(df_partition=b"-1"), reasons.BAD_PARTITION),
        (timer(df_partition=b"9" * 5000), reasons.BAD_PARTITION),
        (timer(df_kind=b"cron"), None),  # no bookkeeping: runs as a plain job
        (timer(df_kind=b"cron", df_sv=b"0", df_occurrence=b"0"), None),
        (timer(df_kind=b"cron", df_sv=str(MAX_LONG).encode()), None),
        (timer(df_kind=b"cron", df_sv=str(2**63).encode()), reasons.BAD_CRON_HEADER),
        (timer(df_kind=b"cron", df_sv=b"-1"), reasons.BAD_CRON_HEADER),
        (timer(df_kind=b"cron", df_sv=b"v2"), reasons.BAD_CRON_HEADER),
        (timer(df_kind=b"cron", df_occurrence=b"-1"), reasons.BAD_CRON_HEADER),
        (
            timer(df_kind=b"cron", df_occurrence=str(MAX_DUE_MS + 1).encode()),
            reasons.BAD_CRON_HEADER,
        ),
        (timer(df_kind=b"cron", df_occurrence=b"x"), reasons.BAD_CRON_HEADER),
    ],
)
def test_the_emitter_checks_every_timer_header_it_reads(
    headers: list[tuple[str, bytes]], reason: str | None
) -> None:
    found = classify_timer(headers, b"k", EXEC, {b"q": 4})
    if reason is None:
        assert not isinstance(found, str), found
        return
    assert isinstance(found, str)
    assert reasons.reason_label(found) == reason
    assert reason in reasons.QUARANTINE_REASONS


# ------------------------------------------------------------------ job values


def job(**changes: Any) -> Job:
    base = Job(
        job_id="j-1",
        queue="q",
        task="t",
        payload=b"{}",
        due_ms=NOW,
        idempotency_key="j-1",
        created_ms=NOW,
        content_hash="0" * 32,
    )
    return dataclasses.replace(base, **changes)


def fields(j: Job) -> tuple[Any, ...]:
    return tuple(getattr(j, f) for f in Job.__slots__)


BACKOFF = Backoff(BackoffKind.EXPONENTIAL, base_ms=1_000, max_ms=60_000, multiplier=2.0)

GOOD_JOBS = [
    job(),
    job(due_ms=0, created_ms=0),
    job(due_ms=MAX_DUE_MS, created_ms=MAX_DUE_MS),
    job(job_id="x" * 512, idempotency_key="k" * 512),
    job(queue="q" * 255),
    job(max_attempts=1),
    job(max_attempts=MAX_INT32),
    job(timeout_ms=1),
    job(timeout_ms=MAX_LONG),
    job(backoff=BACKOFF),
    job(backoff=Backoff(BackoffKind.FIXED, base_ms=0, max_ms=0, multiplier=1.0)),
    job(backoff=Backoff(BackoffKind.NONE, base_ms=MAX_LONG, max_ms=MAX_LONG, multiplier=1000.0)),
    job(jitter_ms=MAX_DUE_MS),
    job(schedule_id="s", schedule_version=0),
    job(schedule_id="s", schedule_version=MAX_LONG),
    job(content_type="text/plain; charset=utf-8"),
    job(content_hash=None),
    job(labels={"a" * 1000: "b" * 1000}, trace={"traceparent": "x"}),
]

BAD_JOBS: list[tuple[Job, str]] = [
    (job(job_id=""), "job_id"),
    (job(job_id="x" * 513), "job_id"),
    (job(idempotency_key=""), "idempotency_key"),
    (job(idempotency_key="k" * 513), "idempotency_key"),
    (job(queue=""), "queue"),
    (job(queue="q" * 256), "queue"),
    *[(job(due_ms=v), "due_ms") for v in (MIN_TIME_MS - 1, MAX_DUE_MS + 1, *INT64_OVER, -(2**63))],
    *[(job(created_ms=v), "created_ms") for v in (MIN_TIME_MS - 1, MAX_DUE_MS + 1, *INT64_OVER)],
    *[(job(max_attempts=v), "max_attempts") for v in (0, -1, MAX_INT32 + 1, *INT64_OVER)],
    *[(job(timeout_ms=v), "timeout_ms") for v in (0, -1, -5_000, -(2**63), *INT64_OVER)],
    *[(job(jitter_ms=v), "jitter_ms") for v in (-1, MAX_DUE_MS + 1, *INT64_OVER)],
    (job(content_type=""), "content_type"),
    (job(content_type="a" * 256), "content_type"),
    (job(content_type="text/\x1bplain"), "content_type"),
    (job(content_type="text/plaïn"), "content_type"),
    (job(schedule_id=""), "schedule_id"),
    (job(schedule_version=-1), "schedule_version"),
    (job(schedule_version=2**63), "schedule_version"),
    (job(content_hash="h" * 256), "content_hash"),
    (job(backoff=dataclasses.replace(BACKOFF, base_ms=-1)), "backoff.base_ms"),
    (job(backoff=dataclasses.replace(BACKOFF, max_ms=2**63)), "backoff.max_ms"),
    (job(backoff=dataclasses.replace(BACKOFF, base_ms=10, max_ms=5)), "backoff.max_ms"),
    (job(backoff=dataclasses.replace(BACKOFF, multiplier=0.5)), "backoff.multiplier"),
    (job(backoff=dataclasses.replace(BACKOFF, multiplier=1000.5)), "backoff.multiplier"),
    (job(backoff=dataclasses.replace(BACKOFF, multiplier=math.nan)), "backoff.multiplier"),
    (job(backoff=dataclasses.replace(BACKOFF, multiplier=math.inf)), "backoff.multiplier"),
]


@pytest.mark.parametrize("good", GOOD_JOBS, ids=range(len(GOOD_JOBS)))
def test_a_job_in_range_passes(good: Job) -> None:
    check_job(fields(good))


@pytest.mark.parametrize(
    ("bad", "field"), BAD_JOBS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_JOBS)]
)
def test_a_job_field_out_of_range_is_named(bad: Job, field: str) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        check_job(fields(bad))
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert "accepted: " in str(info.value)


def test_a_varint_past_64_bits_decodes_and_is_then_refused() -> None:
    """The Avro decoder reads up to 10 varint bytes (70 bits): a max_attempts of 2**64
    decodes, so the range is checked after decoding, and the record is refused."""
    four = codec.encode("job", job(max_attempts=4).to_record())
    five = codec.encode("job", job(max_attempts=5).to_record())
    at = next(i for i, (a, b) in enumerate(zip(four, five, strict=True)) if a != b)
    zigzag = 2**65  # 2**64, zig-zag encoded
    varint = bytes([(zigzag >> (7 * i)) & 0x7F | (0x80 if i < 9 else 0) for i in range(10)])
    value = four[:at] + varint + four[at + 1 :]
    assert fast.decode_job_fields(value)[8] == 2**64
    d = delivery(job(), fired(job()), value=value)
    assert d.bad is not None
    assert d.bad[1].message.startswith("max_attempts: ")


# ------------------------------------------------------------------ job headers


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        ({}, 1),
        ({"df-attempt": b"1"}, 1),
        ({"df-attempt": b"2"}, 2),
        ({"df-attempt": b"%d" % MAX_INT32}, MAX_INT32),
    ],
)
def test_df_attempt_in_range(headers: dict[str, bytes], attempt: int) -> None:
    assert attempt_of(headers) == attempt


@pytest.mark.parametrize(
    "raw",
    [b"0", b"-1", b"%d" % (MAX_INT32 + 1), b"%d" % 2**63, b"%d" % 2**64, b"9" * 400, *NOT_NUMBERS],
)
def test_df_attempt_out_of_range(raw: bytes) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        attempt_of({"df-attempt": raw})
    assert info.value.field == "df-attempt"


def test_df_expires_and_df_overlap() -> None:
    assert expires_of({}) is None
    assert expires_of({"df-expires": b"0"}) == 0
    assert expires_of({"df-expires": b"%d" % MAX_DUE_MS}) == MAX_DUE_MS
    for raw in (b"%d" % (MIN_TIME_MS - 1), b"%d" % (MAX_DUE_MS + 1), b"soon"):
        with pytest.raises(FieldOutOfRange):
            expires_of({"df-expires": raw})
    for policy in (b"allow", b"skip", b"buffer_one"):
        assert overlap_of({"df-overlap": policy}) == policy
    for raw in (b"", b"SKIP", b"buffer"):
        with pytest.raises(FieldOutOfRange):
            overlap_of({"df-overlap": raw})


def h(**pairs: int | bytes) -> dict[str, bytes]:
    return {
        k.replace("_", "-"): v if isinstance(v, bytes) else str(v).encode()
        for k, v in pairs.items()
    }


@pytest.mark.parametrize(
    ("headers", "due"),
    [
        (h(), NOW - 5),  # no df-due: the value's
        (h(df_due=NOW - 10, df_fired=NOW - 5), NOW - 10),
        (h(df_due=NOW + SKEW, df_fired=NOW), NOW + SKEW),  # a clock ahead: held, not refused
        (h(df_due=NOW + SKEW), NOW + SKEW),  # no df-fired: written now
        (h(df_due=NOW - 5, df_fired=NOW + SKEW), NOW - 5),
        # a redrive: df-due now, df-fired of the original fire long ago
        (h(df_due=NOW, df_fired=NOW - 86_400_000, df_redriven_at=NOW), NOW),
        (
            h(df_due=NOW - 1, df_fired=NOW - 9, df_first_failure=NOW - 9, df_last_failure=NOW - 2),
            NOW - 1,
        ),
    ],
)
def test_an_exec_record_due_when_written_passes(headers: dict[str, bytes], due: int) -> None:
    assert exec_not_before(headers, NOW - 5, now_ms=NOW, skew_ms=SKEW) == due


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        # year 3000: the probe finding that held a partition for ever
        (h(df_due=32_503_680_000_000, df_fired=NOW), "df-due"),
        (h(df_due=NOW + SKEW + 1, df_fired=NOW), "df-due"),
        (h(df_due=NOW + SKEW + 1), "df-due"),
        (h(df_due=NOW + 60_000, df_fired=NOW - 86_400_000), "df-due"),
        (h(df_due=NOW, df_fired=NOW + SKEW + 1), "df-fired"),
        (h(df_due=32_503_680_000_000, df_fired=32_503_680_000_000), "df-fired"),
        (h(df_due=NOW + 86_400_000, df_redriven_at=NOW + 86_400_000), "df-redriven-at"),
        (h(df_due=NOW + 60_000, df_fired=NOW, df_redriven_at=NOW - 60_000), "df-due"),
        (h(df_last_failure=NOW + SKEW + 1), "df-last-failure"),
        (h(df_first_failure=2**64), "df-first-failure"),
        (h(df_due=b"soon"), "df-due"),
        (h(df_due=MIN_TIME_MS - 1), "df-due"),
        (h(df_fired=b""), "df-fired"),
    ],
)
def test_an_exec_record_due_later_than_written_is_refused(
    headers: dict[str, bytes], field: str
) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        exec_not_before(headers, NOW - 5, now_ms=NOW, skew_ms=SKEW)
    assert info.value.field == field


def test_an_exec_record_without_df_due_is_bounded_by_its_value() -> None:
    with pytest.raises(FieldOutOfRange) as info:
        exec_not_before({}, NOW + SKEW + 1, now_ms=NOW, skew_ms=SKEW)
    assert info.value.field == "due_ms"


LONGEST = 60_000


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        (h(df_due=NOW + 1_000, df_last_failure=NOW), True),
        (h(df_due=NOW + LONGEST + SKEW, df_last_failure=NOW), True),
        (h(df_due=NOW + LONGEST + SKEW + 1, df_last_failure=NOW), False),
        (h(df_due=NOW + LONGEST + SKEW), True),  # no df-last-failure: failed now
        (h(df_due=NOW + LONGEST + SKEW + 1), False),
        (h(df_due=NOW + 1_000, df_last_failure=NOW + SKEW + 1), False),
        (h(df_due=32_503_680_000_000, df_last_failure=32_503_680_000_000 - 1_000), False),
        # a retry carries the df-fired of the exec record it came from: in the past
        (h(df_due=NOW + 1_000, df_last_failure=NOW, df_fired=NOW - 3_600_000), True),
        (h(df_due=NOW + 1_000, df_last_failure=NOW, df_fired=NOW + 3_600_000), False),
    ],
)
def test_a_retry_record_is_due_within_its_longest_delay(
    headers: dict[str, bytes], ok: bool
) -> None:
    def check() -> int:
        return retry_not_before(
            headers, NOW - 5, now_ms=NOW, skew_ms=SKEW, longest_delay_ms=LONGEST
        )

    if ok:
        assert check() == int(headers["df-due"])
    else:
        with pytest.raises(FieldOutOfRange):
            check()


def test_the_longest_retry_delay_is_the_top_tier_or_a_policys_cap() -> None:
    assert longest_retry_delay_ms((1_000, 10_000)) == 10_000
    assert longest_retry_delay_ms((1_000, 10_000), None, BACKOFF) == 60_000
    none = Backoff(BackoffKind.NONE, base_ms=0, max_ms=10**9)
    assert longest_retry_delay_ms((1_000,), none) == 1_000
    huge = dataclasses.replace(BACKOFF, max_ms=MAX_LONG)
    assert longest_retry_delay_ms((1_000,), huge) == MAX_DUE_MS


def test_ms_or_keeps_what_a_dead_letter_can_encode() -> None:
    assert ms_or(None, 7) == 7
    assert ms_or(b"5", 7) == 5
    for raw in (b"%d" % (MIN_TIME_MS - 1), b"%d" % 2**64, b"x"):
        assert ms_or(raw, 7) == 7


# ------------------------------------------------------------------- prepare

QUEUE_TIERS = (1_000, 10_000)


@task("t", queue="q")
def handler(payload: Any, ctx: Any) -> None:
    return None


REGISTRY = TaskRegistry([handler])


def delivery(
    j: Job,
    headers: list[tuple[str, bytes]],
    *,
    tier: int | None = None,
    key: bytes | None = b"k",
    value: bytes | None = None,
) -> Delivery:
    topic = "p.exec.q" if tier is None else f"p.retry.q.{tier}"
    feed = PartitionFeed(topic, 0, tier, MemoryKeyStore(10**9))
    data = codec.encode("job", j.to_record()) if value is None else value
    d = Delivery(feed, MemoryRecord(topic, 0, 7, key, data, headers, NOW), 7)
    prepare(d, REGISTRY, now_ms=NOW, limits=WireLimits(skew_ms=SKEW, tiers_ms=QUEUE_TIERS))
    return d


def fired(j: Job, **extra: int | bytes) -> list[tuple[str, bytes]]:
    return hdr.replace(exec_headers(j, fired_ms=NOW), list(h(**extra).items()))


def test_a_good_record_is_ready_to_run() -> None:
    d = delivery(job(due_ms=NOW - 5), fired(job(due_ms=NOW - 5), df_attempt=3))
    assert d.bad is None
    assert (d.attempt, d.not_before, d.key, d.task is not None) == (3, NOW - 5, b"k", True)


@pytest.mark.parametrize(
    ("j", "headers", "field"),
    [
        # the probe findings: a slot taken for ever, a partition held for ever, a
        # handler run to a timeout on every attempt
        (job(), [("df-attempt", b"%d" % 2**64)], "df-attempt"),
        (job(), [("df-due", b"32503680000000"), ("df-fired", b"%d" % NOW)], "df-due"),
        (job(timeout_ms=-5_000), [], "timeout_ms"),
        (job(max_attempts=0), [], "max_attempts"),
        (job(due_ms=MIN_TIME_MS - 1), [], "due_ms"),
        (job(), [("df-expires", b"tomorrow")], "df-expires"),
        (job(), [("df-overlap", b"sometimes")], "df-overlap"),
    ],
)
def test_a_record_out_of_range_is_dead_lettered_at_once_and_never_held(
    j: Job, headers: list[tuple[str, bytes]], field: str
) -> None:
    d = delivery(j, [*fired(j), *headers])
    assert d.bad is not None
    reason, failure = d.bad
    assert reason == reasons.OUT_OF_RANGE
    assert failure.message.startswith(f"{field}: ")
    assert failure.permanent
    assert d.not_before == 0  # due at once: it never holds its partition
    assert d.task is None  # never started
    assert d.attempt == 1


def test_a_record_with_an_empty_key_is_refused() -> None:
    d = delivery(job(), fired(job()), key=b"")
    assert d.bad is not None
    assert d.bad[1].message.startswith("key: ")
    d = delivery(job(), fired(job()), key=None)  # no key: the value's idempotency key
    assert d.bad is None
    assert d.key == b"j-1"


def test_an_undecodable_record_is_due_at_once_whatever_its_df_due() -> None:
    d = delivery(job(), [("df-due", b"32503680000000")], value=b"\x00garbage")
    assert d.bad is not None
    assert d.bad[0] == reasons.UNDECODABLE
    assert d.not_before == 0


def test_a_retry_record_s_due_is_bounded_by_the_job_s_backoff() -> None:
    j = job(backoff=BACKOFF)  # max 60 s: longer than the queue's top tier (10 s)
    ok = [("df-attempt", b"2"), *h(df_due=NOW + 59_000, df_last_failure=NOW).items()]
    assert delivery(j, [*fired(j), *ok], tier=10_000).bad is None
    late = [("df-attempt", b"2"), *h(df_due=NOW + 60_000 + SKEW + 1, df_last_failure=NOW).items()]
    d = delivery(j, [*fired(j), *late], tier=10_000)
    assert d.bad is not None
    assert d.bad[0] == reasons.OUT_OF_RANGE
    plain = job()
    tiered = [*h(df_due=NOW + 10_000 + SKEW + 1, df_last_failure=NOW).items()]
    assert delivery(plain, [*fired(plain), *tiered], tier=1_000).bad is not None


def test_a_record_whose_headers_cannot_be_read_is_dead_lettered_not_raised() -> None:
    class Broken(MemoryRecord):
        def headers(self) -> Any:
            raise RuntimeError("no headers")

    feed = PartitionFeed("p.exec.q", 0, None, MemoryKeyStore(10**9))
    d = Delivery(feed, Broken("p.exec.q", 0, 7, b"k", b"", [], NOW), 7)
    prepare(d, REGISTRY, now_ms=NOW, limits=WireLimits())
    assert d.bad is not None
    assert (d.hmap, d.key, d.attempt, d.not_before, d.rechecked) == ({}, b"", 1, 0, False)


def test_prepare_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong reading a record dead-letters it (a bug must not stop the
    partition)."""
    import dueflow.consumers.feeds as feeds

    def broken(*_: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(feeds, "attempt_of", broken)
    d = delivery(job(), fired(job()))
    assert d.bad is not None
    assert d.bad[0] == reasons.UNDECODABLE
    assert d.not_before == 0
    assert d.task is None


# ------------------------------------------------------- what a refusal writes


@pytest.mark.parametrize(
    ("reason", "header"),
    [(reasons.OUT_OF_RANGE, DEAD_LETTER_V2), (reasons.UNDECODABLE, DEAD_LETTER_V1)],
)
def test_a_dead_letter_is_version_1_unless_its_reason_is_new(reason: str, header: bytes) -> None:
    headers = dead_letter_headers([], failure=permanent("X", "y"), attempts=0, reason=reason)
    assert hdr.header(headers, hdr.SCHEMA) == header


# ------------------------------------------------------------ other records


def key_state(**changes: Any) -> bytes:
    rec: dict[str, Any] = {
        "idempotency_key": "k",
        "job_id": "j",
        "state": "done",
        "at_ms": NOW,
        "attempts": 0,
    }
    rec.update(changes)
    return fast.encode_key_state(**rec)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (key_state(at_ms=MIN_TIME_MS - 1), "at_ms"),
        (key_state(at_ms=MAX_DUE_MS + 1), "at_ms"),
        (key_state(at_ms=2**62), "at_ms"),
        (key_state(state="retrying", attempts=-1), "attempts"),
        (key_state(state="retrying", attempts=MAX_INT32 + 1), "attempts"),
    ],
)
def test_an_idempotency_record_out_of_range_is_refused(value: bytes, field: str) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        fast.decode_key_state(value, fast.IDEMPOTENCY_V2)
    assert info.value.field == field


def test_a_negative_key_state_is_no_state() -> None:
    """State -1 indexed the states from the end: version 1 read it as ``cancelled``
    (a job silently skipped)."""
    good = key_state()
    bad = good[:4] + b"\x01" + good[5:]  # zig-zag 1 = -1
    for schema in (fast.IDEMPOTENCY_V1, fast.IDEMPOTENCY_V2):
        with pytest.raises(UndecodableRecord):
            fast.decode_key_state(bad, schema)


def test_a_reschedule_due_out_of_range_is_refused() -> None:
    rec = {
        "idempotency_key": "k",
        "job_id": "j",
        "state": "cancelled",
        "at_ms": NOW,
        "run_only_due_ms": MAX_DUE_MS + 1,
    }
    value = codec.encode("idempotency", rec, version=3)
    with pytest.raises(FieldOutOfRange):
        fast.decode_key_record(value, codec.schema_header("idempotency", 3))


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b'{"action": "pause", "at_ms": -62135596800001}', "at_ms"),
        (b'{"action": "pause", "at_ms": 253402300800000}', "at_ms"),
        (b'{"action": "pause", "at_ms": "now"}', "at_ms"),
        (b'{"action": "pause", "at_ms": true}', "at_ms"),
        (b'{"action": "pause", "by": 5}', "by"),
        (b'{"action": "pause", "by": "' + b"b" * 256 + b'"}', "by"),
        (b'{"action": "pause", "reason": ["x"]}', "reason"),
        (b'{"action": "pause", "reason": "' + b"r" * 1001 + b'"}', "reason"),
    ],
)
def test_a_control_record_out_of_range_is_refused(value: bytes, field: str) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        decode_control(b"queue:q", value)
    assert info.value.field == field
    ok = decode_control(b"queue:q", b'{"action": "pause", "at_ms": 0, "by": "ada", "reason": ""}')
    assert ok is not None
    assert ok.paused


def outcome(**changes: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "job_id": "j",
        "queue": "q",
        "task": "t",
        "idempotency_key": "k",
        "state": "succeeded",
        "attempt": 1,
        "at_ms": NOW,
        "due_ms": NOW,
        "duration_ms": 1.5,
    }
    rec.update(changes)
    return rec


@pytest.mark.parametrize(
    ("rec", "field"),
    [
        (outcome(job_id=""), "job_id"),
        (outcome(attempt=-1), "attempt"),
        (outcome(attempt=MAX_INT32 + 1), "attempt"),
        (outcome(at_ms=MIN_TIME_MS - 1), "at_ms"),
        (outcome(at_ms=2**63 - 1), "at_ms"),
        (outcome(due_ms=MAX_DUE_MS + 1), "due_ms"),
        (outcome(duration_ms=-0.5), "duration_ms"),
        (outcome(duration_ms=math.nan), "duration_ms"),
        (outcome(duration_ms=math.inf), "duration_ms"),
        (outcome(progress=math.nan), "progress"),
        (outcome(progress=-0.01), "progress"),
        (outcome(progress=1.5), "progress"),
    ],
)
def test_an_outcome_out_of_range_is_refused(rec: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldOutOfRange) as info:
        check_outcome(rec)
    assert info.value.field == field
    assert check_outcome(outcome(due_ms=None, duration_ms=None, attempt=0)) is not None
    assert check_outcome(outcome(progress=0.0)) is not None
    assert check_outcome(outcome(progress=1.0)) is not None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"partitions": 0}, "partitions"),
        ({"partitions": MAX_INT32 + 1}, "partitions"),
        ({"rate_limit_per_s": math.inf}, "rate_limit_per_s"),
        ({"rate_limit_per_s": math.nan}, "rate_limit_per_s"),
        ({"retry_tiers_ms": [500, 200]}, "retry_tiers_ms"),
        ({"idempotency_retention_ms": 0}, "idempotency_retention_ms"),
    ],
)
def test_a_queue_registry_record_out_of_range_is_refused(
    changes: dict[str, Any], field: str
) -> None:
    rec: dict[str, Any] = {
        "name": "q",
        "partitions": 1,
        "retry_tiers_ms": [200],
        "idempotency_retention_ms": 1_000,
        "rate_limit_per_s": None,
        "created_ms": 1,
        "created_by": "x",
        **changes,
    }
    headers = [(hdr.SCHEMA, codec.schema_header("queue"))]
    with pytest.raises(UndecodableRecord) as info:
        decode_queue(b"q", codec.encode("queue", rec), headers)
    assert f"queue 'q'.{field}" in str(info.value)
