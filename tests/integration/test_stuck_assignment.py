"""A worker whose consumer never heard of partitions the group gave it rejoins.

The recipe that makes librdkafka (2.16) miss a KIP-848 assignment for good: of two
workers, one is killed -9 and a replacement starts at once; as soon as the group
lists the newcomer (the dead member still in it, so the survivor must give a
partition up) the broker is paused for longer than a heartbeat request's timeout.
Without the assignment check, the survivor's partitions that moved start nothing
until the coordinator fences it at the rebalance timeout (minutes). With it, every
partition's job runs within seconds of the broker's return. (The recipe leaves a
member stuck in about two runs of five; the test passes every time only with the check.)

A broker of its own: the test pauses it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.group_probe import GroupProbe
from dueflow.kafka.topics import names
from tests.conftest import KafkaCluster
from tests.integration.test_worker_processes import QUEUE, Processes, wait_members
from tests.integration.worker_support import wait_for

PARTITIONS = 6
PAUSE_S = 4.0  # longer than a heartbeat request's timeout (about 3 s), shorter than
SESSION_MS = 6_000  # the members' sessions
# From SIGCONT: the dead member's session ends (6 s after its last heartbeat), the
# group settles, a stuck member is found (10 s) and rejoins; minutes without the check.
RUN_WITHIN_S = 45.0


@pytest.fixture
def own(tmp_path: Path) -> Iterator[tuple[LocalBroker, Processes]]:
    broker = LocalBroker(port=free_port_pair(), state_dir=tmp_path / "broker", heap="384m")
    broker.start()
    procs = Processes(KafkaCluster(broker.bootstrap, broker), "stuck", tmp_path)
    try:
        yield broker, procs
    finally:
        procs.stop_all()
        pid = broker.running_pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        broker.stop()


@pytest.mark.timeout(300)
def test_every_partition_runs_soon_after_a_broker_pause_during_a_rebalance(
    own: tuple[LocalBroker, Processes],
) -> None:
    broker, procs = own
    settings = procs.configure(
        partitions=PARTITIONS,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=2_000,
        assignment_check_s=2.0,
    )
    group = names(settings).worker_group(QUEUE)
    victim = procs.start()
    procs.start()
    wait_members(settings, 2)

    probe = GroupProbe(
        {"bootstrap.servers": broker.bootstrap}
    )  # a child: it may abort, not the test
    try:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        procs.start()
        wait_for(
            "the newcomer in the group, the dead member still in it",
            lambda: len(probe.members(group, timeout_s=3.0) or []) >= 3,
            30,
        )
    finally:
        probe.close()
    pid = broker.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(PAUSE_S)
    os.kill(pid, signal.SIGCONT)
    back = time.time()

    writer = ExecWriter(settings)
    for p in range(PARTITIONS):
        writer.write([make_job("ledger-effect", {}, queue=QUEUE, key=f"after-{p}")], partition=p)
    writer.flush()

    def ran() -> set[str]:
        return {key for key, _attempt, _at, _pid in procs.ledger.runs()}

    wanted = {f"after-{p}" for p in range(PARTITIONS)}
    wait_for(
        f"a job of every partition run within {RUN_WITHIN_S:.0f} s of SIGCONT",
        lambda: wanted <= ran(),
        RUN_WITHIN_S,
    )
    starts = {key: at for key, _a, at, _pid in procs.ledger.runs() if key in wanted}
    assert max(starts.values()) - back < RUN_WITHIN_S, (starts, procs.logs()[-4000:])
    # every job once (a rejoin commits what finished before it gives partitions up)
    assert sorted(key for key, *_ in procs.ledger.runs()) == sorted(wanted)
