"""How a worker process restarts itself (max_memory, a blocked event loop).

- Under the supervisor (``dueflow worker --processes N``) a child exits with
  :data:`RESTART_EXIT_CODE`; the supervisor starts a fresh child at once
  (a restart is not a death: it never counts towards giving up).
- A ``dueflow worker`` of one process has no supervisor: it restarts in place,
  ``execv`` of the same command line (same pid, same environment, fresh
  interpreter). The new image counts the restart
  (``dueflow_worker_restarts_total``): the old one's counters are gone with it.
- :func:`~dueflow.consumers.worker_process.run_worker` called by an application
  returns (or, from a blocked loop, exits with) :data:`RESTART_EXIT_CODE`:
  whatever runs it restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

from dueflow.observability.logs import event

RESTART_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"
# Set for the new image of a process that restarted in place: why it did.
RESTARTED_ENV = "DUEFLOW_RESTARTED_FOR"  # not a setting: no section prefix
_LOG = logging.getLogger("dueflow.worker")


class ProcessRestart:
    """Restarts this process; callable from any thread, the event loop's included."""

    def __init__(self, *, in_place: bool) -> None:
        self.in_place = in_place

    @property
    def counted_by_successor(self) -> bool:
        """Whether the restarted process counts this restart (not this one)."""
        return self.in_place

    def __call__(self, reason: str) -> NoReturn:
        flush_logs()
        if self.in_place:
            os.environ[RESTARTED_ENV] = reason
            argv = [sys.executable, *sys.orig_argv[1:]]
            try:
                os.execv(sys.executable, argv)
            except OSError as exc:  # cannot exec: exit, for whatever supervises us
                os.environ.pop(RESTARTED_ENV, None)
                event(_LOG, "restart in place failed: exiting", logging.ERROR, error=str(exc))
                flush_logs()
        os._exit(RESTART_EXIT_CODE)


def flush_logs() -> None:
    """Flush every log handler (before an exit that skips the interpreter's teardown)."""
    for handler in [*logging.getLogger().handlers, *logging.getLogger("dueflow").handlers]:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
