"""The owner's side of unique jobs (dueflow.consumers.unique): what an ``admit`` command
and the end of an admitted job add to the batch, record by record; the steering
stores keep unique entries beside job states."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers.steering_store import (
    MemorySteeringStore,
    SqliteSteeringStore,
    SteeringStore,
)
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.command import check_command, command_headers, command_key
from dueflow.records.steering_state import (
    SCHEMA,
    decode_entry,
    encode_entry,
    store_key,
    topic_key,
    unique_key,
)
from dueflow.steering_model import Command, UniqueEntry
from tests.unit.test_command_applier import DUE, NOW, N, World, outcome_of

UKEY = unique_key("report:42")


def job(job_id: str = "j1", payload: bytes = b'{"v":1}') -> Job:
    return Job(job_id, "q", "t", payload, DUE, "k-" + job_id, NOW, content_hash="h0")


def admit(
    job_id: str = "j1",
    cid: str = "c1",
    *,
    on_duplicate: str = "return",
    window_ms: int | None = None,
    value: Job | None = None,
) -> Command:
    value = value or job(job_id)
    return Command(
        cid,
        "admit",
        job_id,
        "k-" + job_id,
        "q",
        NOW,
        job=codec.encode("job", value.to_record()),
        job_schema="dueflow.Job/1",
        unique={
            "key": "report:42",
            "window_ms": window_ms,
            "until": "end",
            "on_duplicate": on_duplicate,
            "extend": False,
        },
    )


def send(w: World, cmd: Command, **changes: Any) -> list[tuple[Any, ...]]:
    key = changes.pop("key", command_key(b"report:42"))
    d = w.delivery(key, changes.pop("value", None) or _encoded(cmd), command_headers(cmd))
    assert w.applier.command(d, NOW, running=()) is None
    return w.commit()


def _encoded(cmd: Command) -> bytes:
    from dueflow.records.command import encode_command

    return encode_command(cmd)


def test_an_admission_writes_the_timer_the_entry_and_the_verdict_in_one_batch() -> None:
    w = World()
    records = send(w, admit())
    assert [r[0] for r in records] == [N.steering("q"), N.timers, N.outcomes]
    state_rec, timer, _out = records
    assert (state_rec[1], state_rec[2]) == (1, UKEY)
    assert decode_entry(state_rec[3], SCHEMA) == UniqueEntry("report:42", "j1", "k-j1", None)
    headers = dict(timer[4])
    assert headers[hdr.PARTITION] == b"1"  # fired into the key's partition: its owner
    assert headers[hdr.UNIQUE] == b"report:42"
    assert hdr.VERSION not in headers
    out = outcome_of(records)
    assert (out["state"], out["job_id"], out["command_id"], out["exec_partition"]) == (
        "scheduled",
        "j1",
        "c1",
        1,
    )
    # a second job under the key: its verdict names the holder, nothing else is written
    again = send(w, admit("j2", "c2"))
    assert [r[0] for r in again] == [N.outcomes]
    out = outcome_of(again)
    assert (out["state"], out["job_id"], out["first_job_id"]) == ("deduplicated", "j2", "j1")


def test_a_replace_writes_the_holder_again_with_the_request_and_supersedes_its_timer() -> None:
    w = World()
    send(w, admit())
    records = send(w, admit("j2", "c2", on_duplicate="replace", value=job("j2", b'{"v":2}')))
    topics = sorted(r[0] for r in records)
    assert topics == sorted([N.steering("q"), N.steering("q"), N.timers, N.outcomes, N.outcomes])
    (timer,) = [r for r in records if r[0] == N.timers]
    headers = dict(timer[4])
    assert (headers[hdr.JOB_ID], headers[hdr.VERSION], headers[hdr.UNIQUE]) == (
        b"j1",
        b"c2",
        b"report:42",
    )
    replaced = codec.decode("job", timer[3], writer_version=1)
    assert (replaced["job_id"], replaced["payload"]) == ("j1", b'{"v":2}')
    held = w.book.get(1, b"k-j1")
    assert held is not None
    assert held.current == "c2"


def test_the_holders_end_releases_the_key_in_the_batch_of_its_end() -> None:
    w = World()
    (_state, timer, _out) = send(w, admit())
    d = w.job(job(), [(hdr.UNIQUE, b"report:42"), (hdr.PARTITION, b"1")])
    assert dict(timer[4])[hdr.UNIQUE] == b"report:42"
    w.batch.succeeded(d, 0.01, NOW)
    records = w.commit()
    assert (N.steering("q"), 1, UKEY, None) in [r[:4] for r in records]  # tombstone
    assert w.book.entry(1, UKEY) is None
    assert [r[0] for r in send(w, admit("j3", "c3"))][1] == N.timers  # admitted


def test_a_window_outlives_the_job_and_the_sweep_removes_it() -> None:
    w = World()
    send(w, admit(window_ms=60_000))
    w.batch.succeeded(w.job(job(), [(hdr.UNIQUE, b"report:42")]), 0.01, NOW)
    w.commit()
    entry = w.book.entry(1, UKEY)
    assert isinstance(entry, UniqueEntry)
    assert entry.state == "ended"
    assert outcome_of(send(w, admit("j2", "c2", window_ms=60_000)))["state"] == "deduplicated"
    assert w.applier.sweep({1: w.feed}, NOW + 59_999) == 0
    assert w.applier.sweep({1: w.feed}, NOW + 60_000) == 1
    w.commit()
    assert w.book.entry(1, UKEY) is None


@pytest.mark.parametrize(
    ("command", "changes", "field"),
    [
        (admit(), {"key": command_key(b"other")}, "key"),
        (admit(value=job("j9")), {}, "job"),
        (admit(window_ms=0), {}, "unique.window_ms"),
        (Command("c1", "admit", "j1", "k-j1", "q", NOW, job=b"x"), {}, "unique"),
    ],
)
def test_an_admit_with_a_bad_field_is_refused_naming_it(
    command: Command, changes: dict[str, Any], field: str
) -> None:
    w = World()
    out = outcome_of(send(w, command, **changes))
    assert out["state"] == "refused"
    assert out["error"].startswith(f"invalid: {field}: got"), out["error"]


@pytest.mark.parametrize(
    ("unique", "field"),
    [
        ({"key": "k\x00", "until": "end"}, "unique.key"),
        ({"key": "k", "window_ms": -5}, "unique.window_ms"),
        ({"key": "k", "until": "success"}, "unique.until"),
        ({"key": "k", "on_duplicate": "ignore"}, "unique.on_duplicate"),
    ],
)
def test_every_door_checks_the_unique_options(unique: dict[str, Any], field: str) -> None:
    from dueflow.errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        check_command(Command("c", "admit", "j", "k", "q", NOW, job=b"x", unique=unique))
    assert caught.value.field == field


def test_entry_codec_and_keys() -> None:
    entry = UniqueEntry("report:42", "j1", "k-j1", 123, "start", "ended", "c9")
    assert decode_entry(encode_entry(entry), SCHEMA) == entry
    assert topic_key(UKEY) == UKEY
    assert topic_key(b"k-j1") == b"j\x00k-j1"
    assert store_key(b"j\x00k-j1") == b"k-j1"
    assert store_key(UKEY) == UKEY
    assert store_key(b"g\x00group") is None


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SteeringStore]:
    if request.param == "memory":
        return lambda: MemorySteeringStore(1_000)
    return lambda: SqliteSteeringStore(tmp_path / "s.sqlite", 1_000)


def test_stores_keep_unique_entries_and_sweep_them_at_the_windows_end(
    make: Callable[[], SteeringStore],
) -> None:
    store = make()
    windowed = UniqueEntry("a", "j1", "k1", 5_000)
    held = UniqueEntry("b", "j2", "k2", None)
    store.put([(unique_key("a"), windowed), (unique_key("b"), held)])
    assert store.get(unique_key("a")) == windowed
    assert store.due_for_sweep(4_999) == []
    assert store.due_for_sweep(5_000) == [(unique_key("a"), windowed)]
    assert len(store) == 2
