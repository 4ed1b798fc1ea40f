"""The group owner's fold (dueflow.rules.fan_in): tables and a model of any order."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.group_model import GroupResults, GroupState, MemberEnd
from dueflow.records.group_state import (
    decode_group_state,
    encode_group_state,
    group_key,
    group_of,
    member_address,
    parse_member_address,
)
from dueflow.records.steering_state import SCHEMA
from dueflow.rules import fan_in

THEN = b"callback-job"


def _open(now: int = 1_000) -> GroupState:
    folded = fan_in.opened(None, group_id="g1", then_job=THEN, now_ms=now)
    assert folded.changed
    assert folded.state is not None
    return folded.state


def test_a_group_completes_once_when_sealed_and_every_member_ended() -> None:
    state: GroupState | None = _open()
    state = fan_in.sealed(state, size=2, now_ms=1_001).state
    first = fan_in.member_ended(state, MemberEnd("m1", "succeeded"), now_ms=1_002)
    assert first.complete is None
    assert first.changed
    last = fan_in.member_ended(first.state, MemberEnd("m2", "dead", error="boom"), now_ms=1_003)
    assert last.complete is not None
    assert last.state is None  # removed in the transaction that writes the callback
    assert last.complete.ended == {"m1": "succeeded", "m2": "dead"}
    assert last.complete.completed_ms == 1_003
    # A member that ends again later (redriven) finds no group: ignored.
    again = fan_in.member_ended(last.state, MemberEnd("m2", "succeeded"), now_ms=1_004)
    assert again.ignored
    assert again.complete is None
    assert not again.changed


def test_ends_before_the_seal_complete_the_group_at_the_seal() -> None:
    state: GroupState | None = _open()
    for member in ("a", "b"):
        state = fan_in.member_ended(state, MemberEnd(member, "cancelled"), now_ms=2).state
        assert state is not None
    done = fan_in.sealed(state, size=2, now_ms=3)
    assert done.complete is not None
    assert done.state is None


def test_a_repeated_end_counts_once_and_the_first_state_stays() -> None:
    state = fan_in.sealed(_open(), size=2, now_ms=1).state
    state = fan_in.member_ended(state, MemberEnd("m1", "dead"), now_ms=2).state
    again = fan_in.member_ended(state, MemberEnd("m1", "succeeded"), now_ms=3)
    assert not again.changed
    assert again.complete is None
    assert again.state is not None
    assert again.state.ended == {"m1": "dead"}


@pytest.mark.parametrize(
    ("size", "code"),
    [(0, fan_in.TOO_LARGE), (fan_in.MAX_MEMBERS + 1, fan_in.TOO_LARGE)],
)
def test_a_seal_out_of_range_is_refused(size: int, code: str) -> None:
    folded = fan_in.sealed(_open(), size=size, now_ms=1)
    assert folded.refused.startswith(code)
    assert not folded.changed


def test_a_seal_of_no_group_or_with_another_size_is_refused() -> None:
    assert fan_in.sealed(None, size=1, now_ms=1).refused.startswith(fan_in.UNKNOWN_GROUP)
    state = fan_in.sealed(_open(), size=3, now_ms=1).state
    assert fan_in.sealed(state, size=4, now_ms=2).refused.startswith(fan_in.SIZE_CHANGED)
    same = fan_in.sealed(state, size=3, now_ms=2)
    assert not same.refused
    assert not same.changed


def test_a_second_open_changes_nothing() -> None:
    state = _open(now=5)
    again = fan_in.opened(state, group_id="g1", then_job=b"other", now_ms=9)
    assert not again.changed
    assert again.state == state


def test_results_are_carried_up_to_the_cap_then_states_only() -> None:
    state = fan_in.sealed(_open(), size=3, now_ms=1).state
    state = fan_in.member_ended(
        state, MemberEnd("a", "succeeded", b'{"w":1}'), now_ms=2, results_max_bytes=10
    ).state
    state = fan_in.member_ended(
        state, MemberEnd("b", "succeeded", b'"0123456789"'), now_ms=3, results_max_bytes=10
    ).state
    assert state is not None
    assert state.results == {"a": b'{"w":1}'}
    assert state.results_truncated
    done = fan_in.member_ended(state, MemberEnd("c", "expired"), now_ms=4).complete
    assert done is not None
    seen = GroupResults.from_json(fan_in.summary_bytes(done))
    assert seen.states() == {"a": "succeeded", "b": "succeeded", "c": "expired"}
    assert [m.result for m in seen.members] == [{"w": 1}, None, None]
    assert seen.results_truncated
    assert seen.size == 3
    assert seen.count("succeeded") == 2


def test_an_unsealed_group_is_given_up_after_the_timeout() -> None:
    state = _open(now=0)
    assert not fan_in.expired_unsealed(state, now_ms=fan_in.SEAL_TIMEOUT_MS - 1).changed
    gone = fan_in.expired_unsealed(state, now_ms=fan_in.SEAL_TIMEOUT_MS)
    assert gone.state is None
    assert gone.refused.startswith(fan_in.NOT_SEALED)
    sealed = fan_in.sealed(state, size=2, now_ms=1).state
    assert sealed is not None
    assert fan_in.seal_due(sealed) is None
    assert not fan_in.expired_unsealed(sealed, now_ms=10**12).changed


def test_an_end_with_an_unknown_state_is_not_counted() -> None:
    state = fan_in.sealed(_open(), size=1, now_ms=1).state
    folded = fan_in.member_ended(state, MemberEnd("m", "running"), now_ms=2)
    assert not folded.changed
    assert folded.complete is None


def test_the_state_record_round_trips() -> None:
    state = GroupState(
        group_id="g1",
        then_job=THEN,
        size=2,
        ended={"m1": "succeeded"},
        results={"m1": b"[1]"},
        results_truncated=True,
        opened_ms=5,
    )
    assert decode_group_state(encode_group_state(state), SCHEMA) == state
    assert group_of(group_key("g1")) == "g1"
    assert group_of(b"j\x00k") is None


def test_a_member_address_names_group_queue_and_partition() -> None:
    raw = member_address("a@b", "billing", 7)
    assert parse_member_address(raw) == ("a@b", "billing", 7)
    with pytest.raises(Exception, match="df-group"):
        parse_member_address(b"no-partition@queue")


# ---------------------------------------------------------------------- model

_EVENT = st.one_of(
    st.tuples(
        st.just("end"),
        st.integers(0, 5),
        st.sampled_from(["succeeded", "dead", "cancelled", "expired"]),
    ),
    st.tuples(st.just("seal"), st.just(0), st.just("")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENT, max_size=40), st.integers(1, 6))
def test_any_order_of_ends_repeats_and_seals_completes_at_most_once(
    events: list[tuple[str, int, str]], size: int
) -> None:
    """Member ends in any order, repeated (redeliveries, a member redriven after the
    callback), seals anywhere: the callback is written at most once, and exactly once
    when the group is sealed and every member ended, with every member's first end."""
    state: GroupState | None = _open()
    completions: list[GroupState] = []
    first: dict[str, str] = {}
    sealed = False
    for kind, member, how in events:
        if kind == "seal":
            folded = fan_in.sealed(state, size=size, now_ms=2)
            sealed = sealed or state is not None
        else:
            job_id = f"m{member % size}"
            folded = fan_in.member_ended(state, MemberEnd(job_id, how), now_ms=2)
            if state is not None:
                first.setdefault(job_id, how)
        if folded.complete is not None:
            completions.append(folded.complete)
        if not folded.refused:
            state = folded.state
    assert len(completions) <= 1
    if sealed and len(first) == size:
        assert len(completions) == 1
        assert completions[0].ended == first
        assert json.loads(fan_in.summary_bytes(completions[0]))["size"] == size
    else:
        assert completions == []
