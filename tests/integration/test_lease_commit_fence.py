"""What the broker checks when a group member commits offsets: the ground the
emitter's fencing stands on (docs/emitter.md, "Fencing without transactions").

The active emitter commits its timer offsets through its membership of the
lease group. Both group protocols are checked: a member SIGSTOPped until the
group dropped it, then continued, has its commit refused (the coordinator
validates the member id and its generation or epoch), so it cannot move the
new holder's offsets back. Once it has rejoined (as a member without the
lease), a commit of it is accepted again: the broker checks membership, not
which partitions the member holds. Hence the emitter ends an active period
inside the lease callback, before librdkafka rejoins.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dueflow.kafka.group_config import apply_group_configs
from tests.conftest import KafkaCluster
from tests.support.group_member import HEARTBEAT_MS, SESSION_MS, commit, member_config

REFUSED = {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "FENCED_MEMBER_EPOCH", "STALE_MEMBER_EPOCH"}


class Member:
    """The member process (tests/support/group_member.py) and its output lines."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.group_member", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        assert self.proc.stdout is not None
        out = self.proc.stdout

        def read() -> None:
            for line in out:
                self.lines.put(orjson.loads(line))

        threading.Thread(target=read, daemon=True).start()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def topics(kafka: KafkaCluster, prefix: str) -> tuple[str, str]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    lease, other = f"{prefix}.lease", f"{prefix}.timers"
    for f in admin.create_topics([NewTopic(lease, 1, 1), NewTopic(other, 1, 1)]).values():
        f.result()
    return lease, other


@pytest.mark.timeout(150)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_member_dropped_from_the_group_cannot_commit_until_it_rejoins(
    kafka: KafkaCluster, prefix: str, topics: tuple[str, str], protocol: str
) -> None:
    lease, other = topics
    group = f"{prefix}.lease-group"
    if protocol == "consumer":
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        configs = {
            "consumer.session.timeout.ms": str(SESSION_MS),
            "consumer.heartbeat.interval.ms": str(HEARTBEAT_MS),
        }
        assert apply_group_configs(admin, [group], configs) == []
    zombie = Member([kafka.bootstrap, group, lease, other, protocol])
    holder = Consumer(member_config(kafka.bootstrap, group, protocol))
    reader = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    events: list[tuple[str, list[int]]] = []

    def note(kind: str) -> Any:
        return lambda _c, tps: events.append((kind, [tp.partition for tp in tps]))

    def serve_until(what: str, done: Any, timeout_s: float = 60.0) -> Any:
        """Poll the holder (it must keep its membership) until ``done()`` is truthy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            holder.poll(0.05)
            got = done()
            if got:
                return got
        raise AssertionError(f"no {what} within {timeout_s} s")

    def line() -> Any:
        try:
            return zombie.lines.get_nowait()
        except queue.Empty:
            return None

    def committed() -> int:
        return int(reader.committed([TopicPartition(other, 0)], timeout=10)[0].offset)

    try:
        assert serve_until("ready line", line) == {"ready": "ok"}
        os.kill(zombie.proc.pid, signal.SIGSTOP)
        holder.subscribe([lease], on_assign=note("assign"), on_lost=note("lost"))
        serve_until("assignment", lambda: ("assign", [0]) in events)
        assert commit(holder, other, 100) == "ok"
        os.kill(zombie.proc.pid, signal.SIGCONT)
        zombie.send("5")  # committed before the zombie hears from the group
        first = serve_until("zombie's answer", line)
        assert first["commit"] in REFUSED, first
        assert committed() == 100
        assert ["lost", [0]] in first["events"]  # ... and it learns it lost the lease
        # Rejoined (holding nothing), it is a member again: its commits count.
        for _ in range(10):
            zombie.send("6")
            again = serve_until("zombie's answer", line)
            if again["commit"] == "ok":
                break
        assert again["commit"] == "ok", again
        assert committed() == 6
        # The holder kept the lease all along (a cooperative rebalance assigns it
        # nothing more: an empty assignment).
        assert [e for e in events if e[1]] == [("assign", [0])]
    finally:
        zombie.stop()
        holder.close()
        reader.close()
