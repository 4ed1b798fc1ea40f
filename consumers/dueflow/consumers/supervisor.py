"""``dueflow worker --processes N``: N worker processes in the same groups.

Each child is a spawned process (it builds its own Kafka clients; nothing
is shared across a fork) that imports the app modules, builds its registry
and runs a :class:`~dueflow.consumers.worker.Worker`. Children run in their
own process group, so a terminal's Ctrl-C reaches only the parent, which
forwards SIGTERM/SIGINT once per signal it gets: the first starts a
graceful shutdown in every child, a second one makes them exit at once.
A child that dies while the parent is not stopping is restarted (at most
once per second); its partitions are rebalanced meanwhile.

Metrics: the CLI calls :func:`dueflow.observability.metrics.enable_multiprocess` before the
children start; each child writes its samples there, the parent serves the
merged view and drops a dead child's live gauges.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from types import FrameType

from dueflow.config import Settings
from dueflow.observability import logs
from dueflow.observability.logs import event
from dueflow.observability.metrics import process_exited

_LOG = logging.getLogger("dueflow.worker")
_RESTART_INTERVAL_S = 1.0
# A child that dies this soon after it started, this many times in a row, is
# not worth restarting again (a broken app module, bad settings): give up.
_EARLY_DEATH_S = 10.0
_EARLY_DEATHS = 3


def child_main(
    settings: Settings, app: Sequence[str], queues: Sequence[str] | None, index: int
) -> None:
    """Entry point of a worker child process."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # Ctrl-C in the terminal goes to the parent only
    obs = settings.observability
    logs.configure(obs.log_format, obs.log_level)
    from dueflow.consumers.registry import TaskRegistry
    from dueflow.consumers.worker import run_worker
    from dueflow.errors import WorkerStartupFailed

    registry = TaskRegistry.from_modules(app)
    event(_LOG, "worker process starting", index=index, pid=os.getpid())
    try:
        code = run_worker(settings, registry, queues=queues)
    except WorkerStartupFailed:
        code = 5  # logged by the worker ("worker startup failed"); no traceback here
    sys.exit(code)


class Supervisor:
    """Starts, watches and stops the worker children."""

    def __init__(
        self,
        settings: Settings,
        *,
        app: Sequence[str],
        queues: Sequence[str] | None,
        processes: int,
    ) -> None:
        self._settings = settings
        self._app = list(app)
        self._queues = list(queues) if queues else None
        self._count = processes
        self._ctx = multiprocessing.get_context("spawn")
        self._children: dict[int, BaseProcess] = {}
        self._signals = 0
        self._restarts: dict[int, float] = {}
        self._started: dict[int, float] = {}
        self._early_deaths = 0

    def _start(self, index: int) -> None:
        child = self._ctx.Process(
            target=child_main,
            args=(self._settings, self._app, self._queues, index),
            name=f"dueflow-worker-{index}",
        )
        child.start()
        self._children[index] = child
        self._started[index] = time.monotonic()
        event(_LOG, "worker process started", index=index, pid=child.pid)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        for child in self._children.values():
            if child.is_alive() and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    def run(self) -> int:
        """Run until every child has exited after a signal; return the exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for index in range(self._count):
                self._start(index)
            failed = False
            while self._children:
                for index, child in list(self._children.items()):
                    child.join(timeout=0.2)
                    if child.exitcode is None:
                        continue
                    del self._children[index]
                    if child.pid is not None:
                        process_exited(child.pid)
                    if self._signals:
                        failed = failed or child.exitcode != 0
                        continue
                    early = time.monotonic() - self._started[index] < _EARLY_DEATH_S
                    self._early_deaths = self._early_deaths + 1 if early else 0
                    if self._early_deaths >= _EARLY_DEATHS:
                        event(
                            _LOG,
                            "worker processes keep dying at start; giving up",
                            logging.ERROR,
                            exitcode=child.exitcode,
                        )
                        self._on_signal(signal.SIGTERM, None)
                        failed = True
                        continue
                    event(
                        _LOG,
                        "worker process died; restarting it",
                        logging.WARNING,
                        index=index,
                        exitcode=child.exitcode,
                    )
                    wait = self._restarts.get(index, 0.0) + _RESTART_INTERVAL_S - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    self._restarts[index] = time.monotonic()
                    if not self._signals:
                        self._start(index)
            return 1 if failed else 0
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
