"""Consumer group members, asked from a child process that may die.

``AdminClient.describe_consumer_groups`` aborts the whole process (librdkafka
2.x: ``rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0``,
confluentinc/librdkafka#4605) when a request times out, which is what a
paused or killed group coordinator makes it do. The chaos driver asks who
holds the emitter lease and who is in the worker group while it kills and
pauses nodes, so it asks through :class:`GroupProbe`: one long-lived child
(``python -m tests.chaos.group_probe BOOTSTRAP``) reading group ids on stdin
and writing one JSON line per answer. A child that aborted or does not answer
in time is killed by pid; that question gets None and the next one a new
child.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    assignment: tuple[tuple[str, int], ...]  # (topic, partition)


class GroupProbe:
    """Asks a child process for the members of a group (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        """``command``: the child to run (default this module's :func:`main`)."""
        self.bootstrap = bootstrap
        self.cwd = cwd
        self.env = env
        self.command = list(command or [sys.executable, "-m", "tests.chaos.group_probe", bootstrap])
        self.restarts = 0  # children that died or hung
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def members(self, group: str, *, timeout_s: float = 12.0) -> list[Member] | None:
        """The members of ``group`` now; None when the cluster (or the child) did not say."""
        proc = self._child()
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
            Member(m["client_id"], tuple((t, int(p)) for t, p in m["assignment"]))
            for m in answer["members"]
        ]

    def close(self) -> None:
        """Stop the child (by pid)."""
        self._discard()

    # ----------------------------------------------------------------- child
    def _child(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self._discard()
            self._proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # the abort message; its death is what counts
                start_new_session=True,
            )
            self._buffer = b""
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


def main(argv: list[str] | None = None) -> int:
    """The child: one group id per line in, one JSON answer per line out."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    args = sys.argv[1:] if argv is None else argv
    admin = AdminClient({"bootstrap.servers": args[0], "log_level": 0})
    for raw in sys.stdin:
        group = raw.strip()
        try:
            desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
            members = [
                {
                    "client_id": m.client_id,
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
