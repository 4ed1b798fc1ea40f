"""The group owner and a member's worker in the applier (dueflow.consumers.fan_in_owner): what
group commands, members' ends and the sweep add to the batch, record by record."""

from __future__ import annotations

from typing import Any

from dueflow import headers as hdr
from dueflow.consumers.fan_in_owner import GroupBook
from dueflow.group_model import GroupResults, GroupState
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.command import command_key, decode_command
from dueflow.records.group_state import (
    decode_group_state,
    group_key,
    member_address,
    notice_due_ms,
)
from dueflow.records.timer_record import JOB_SCHEMA, TimerPlacer
from dueflow.rules import fan_in
from dueflow.steering_model import Command
from tests.unit.test_command_applier import DUE, NOW, SETTINGS, N, World

THEN = Job("cb", "q", "t", b"{}", DUE, "cb", NOW, content_hash="h1")


def _job_value(job: Job) -> bytes:
    return codec.encode("job", job.to_record())


def group_cmd(op: str, cid: str, **group: Any) -> Command:
    spec = {"group_id": "g1", "size": None, "members": [], "then": None, **group}
    return Command(cid, op, "cb", "g1", "q", at_ms=NOW, job_schema=JOB_SCHEMA.decode(), group=spec)


def member_end(member: str, state: str) -> Command:
    spec = {"group_id": "g1", "member_job_id": member, "state": state}
    return Command(f"{member}.ended", "member_ended", member, "g1", "q", at_ms=NOW, member=spec)


def owner() -> World:
    """An applier that owns partition 1 and has read its groups."""
    w = World()
    w.applier.groups.book.attach(1)
    w.applier.groups.book.load(1, {}, whole=True)
    return w


def apply(w: World, cmd: Command) -> list[tuple[Any, ...]]:
    d = w.command(cmd, key=command_key(b"g1"))
    assert w.applier.command(d, NOW, running=()) is None
    cut = w.batch.cut([w.feed])
    if cut is None:  # nothing to write (this world tracks no offsets)
        return []
    batch, finals, marks = cut
    w.batch.committed(finals, marks)
    return [r[1:] for r in batch.records]


def by_topic(records: list[tuple[Any, ...]], topic: str) -> list[tuple[Any, ...]]:
    return [r for r in records if r[0] == topic]


