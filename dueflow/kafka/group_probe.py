"""Consumer group members, asked from a child process that may die.

``AdminClient.describe_consumer_groups`` aborts the whole process (librdkafka
2.x: ``rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0``,
confluentinc/librdkafka#4605) when a request fails at the wrong moment, which
a broker that restarts or pauses makes it do. So a process that asks while
brokers may come and go (a worker's assignment check, the chaos driver) asks
through :class:`GroupProbe`: one long-lived child (``python -m
dueflow.kafka.group_probe``) that reads the client's configuration (one JSON
line) and then group ids on stdin, and writes one JSON line per answer. A
child that aborted or does not answer in time is killed by pid; that question
gets None and the next one a new child. A child whose parent died sees its
stdin end and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    assignment: tuple[tuple[str, int], ...]  # (topic, partition)
    member_id: str = ""


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` a child can be given as JSON (no callbacks)."""
    return {k: v for k, v in config.items() if isinstance(v, str | int | float | bool)}


class GroupProbe:
    """Asks a child process for the members of a group (see the module docstring)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        log_to: int | None = subprocess.DEVNULL,
    ) -> None:
        """``config``: the client's settings (bootstrap, security); ``command``: the
        child to run (default this module's :func:`main`); ``log_to``: where the
        child's stderr goes (the abort message; its death is what counts)."""
        self.config = plain_config(config)
        self.cwd = cwd
        self.env = env
        self.command = list(command or [sys.executable, "-m", "dueflow.kafka.group_probe"])
        self.log_to = log_to
        self.restarts = 0  # children that died or hung
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._lock = threading.Lock()  # one question at a time, from any thread

    def members(self, group: str, *, timeout_s: float = 12.0) -> list[Member] | None:
        """The members of ``group`` now; None when the cluster (or the child) did not say."""
        with self._lock:
            return self._members(group, timeout_s)

    def _members(self, group: str, timeout_s: float) -> list[Member] | None:
        proc = self._child()
        if proc is None:
            return None
        assert proc.stdin is not None
        try:
            proc.stdin.write(group.encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            self._discard()
            return None
        line = self._read_line(proc, timeout_s)
        if line is None:
            self._discard()
            return None
        answer = json.loads(line)
        if not answer.get("ok"):
            return None
        return [
            Member(
                m["client_id"],
                tuple((t, int(p)) for t, p in m["assignment"]),
                m.get("member_id", ""),
            )
            for m in answer["members"]
        ]

    def close(self) -> None:
        """Stop the child (by pid)."""
        with self._lock:
            self._discard()

    # ----------------------------------------------------------------- child
    def _child(self) -> subprocess.Popen[bytes] | None:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self._discard()
            proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log_to,
                start_new_session=True,
            )
            self._proc = proc
            self._buffer = b""
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(self.config).encode() + b"\n")
                proc.stdin.flush()
            except OSError:
                self._discard()
                return None
        return self._proc

    def _read_line(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # EOF: the child died (aborted)
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self.restarts += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        elif proc.returncode != 0:
            self.restarts += 1
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        proc.wait(10)


def main() -> int:
    """The child: the client's configuration (one JSON line), then one group id per
    line in, one JSON answer per line out."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    first = sys.stdin.readline()
    if not first:
        return 0
    admin = AdminClient({**json.loads(first), "log_level": 0})
    for raw in sys.stdin:
        group = raw.strip()
        try:
            desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
            members = [
                {
                    "client_id": m.client_id,
                    "member_id": m.member_id,
                    "assignment": [
                        [tp.topic, tp.partition]
                        for tp in (m.assignment.topic_partitions if m.assignment else [])
                    ],
                }
                for m in desc.members
            ]
            answer: dict[str, object] = {"ok": True, "members": members}
        except (KafkaException, TimeoutError) as exc:
            answer = {"ok": False, "error": str(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
