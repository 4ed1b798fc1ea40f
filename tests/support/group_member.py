"""A consumer-group member in a process of its own, for tests that SIGSTOP it.

``python -m tests.support.group_member BOOTSTRAP GROUP LEASE_TOPIC OTHER_TOPIC
PROTOCOL`` joins GROUP subscribed to LEASE_TOPIC and, once it holds a
partition, commits offset 10 of partition 0 of OTHER_TOPIC (a topic it does
not consume, as the emitter commits its timer offsets through its lease
membership) and prints one JSON line. Then, for every line read on stdin (an
offset), it commits that offset at once, *without* serving the group first
(a process resumed after SIGCONT acts before its heartbeat thread learns
anything), prints the result, serves the group for 3 s and prints the
callbacks seen so far. EOF on stdin: leave the group and exit.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

SESSION_MS = 3_000
HEARTBEAT_MS = 500


def member_config(bootstrap: str, group: str, protocol: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "group.protocol": protocol,
    }
    if protocol == "classic":  # the consumer protocol's session is a group config
        conf.update(
            {
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
            }
        )
    return conf


def commit(consumer: Consumer, topic: str, offset: int) -> str:
    """The commit's outcome: ok, or the error's name."""
    try:
        got = consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    except KafkaException as exc:
        return str(exc.args[0].name())
    errors = [str(tp.error) for tp in got or [] if tp.error is not None]
    return errors[0] if errors else "ok"


def main(argv: list[str]) -> None:
    bootstrap, group, lease, other, protocol = argv
    events: list[list[Any]] = []
    consumer = Consumer(member_config(bootstrap, group, protocol))

    def note(kind: str) -> Any:
        return lambda _c, tps: events.append([kind, [tp.partition for tp in tps]])

    consumer.subscribe(
        [lease], on_assign=note("assign"), on_revoke=note("revoke"), on_lost=note("lost")
    )
    deadline = time.monotonic() + 60
    while not any(kind == "assign" and parts for kind, parts in events):
        if time.monotonic() > deadline:
            raise SystemExit("no assignment within 60 s")
        consumer.poll(0.1)
    print(orjson.dumps({"ready": commit(consumer, other, 10)}).decode(), flush=True)
    for line in sys.stdin:
        result = commit(consumer, other, int(line))
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            consumer.poll(0.1)
        print(orjson.dumps({"commit": result, "events": events}).decode(), flush=True)
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
