"""The lifecycles of a worker's partition and of a queue's runtime, as explicit states
with the moves allowed between them (pure).

:class:`FeedState`, one assigned exec or retry partition
(:class:`~dueflow.consumers.feeds.PartitionFeed`)::

    ASSIGNED -> LOADING -> LOADED
       |           |         |
       +-----------+---------+--> REVOKED --> GONE
       +-----------+---------+--------------> GONE

``ASSIGNED``: no record read since the assignment (the group's offset for it
is not known to be stable yet); ``LOADING``: its first records are here and
the key store is catching up with the idempotency topic; ``LOADED``: records
are dispatched; ``REVOKED``: taken away by a rebalance, its in-flight jobs
may still finish within the grace period, nothing new is read or started;
``GONE``: forgotten (revoked, lost, or dropped by a restart); whatever still
finishes of it writes nothing. A revoked feed whose keys finish loading
stays ``REVOKED``. It replaces four booleans (``loading``, ``loaded``,
``revoked``, ``gone``) whose combinations were not all meaningful.

:class:`RuntimeState`, a queue's :class:`~dueflow.consumers.runtime.QueueRuntime`,
moved by :class:`RuntimeEvent`::

    RUNNING --restart--> RESTARTING --restarted--> RUNNING
       |                    |
      stop                 stop
       v                    v
    CLOSING --restart--> CLOSING_RESTARTING --restarted--> CLOSING
       |                    |
     close                close
       +-----> CLOSED <-----+      (a restart under way at close ends in CLOSED)

``RESTARTING``: uncommitted work forgotten, clients being made again: nothing
starts or commits, deliveries are ignored; ``CLOSING``: shutting down (step
1, :meth:`stop_taking`, or :meth:`close`): nothing new starts, fetching is
paused, finished work still commits; ``CLOSED``: the group was left (or
not), the commit loop ends. It replaces ``_closing``, ``_restarting`` and
``_closed``; shutting down while a restart is under way is a state of its
own because both then hold (the restart gives up reconnecting, and nothing
commits until it has).

Flags that stay flags, because they are not steps of either lifecycle but
conditions that come and go in any state, each set and cleared by an
event of its own (folding them in would multiply the states):

- the runtime's ``_queue_held`` (the queue's rate limit has no token until a
  timer fires), ``_operator_paused`` (``dueflow queue pause``) and
  ``_in_doubt`` (membership unconfirmed after a connection loss or a stall,
  until a commit or a rebalance proves it);
- a feed's hold reasons, ``held_until`` (head record not due), ``rate_held``
  (task rate limit) and ``checking`` (the store catching up for a redriven
  record): any of them, together, while ``LOADED``;
- a feed's ``paused`` (what the consumer was last told: back pressure, not
  correctness) and ``in_ready`` (it is in the runtime's ready queue).
"""

from __future__ import annotations

from enum import Enum

from dueflow.errors import IllegalTransition


class FeedState(Enum):
    """Where an assigned partition is in its life on this member."""

    ASSIGNED = "assigned"
    LOADING = "loading"
    LOADED = "loaded"
    REVOKED = "revoked"
    GONE = "gone"


_FEED_MOVES: dict[FeedState, frozenset[FeedState]] = {
    FeedState.ASSIGNED: frozenset({FeedState.LOADING, FeedState.REVOKED, FeedState.GONE}),
    FeedState.LOADING: frozenset({FeedState.LOADED, FeedState.REVOKED, FeedState.GONE}),
    FeedState.LOADED: frozenset({FeedState.REVOKED, FeedState.GONE}),
    # A restart can forget a feed that a revoke is still waiting for; the revoke
    # then forgets it again when its grace period ends.
    FeedState.REVOKED: frozenset({FeedState.GONE}),
    FeedState.GONE: frozenset({FeedState.GONE}),
}


def feed_move(state: FeedState, to: FeedState) -> FeedState:
    """``to``, when a partition in ``state`` may go there; else :class:`IllegalTransition`."""
    if to not in _FEED_MOVES[state]:
        raise IllegalTransition(
            "partition", state.value, to.value, (s.value for s in _FEED_MOVES[state])
        )
    return to


class RuntimeEvent(Enum):
    """What moves a queue's runtime."""

    RESTART = "restart"  # start over from the committed offsets
    RESTARTED = "restarted"  # the restart is over (reconnected, or gave up: closing)
    STOP = "stop"  # shutdown step 1: start nothing new
    CLOSE = "close"  # shutdown step 2 done: clients closing, commit loop ending


class RuntimeState(Enum):
    """Where a queue's runtime is in its life."""

    RUNNING = "running"
    RESTARTING = "restarting"
    CLOSING = "closing"
    CLOSING_RESTARTING = "closing_restarting"
    CLOSED = "closed"

    @property
    def restarting(self) -> bool:
        """A restart is under way: nothing starts or commits, deliveries are ignored."""
        return self is RuntimeState.RESTARTING or self is RuntimeState.CLOSING_RESTARTING

    @property
    def closing(self) -> bool:
        """Shutting down or shut down: nothing new starts, fetching stays paused."""
        return self is not RuntimeState.RUNNING and self is not RuntimeState.RESTARTING

    @property
    def closed(self) -> bool:
        return self is RuntimeState.CLOSED

    @property
    def may_restart(self) -> bool:
        """Whether a restart can begin (none under way, not closed)."""
        return self is RuntimeState.RUNNING or self is RuntimeState.CLOSING


_RUNTIME_MOVES: dict[tuple[RuntimeState, RuntimeEvent], RuntimeState] = {
    (RuntimeState.RUNNING, RuntimeEvent.RESTART): RuntimeState.RESTARTING,
    (RuntimeState.RUNNING, RuntimeEvent.STOP): RuntimeState.CLOSING,
    (RuntimeState.RESTARTING, RuntimeEvent.RESTARTED): RuntimeState.RUNNING,
    (RuntimeState.RESTARTING, RuntimeEvent.STOP): RuntimeState.CLOSING_RESTARTING,
    (RuntimeState.CLOSING, RuntimeEvent.STOP): RuntimeState.CLOSING,  # stop_taking, then close
    (RuntimeState.CLOSING, RuntimeEvent.RESTART): RuntimeState.CLOSING_RESTARTING,
    (RuntimeState.CLOSING, RuntimeEvent.CLOSE): RuntimeState.CLOSED,
    (RuntimeState.CLOSING_RESTARTING, RuntimeEvent.STOP): RuntimeState.CLOSING_RESTARTING,
    (RuntimeState.CLOSING_RESTARTING, RuntimeEvent.RESTARTED): RuntimeState.CLOSING,
    (RuntimeState.CLOSING_RESTARTING, RuntimeEvent.CLOSE): RuntimeState.CLOSED,
    (RuntimeState.CLOSED, RuntimeEvent.RESTARTED): RuntimeState.CLOSED,
}


def runtime_move(state: RuntimeState, event: RuntimeEvent) -> RuntimeState:
    """The state after ``event`` in ``state``; :class:`IllegalTransition` when ``event``
    cannot happen there."""
    found = _RUNTIME_MOVES.get((state, event))
    if found is None:
        allowed = (e.value for (s, e) in _RUNTIME_MOVES if s is state)
        raise IllegalTransition("queue runtime", state.value, event.value, allowed)
    return found
