"""The worker supervisor: a failing turn hook neither ends it nor orphans its children."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

from dueflow.config import Settings
from dueflow.consumers.supervisor import Supervisor

_FORK = multiprocessing.get_context("fork")


def _child(ready: Any) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    ready.set()
    time.sleep(60)


class _Sleepers(Supervisor):
    """A supervisor whose children wait for SIGTERM instead of running a worker."""

    def _start(self, index: int) -> None:
        ready = _FORK.Event()
        child = _FORK.Process(target=_child, args=(ready,), name=f"sleeper-{index}")
        child.start()
        # Forked, it holds the parent's handlers until it has set its own.
        assert ready.wait(30)
        self._children[index] = child
        self._started[index] = time.monotonic()
        self.pids.append(child.pid or -1)

    pids: list[int]


def _supervisor(on_turn: object) -> _Sleepers:
    sup = _Sleepers(Settings(), app=[], queues=None, processes=2, on_turn=on_turn)  # type: ignore[arg-type]
    sup.pids = []
    return sup


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_hook_that_fails_is_logged_and_the_supervisor_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    turns: list[float] = []

    def hook() -> None:
        turns.append(time.monotonic())
        if len(turns) == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the operator stops it
        raise ValueError("a sample file read half-written")

    sup = _supervisor(hook)
    with caplog.at_level(logging.WARNING):
        code = sup.run()
    assert code == 0
    assert len(turns) >= 5  # it kept turning after the first failure
    assert sum("supervisor turn hook failed" in r.getMessage() for r in caplog.records) >= 5
    assert not any(_alive(pid) for pid in sup.pids)


def test_a_supervisor_failing_stops_its_children_before_it_raises() -> None:
    def hook() -> None:
        raise SystemExit(3)  # past the hook's guard: the parent itself fails

    sup = _supervisor(hook)
    with pytest.raises(SystemExit):
        sup.run()
    assert len(sup.pids) == 2
    assert not any(_alive(pid) for pid in sup.pids)
