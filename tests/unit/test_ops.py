"""The pure rules of the operator tools: control records, bounds, DLQ filters, redrive
and replay headers, and what may be redriven."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import orjson
import pytest

from dueflow import headers as hdr
from dueflow.apps.ops.bounds import Bound, parse_bound, parse_time
from dueflow.apps.ops.dlq import DeadLetterEntry, DlqFilter, latest_per_key, parse_ref
from dueflow.apps.ops.redrive import redrive_headers, redrive_verdict
from dueflow.apps.ops.replay import replay_headers
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor, abandon, call_with_deadline
from dueflow.records.pause_command import (
    QueueControl,
    decode_control,
    encode_control,
    paused_queues,
)

NOW = 1_700_000_000_000


# ------------------------------------------------------------------------ control


def test_control_records_round_trip_and_fold_to_the_paused_queues() -> None:
    pause = QueueControl("billing", paused=True, by="ada", at_ms=NOW, reason="outage")
    key, value = encode_control(pause)
    assert key == b"queue:billing"
    assert decode_control(key, value) == pause
    resume = QueueControl("billing", paused=False, by="bob", at_ms=NOW + 1)
    other = QueueControl("media", paused=True)
    assert paused_queues([pause, other, resume]) == {"media": other}
    assert decode_control(b"queue:billing", None) == QueueControl("billing", paused=False)
    assert decode_control(b"something:else", b"{}") is None  # not ours: ignored


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (None, b"{}", "without a key"),
        (b"\xff\xfe", b"{}", "not UTF-8"),
        (b"queue:", b'{"action": "pause"}', "names no queue"),
        (b"queue:q", b"not json", "not JSON"),
        (b"queue:q", b'{"action": "explode"}', "no action"),
        (b"queue:q", b"[1, 2]", "no action"),
        (b"queue:q", b'{"action": "pause", "queue": "other"}', "names queue"),
    ],
)
def test_a_control_record_that_is_no_command_says_why(
    key: bytes | None, value: bytes, why: str
) -> None:
    with pytest.raises(UndecodableRecord, match=why):
        decode_control(key, value)


# ------------------------------------------------------------------------ bounds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1200", Bound(offset=1200)),
        ("2h", Bound(time_ms=NOW - 7_200_000)),
        ("90s", Bound(time_ms=NOW - 90_000)),
        ("2023-11-14T22:13:20Z", Bound(time_ms=NOW)),
        ("2023-11-14T23:13:20+01:00", Bound(time_ms=NOW)),
    ],
)
def test_bounds_are_offsets_times_or_durations_ago(text: str, expected: Bound) -> None:
    assert parse_bound(text, field="from", now_ms=NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "2023-11-14T22:13:20", "-5m"])
def test_a_bad_bound_names_the_field_and_what_is_accepted(text: str) -> None:
    with pytest.raises(InvalidInput, match="from"):
        parse_bound(text, field="from", now_ms=NOW)


def test_a_time_is_never_bare_digits() -> None:
    with pytest.raises(InvalidInput, match="since"):
        parse_time("1200", field="since", now_ms=NOW)


# ------------------------------------------------------------------------ DLQ


def entry(
    partition: int = 0,
    offset: int = 0,
    *,
    key: str | None = "k",
    task: str = "t",
    reason: str = "exhausted",
    dead_ms: int = NOW,
    record: bool = True,
) -> DeadLetterEntry:
    rec: dict[str, Any] | None = None
    if record:
        rec = {
            "job_id": f"job-{key}",
            "task": task,
            "idempotency_key": key,
            "reason": reason,
            "error_type": "ValueError",
            "error_message": "boom",
            "attempts": 3,
            "dead_ms": dead_ms,
            "job_value": b"v",
            "job_headers": {},
        }
    return DeadLetterEntry(
        queue="q",
        topic="p.dlq.q",
        partition=partition,
        offset=offset,
        timestamp_ms=dead_ms,
        key=None if key is None else key.encode(),
        headers=(),
        record=rec,
        problem=None if record else "bad bytes",
    )


def test_dlq_filters_combine_and_empty_ones_match_everything() -> None:
    e = entry(task="send", reason="timeout", dead_ms=NOW)
    assert DlqFilter().matches(e)
    assert DlqFilter(tasks=frozenset({"send"}), reasons=frozenset({"timeout"})).matches(e)
    assert not DlqFilter(tasks=frozenset({"other"})).matches(e)
    assert DlqFilter(since_ms=NOW, until_ms=NOW + 1).matches(e)
    assert not DlqFilter(since_ms=NOW + 1).matches(e)
    assert not DlqFilter(until_ms=NOW).matches(e)
    assert DlqFilter(refs=frozenset({(0, 0)})).matches(e)
    assert not DlqFilter(partitions=frozenset({1})).matches(e)
    assert DlqFilter(error_types=frozenset({"ValueError"})).matches(e)
    assert DlqFilter(job_ids=frozenset({"job-k"}), keys=frozenset({"k"})).matches(e)
    with pytest.raises(InvalidInput, match="until"):
        DlqFilter(since_ms=NOW, until_ms=NOW)


def test_undecodable_dlq_records_are_listed_with_their_problem() -> None:
    e = entry(record=False)
    assert (e.reason, e.error_type, e.job_id) == ("undecodable", "UndecodableRecord", "?")
    assert e.summary()["error_message"] == "bad bytes"


def test_refs_and_the_newest_entry_per_key() -> None:
    assert parse_ref(" 3:120 ") == (3, 120)
    with pytest.raises(InvalidInput, match="PARTITION:OFFSET"):
        parse_ref("3-120")
    old, new, other = entry(0, 1), entry(0, 5), entry(1, 2)
    assert latest_per_key([new, old, other]) == {(0, "k"): new, (1, "k"): other}


# ------------------------------------------------------------------------ redrive


def test_redrive_starts_the_job_over_and_says_who_when_and_from_where() -> None:
    job_headers = {
        hdr.DUE: b"1",
        hdr.ATTEMPT: b"4",
        hdr.ERROR: b"ValueError: boom",
        hdr.FIRST_FAILURE: b"2",
        hdr.LAST_FAILURE: b"3",
        hdr.ORIGIN: b"t:0:1",
        hdr.JOB_ID: b"j",
        hdr.TRACEPARENT: b"00-abc-def-01",
    }
    out = dict(redrive_headers(job_headers, by="ada", at_ms=NOW, source="p.dlq.q:3:9"))
    assert out == {
        hdr.JOB_ID: b"j",
        hdr.TRACEPARENT: b"00-abc-def-01",
        hdr.ATTEMPT: b"1",
        hdr.DUE: str(NOW).encode(),
        hdr.REDRIVEN_BY: b"ada",
        hdr.REDRIVEN_AT: str(NOW).encode(),
        hdr.REDRIVEN_FROM: b"p.dlq.q:3:9",
    }


@pytest.mark.parametrize(
    ("state", "latest", "why"),
    [
        (("dead", NOW), True, None),
        (("dead", NOW), False, "newer DLQ record"),
        (None, True, "already redriven"),
        (("done", NOW + 5), True, "already redriven and done"),
        (("cancelled", NOW + 5), True, "cancelled"),
        (("dead", NOW + 5), True, "died again"),
    ],
)
def test_only_the_latest_death_of_a_still_dead_key_is_redriven(
    state: tuple[str, int] | None, latest: bool, why: str | None
) -> None:
    got = redrive_verdict(entry(dead_ms=NOW), state, latest=latest)
    if why is None:
        assert got is None
    else:
        assert got is not None
        assert why in got


def test_records_without_a_key_or_a_decodable_value_are_not_redriven() -> None:
    assert "idempotency key" in (redrive_verdict(entry(key=None), None, latest=True) or "")
    assert "does not decode" in (
        redrive_verdict(entry(record=False), ("dead", NOW), latest=True) or ""
    )


# ------------------------------------------------------------------------ replay


def test_replay_keeps_every_header_and_adds_where_from() -> None:
    original = [(hdr.DUE, b"123"), (hdr.ATTEMPT, b"2"), (hdr.REPLAYED_FROM, b"old")]
    out = replay_headers(original, source="t:1:2", by="ada", at_ms=NOW)
    assert out == [
        (hdr.DUE, b"123"),
        (hdr.ATTEMPT, b"2"),
        (hdr.REPLAYED_FROM, b"t:1:2"),
        (hdr.REPLAYED_BY, b"ada"),
        (hdr.REPLAYED_AT, str(NOW).encode()),
    ]


# ------------------------------------------------------------------------ blocking


def test_a_call_that_does_not_return_in_time_is_reported_wedged() -> None:
    executor = DaemonThreadExecutor("test-blocking")
    release = threading.Event()
    try:
        assert call_with_deadline(executor, 5.0, lambda: 42) == 42
        with pytest.raises(ClientWedged, match="did not return within"):
            call_with_deadline(executor, 0.05, release.wait)
        with pytest.raises(ZeroDivisionError):
            call_with_deadline(DaemonThreadExecutor("t2"), 5.0, lambda: 1 / 0)
    finally:
        release.set()
        executor.shutdown(wait=True)
    assert not executor._thread.is_alive()
    with pytest.raises(RuntimeError, match="shutdown"):
        executor.submit(lambda: None)


def test_an_abandoned_client_is_never_destroyed() -> None:
    class Client:
        pass

    client = Client()
    ref = weakref.ref(client)
    abandon(client)
    del client
    gc.collect()
    assert ref() is not None  # its destructor would block: it is kept referenced


def test_control_values_are_json_documents() -> None:
    _key, value = encode_control(QueueControl("q", paused=True, by="a", at_ms=1, reason="r"))
    assert orjson.loads(value) == {
        "v": 1,
        "action": "pause",
        "queue": "q",
        "by": "a",
        "at_ms": 1,
        "reason": "r",
    }


def test_who_replays_or_redrives_is_at_most_200_characters() -> None:
    """The size budget counts df-replayed-by and df-redriven-by at 200 characters."""
    from dueflow.apps.ops.redrive import Redriver
    from dueflow.apps.ops.replay import Replayer
    from dueflow.config import load_settings

    settings = load_settings(env={}, overrides={})
    Redriver(settings, by="é" * 200)
    Replayer(settings, by="")
    with pytest.raises(InvalidInput, match=r"by: got .*at most 200 characters"):
        Redriver(settings, by="x" * 201)
    with pytest.raises(InvalidInput, match=r"by: got .*at most 200 characters"):
        Replayer(settings, by="x" * 201)


def test_a_dead_letter_by_reference_names_where_its_value_is() -> None:
    from dueflow.apps.ops.redrive_input import size_verdict, value_ref

    def entry(job_headers: dict[str, bytes]) -> DeadLetterEntry:
        return DeadLetterEntry(
            "jobs",
            "dueflow.dlq.jobs",
            1,
            5,
            0,
            b"k",
            (),
            {"job_value": b"", "job_headers": job_headers},
        )

    assert value_ref(entry({"df-value-ref": b"dueflow.exec.jobs:1:99"})) == (
        "dueflow.exec.jobs",
        1,
        99,
    )
    assert value_ref(entry({})) is None
    assert value_ref(entry({"df-value-ref": b"nonsense"})) == ("?", -1, -1)
    assert size_verdict("t", 1_000, 10**9, b"k", b"v" * 100, []) is None
    why = size_verdict("t", 1_000, 10**9, b"k", b"v" * 1_000, [])
    assert why is not None
    assert why.startswith(
        "the redriven record would be 1071 bytes, over max.message.bytes 1000 of t"
    )
