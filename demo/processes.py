"""The demo's child processes: started in their own process groups, stopped by pid.

Every child (``python -m dueflow emitter``, ``worker``, ``status-view``) is
started with ``start_new_session`` (its pid is its process group id) and,
on Linux, with a parent-death signal, so it gets SIGTERM even when the demo
itself is killed with -9. :meth:`Child.stop` sends SIGTERM to the child's
pid (a worker supervisor forwards it to its own children), waits, and
SIGKILLs the group the child leads only if the child is still alive then.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the demo process goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One child process of the demo, logging to a file."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    port: int | None = None  # the HTTP port it serves (metrics, or the status page)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dueflow", *self.argv],
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this pid only (the crash the demo shows)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait ``timeout_s``, then SIGKILL its process group; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                # Still alive, so the group it leads is ours: end all of it
                # (a worker supervisor's children too).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def scrape(port: int, timeout_s: float = 2.0) -> dict[str, float] | None:
    """Sum of every sample per metric name on ``/metrics``; ``None`` when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status) == 200
    except OSError:
        return False


def wait_for(
    what: str, predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1
) -> None:
    """Poll ``predicate()`` until true; raise naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
