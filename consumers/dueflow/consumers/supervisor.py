"""``dueflow worker --processes N``: N worker processes in the same groups.

Each child is a spawned process (it builds its own Kafka clients; nothing
is shared across a fork) that imports the app modules, builds its registry
and runs a :class:`~dueflow.consumers.worker_process.Worker`. Children run in their
own process group, so a terminal's Ctrl-C reaches only the parent, which
forwards SIGTERM/SIGINT once per signal it gets: the first starts a
graceful shutdown in every child, a second one makes them exit at once.
A child that dies while the parent is not stopping is restarted (at most
once per second); its partitions are rebalanced meanwhile. A child that
exits with :data:`~dueflow.consumers.restart.RESTART_EXIT_CODE` asked for it
(``worker.max_memory``, a blocked event loop): it is started again the same
way, and such restarts never count towards giving up.

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
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from types import FrameType

from dueflow.config import Settings
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.restart import RESTART_EXIT_CODE
from dueflow.errors import WorkerStartupFailed
from dueflow.observability import logs
from dueflow.observability.health import Health
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
    # imported here: the supervising parent does not load the worker runtime (about 150 ms)
    from dueflow.consumers.worker_process import run_worker

    registry = TaskRegistry.from_modules(app)
    event(_LOG, "worker process starting", index=index, pid=os.getpid())
    try:
        code = run_worker(settings, registry, queues=queues)
    except WorkerStartupFailed:
        code = 5  # logged by the worker ("worker startup failed"); no traceback here
    sys.exit(code)


def early_deaths_after(exitcode: int, *, lived_s: float, before: int) -> int:
    """Children that died soon after they started, in a row, once one exited with
    ``exitcode`` after ``lived_s`` (``_EARLY_DEATHS`` of them: give up). A child that
    asked to be restarted (:data:`RESTART_EXIT_CODE`) is not a death: it leaves the
    count as it was."""
    if exitcode == RESTART_EXIT_CODE:
        return before
    return before + 1 if lived_s < _EARLY_DEATH_S else 0


class Supervisor:
    """Starts, watches and stops the worker children."""

    def __init__(
        self,
        settings: Settings,
        *,
        app: Sequence[str],
        queues: Sequence[str] | None,
        processes: int,
        health: Health | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        # This process's own loop (/livez); the children publish theirs as gauges.
        self._health = health or Health(
            liveness_timeout_s=settings.observability.liveness_timeout_s
        )
        self._on_turn = on_turn  # e.g. publish the merged health as the parent's gauges
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
        self._health.stopping()
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
                self._health.beat()
                if self._on_turn is not None:
                    self._turn_hook()
                for index, child in list(self._children.items()):
                    child.join(timeout=0.2)
                    if child.exitcode is None:
                        continue
                    del self._children[index]
                    if child.pid is not None:
                        process_exited(child.pid)
                    if self._signals:
                        failed = failed or child.exitcode not in (0, RESTART_EXIT_CODE)
                        continue
                    asked = child.exitcode == RESTART_EXIT_CODE
                    self._early_deaths = early_deaths_after(
                        child.exitcode,
                        lived_s=time.monotonic() - self._started[index],
                        before=self._early_deaths,
                    )
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
                        "worker process asked to restart; restarting it"
                        if asked
                        else "worker process died; restarting it",
                        logging.INFO if asked else logging.WARNING,
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
        except BaseException:
            self._stop_children()
            raise
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _turn_hook(self) -> None:
        """The caller's per-turn hook (it publishes health); a failure is logged, never
        allowed to end the parent and leave its children running unsupervised."""
        assert self._on_turn is not None
        try:
            self._on_turn()
        except Exception as exc:
            event(_LOG, "supervisor turn hook failed", logging.WARNING, error=repr(exc))

    def _stop_children(self) -> None:
        """The parent is failing: stop every child as for SIGTERM and wait for them."""
        if not self._signals:
            self._on_signal(signal.SIGTERM, None)
        deadline = time.monotonic() + self._settings.worker.shutdown_grace_s + 10
        for child in self._children.values():
            child.join(timeout=max(0.0, deadline - time.monotonic()))
            if child.exitcode is None:
                child.kill()
                child.join(timeout=10)