def outcomes(records: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for _t, _p, _k, value, headers in by_topic(records, N.outcomes):
        version = codec.parse_schema_header(hdr.header(headers, hdr.SCHEMA), expected="outcome")
        out.append(codec.decode("outcome", value, writer_version=version))
    return out


def test_open_add_seal_and_the_last_end_write_the_callback_once() -> None:
    w = owner()
    members = [Job(f"m{i}", "q", "t", b"{}", NOW, f"m{i}", NOW, content_hash="h") for i in (1, 2)]
    recs = apply(w, group_cmd("group_open", "c1", then=_job_value(THEN)))
    (state_rec,) = by_topic(recs, N.steering("q"))
    assert state_rec[2] == group_key("g1")
    recs = apply(w, group_cmd("group_add", "c2", members=[_job_value(m) for m in members]))
    timers = by_topic(recs, N.timers)
    assert [dict(t[4])[hdr.JOB_ID] for t in timers] == [b"m1", b"m2"]
    assert all(dict(t[4])[hdr.GROUP] == member_address("g1", "q", 1) for t in timers)
    assert [o["state"] for o in outcomes(recs)] == ["scheduled", "scheduled"]
    assert apply(w, group_cmd("group_seal", "c3", size=2))
    apply(w, member_end("m1", "succeeded"))
    apply(w, member_end("m1", "succeeded"))  # a second copy: nothing
    recs = apply(w, member_end("m2", "dead"))
    (callback,) = by_topic(recs, N.timers)
    results = GroupResults.from_json(dict(callback[4])[hdr.GROUP_RESULTS])
    assert results.states() == {"m1": "succeeded", "m2": "dead"}
    (tombstone,) = by_topic(recs, N.steering("q"))
    assert tombstone[3] is None
    assert [o["job_id"] for o in outcomes(recs)] == ["cb"]
    # A late end of a member: the group is gone, only the command's offset commits.
    late = apply(w, member_end("m2", "succeeded"))
    assert by_topic(late, N.timers) == []
    assert by_topic(late, N.steering("q")) == []


def test_a_group_command_for_another_queue_or_key_is_refused() -> None:
    w = owner()
    cmd = group_cmd("group_open", "c1", then=_job_value(THEN))
    d = w.command(cmd, key=command_key(b"other"))
    w.applier.command(d, NOW, running=())
    (verdict,) = outcomes(w.commit())
    assert verdict["state"] == "refused"
    assert "key" in verdict["error"]
    recs = apply(w, group_cmd("group_seal", "c2", size=1))
    (verdict,) = outcomes(recs)
    assert verdict["error"].startswith(fan_in.UNKNOWN_GROUP)


def test_a_members_end_is_a_timer_past_the_near_window_to_its_owner() -> None:
    w = owner()
    member = Job("m7", "q", "t", b"{}", NOW, "m7", NOW, content_hash="h")
    d = w.job(member, [(hdr.GROUP, member_address("g1", "cbq", 2))])
    w.batch.succeeded(d, 0.01, NOW)
    recs = w.commit()
    (notice,) = by_topic(recs, N.timers)
    _topic, _p, key, value, headers = notice
    h = dict(headers)
    assert key == command_key(b"g1")
    assert h[hdr.NOTICE] == b"member-ended"
    assert h[hdr.KIND] == hdr.KIND_JOB.encode()  # what the emitter fires
    assert h[hdr.QUEUE] == b"cbq"
    assert h[hdr.PARTITION] == b"2"
    assert int(h[hdr.DUE]) == notice_due_ms(NOW, TimerPlacer(SETTINGS.wheel))
    assert hdr.is_command(headers)
    cmd = decode_command(value, h[hdr.SCHEMA])
    assert cmd.op == "member_ended"
    assert cmd.member == {
        "group_id": "g1",
        "member_job_id": "m7",
        "state": "succeeded",
        "result": None,
        "error": None,
    }


def test_a_group_not_sealed_in_time_is_given_up_by_the_sweep() -> None:
    w = owner()
    apply(w, group_cmd("group_open", "c1", then=_job_value(THEN)))
    assert w.applier.sweep({1: w.feed}, NOW + fan_in.SEAL_TIMEOUT_MS - 1) == 0
    assert w.applier.sweep({1: w.feed}, NOW + fan_in.SEAL_TIMEOUT_MS) == 1
    recs = w.commit()
    (tombstone,) = by_topic(recs, N.steering("q"))
    assert tombstone[3] is None
    (dead,) = outcomes(recs)
    assert (dead["job_id"], dead["state"]) == ("cb", "dead")
    assert dead["error"].startswith(fan_in.NOT_SEALED)


def test_the_book_reads_a_partition_whole_once_and_keeps_parked_groups() -> None:
    book = GroupBook()
    book.attach(0)
    assert book.unread(0)
    state = GroupState("g1", then_job=b"x")
    book.load(0, {"g1": state, "g2": None}, whole=True)
    assert not book.unread(0)
    assert book.get(0, "g1") == state
    book.park(0)
    book.attach(0)
    assert not book.unread(0)
    assert book.get(0, "g1") == state
    book.load(0, {"g1": None}, whole=False)
    assert book.get(0, "g1") is None
    book.park(0)
    book.drop_parked()
    book.attach(0)
    assert book.unread(0)


def test_a_state_record_decodes_back() -> None:
    w = owner()
    recs = apply(w, group_cmd("group_open", "c1", then=_job_value(THEN)))
    (rec,) = by_topic(recs, N.steering("q"))
    state = decode_group_state(rec[3], dict(rec[4])[hdr.SCHEMA])
    assert state.then_job == _job_value(THEN)
    assert state.opened_ms == NOW


def test_a_burst_of_ends_in_one_batch_writes_the_group_once() -> None:
    w = owner()
    apply(w, group_cmd("group_open", "c1", then=_job_value(THEN)))
    apply(w, group_cmd("group_seal", "c2", size=5))
    for member in ("m1", "m2", "m3"):
        d = w.command(member_end(member, "succeeded"), key=command_key(b"g1"))
        w.applier.command(d, NOW, running=())
    cut = w.batch.cut([w.feed])
    assert cut is not None
    batch, finals, marks = cut
    w.batch.committed(finals, marks)
    (state_rec,) = [r for r in batch.records if r[1] == N.steering("q")]
    state = decode_group_state(state_rec[4], dict(state_rec[5])[hdr.SCHEMA])
    assert state.ended == {"m1": "succeeded", "m2": "succeeded", "m3": "succeeded"}
    assert w.applier.groups.book.get(1, "g1") == state
    # The next batch writes its own record.
    recs = apply(w, member_end("m4", "dead"))
    (state_rec,) = by_topic(recs, N.steering("q"))
    assert decode_group_state(state_rec[3], dict(state_rec[4])[hdr.SCHEMA]).ended["m4"] == "dead"
