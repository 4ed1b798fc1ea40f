"""Where a queue's runtime is in its life, shared by its collaborators.

The states and their moves are :mod:`dueflow.consumers.feed_states`'s; this holds
the current one, so that the runtime's parts (intake, dispatch, commits,
rebalances) read the same state without asking the runtime.
"""

from __future__ import annotations

from dueflow.consumers.feed_states import RuntimeEvent, RuntimeState, runtime_move


class RunState:
    """The current :class:`RuntimeState` of one queue's runtime."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = RuntimeState.RUNNING

    def move(self, on: RuntimeEvent) -> None:
        """Move on ``on``; :class:`~dueflow.errors.IllegalTransition` when it cannot."""
        self.now = runtime_move(self.now, on)

    @property
    def running(self) -> bool:
        return self.now is RuntimeState.RUNNING

    @property
    def restarting(self) -> bool:
        return self.now.restarting

    @property
    def closing(self) -> bool:
        return self.now.closing

    @property
    def closed(self) -> bool:
        return self.now.closed

    def begin_restart(self) -> bool:
        """Enter a restart (nothing starts or commits meanwhile); False when one is
        under way already or the runtime is closed."""
        if not self.now.may_restart:
            return False
        self.move(RuntimeEvent.RESTART)
        return True
