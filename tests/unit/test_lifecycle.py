"""The lifecycles of a partition and of a queue's runtime (dueflow.consumers.feed_states)."""

from __future__ import annotations

import itertools

import pytest

from dueflow.consumers.feed_states import (
    FeedState,
    RuntimeEvent,
    RuntimeState,
    feed_move,
    runtime_move,
)
from dueflow.consumers.feeds import PartitionFeed
from dueflow.consumers.store import MemoryKeyStore
from dueflow.errors import DueflowError, IllegalTransition

F = FeedState
R = RuntimeState
E = RuntimeEvent

FEED_ALLOWED = {
    (F.ASSIGNED, F.LOADING),  # first records read: load the keys
    (F.ASSIGNED, F.REVOKED),  # revoked before any record came
    (F.ASSIGNED, F.GONE),  # lost, or a restart
    (F.LOADING, F.LOADED),
    (F.LOADING, F.REVOKED),
    (F.LOADING, F.GONE),
    (F.LOADED, F.REVOKED),
    (F.LOADED, F.GONE),
    (F.REVOKED, F.GONE),  # grace period over
    (F.GONE, F.GONE),  # a restart forgot it while a revoke waited: forgotten again
}


@pytest.mark.parametrize(("state", "to"), sorted(FEED_ALLOWED, key=str))
def test_a_partition_moves_where_it_may(state: FeedState, to: FeedState) -> None:
    assert feed_move(state, to) is to


@pytest.mark.parametrize(
    ("state", "to"),
    sorted(set(itertools.product(F, F)) - FEED_ALLOWED, key=str),
)
def test_a_partition_refuses_every_other_move(state: FeedState, to: FeedState) -> None:
    with pytest.raises(IllegalTransition) as caught:
        feed_move(state, to)
    assert caught.value.state == state.value
    assert caught.value.to == to.value
    assert f"partition: cannot go from {state.value} by {to.value}" in str(caught.value)


def test_the_refusal_says_where_it_could_go() -> None:
    with pytest.raises(IllegalTransition, match=r"from loaded: gone, revoked$"):
        feed_move(F.LOADED, F.LOADING)  # loading the keys twice
    with pytest.raises(IllegalTransition, match=r"from gone: gone$"):
        feed_move(F.GONE, F.LOADED)  # a load that ended after the partition was lost
    assert not IllegalTransition("x", "a", "b", []).retriable
    assert isinstance(IllegalTransition("x", "a", "b", []), DueflowError)


def feed() -> PartitionFeed:
    return PartitionFeed("p.exec.default", 3, None, MemoryKeyStore(1000))


def test_a_feed_goes_through_its_life() -> None:
    f = feed()
    assert f.state is F.ASSIGNED
    assert (f.loaded, f.revoked, f.gone) == (False, False, False)
    f.advance(F.LOADING)
    assert (f.loaded, f.revoked, f.gone) == (False, False, False)
    f.advance(F.LOADED)
    assert (f.loaded, f.revoked, f.gone) == (True, False, False)
    f.advance(F.REVOKED)
    assert (f.loaded, f.revoked, f.gone) == (False, True, False)
    f.advance(F.GONE)
    assert (f.loaded, f.revoked, f.gone) == (False, True, True)
    with pytest.raises(IllegalTransition):
        f.advance(F.LOADING)
    assert f.gone  # a refused move changes nothing


def test_a_feed_cannot_skip_loading_its_keys() -> None:
    f = feed()
    with pytest.raises(IllegalTransition):
        f.advance(F.LOADED)
    assert f.state is F.ASSIGNED


RUNTIME_MOVES = [
    (R.RUNNING, E.RESTART, R.RESTARTING),
    (R.RUNNING, E.STOP, R.CLOSING),
    (R.RESTARTING, E.RESTARTED, R.RUNNING),
    (R.RESTARTING, E.STOP, R.CLOSING_RESTARTING),  # shutdown during a restart
    (R.CLOSING, E.STOP, R.CLOSING),  # stop_taking, then close
    (R.CLOSING, E.RESTART, R.CLOSING_RESTARTING),  # the last commit failed
    (R.CLOSING, E.CLOSE, R.CLOSED),
    (R.CLOSING_RESTARTING, E.STOP, R.CLOSING_RESTARTING),
    (R.CLOSING_RESTARTING, E.RESTARTED, R.CLOSING),  # the restart gave up: closing
    (R.CLOSING_RESTARTING, E.CLOSE, R.CLOSED),
    (R.CLOSED, E.RESTARTED, R.CLOSED),  # a restart under way at close ends
]


@pytest.mark.parametrize(("state", "on", "to"), RUNTIME_MOVES)
def test_the_runtime_moves(state: RuntimeState, on: RuntimeEvent, to: RuntimeState) -> None:
    assert runtime_move(state, on) is to


@pytest.mark.parametrize(
    ("state", "on"),
    sorted(set(itertools.product(R, E)) - {(s, e) for s, e, _ in RUNTIME_MOVES}, key=str),
)
def test_the_runtime_refuses_every_other_move(state: RuntimeState, on: RuntimeEvent) -> None:
    with pytest.raises(IllegalTransition, match=f"queue runtime: cannot go from {state.value}"):
        runtime_move(state, on)


@pytest.mark.parametrize(
    ("state", "restarting", "closing", "closed", "may_restart"),
    [
        (R.RUNNING, False, False, False, True),
        (R.RESTARTING, True, False, False, False),
        (R.CLOSING, False, True, False, True),
        (R.CLOSING_RESTARTING, True, True, False, False),
        (R.CLOSED, False, True, True, False),
    ],
)
def test_what_each_runtime_state_means(
    state: RuntimeState, restarting: bool, closing: bool, closed: bool, may_restart: bool
) -> None:
    assert (state.restarting, state.closing, state.closed, state.may_restart) == (
        restarting,
        closing,
        closed,
        may_restart,
    )


def test_a_restart_during_shutdown_ends_closed() -> None:
    state = R.RUNNING
    for on in (E.RESTART, E.STOP, E.RESTARTED, E.STOP, E.CLOSE):
        state = runtime_move(state, on)
    assert state is R.CLOSED
    assert not state.may_restart  # a closed runtime starts no restart
