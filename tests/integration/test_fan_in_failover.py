"""Fan-in through failures, with real processes: a group of 200 members over two queues,
some failing for good (dead), some cancelled by command before they run, while worker
processes (the members' workers and the group's owner alike) and emitters are killed
with -9 at random times and started again.

What must hold, from what Kafka committed and the callback's own ledger:

- the callback's timer was written exactly once (its one committed ``scheduled``
  outcome comes from the owner's transaction that completed the group), and the
  callback has exactly one committed ``succeeded`` outcome;
- every run of the callback's handler saw all 200 members, each with the state its
  committed outcomes say: ``dead`` for the failing ones, ``cancelled`` for the
  cancelled ones, ``succeeded`` for the rest;
- the group's state is removed from the steering topic once it completed.

(A handler may run twice when its worker is killed between the run and the commit:
effectively once, one committed outcome.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dueflow.config import load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.producers import AsyncScheduler, Scheduler
from dueflow.producers.fan_in_commands import GroupScheduled
from dueflow.records.group_state import group_key
from tests.conftest import KafkaCluster
from tests.integration.fan_in_app import DOCS, PHOTOS, ledger
from tests.integration.pipeline_support import CONFIG, QUEUE, Pipeline, Proc
from tests.integration.steering_support import finalize_when_workers_joined
from tests.integration.worker_support import outcomes_of, read_topic, wait_for

APP = "tests.integration.fan_in_app"
MEMBERS = 200
QUEUES = f"""
[[queues]]
name = "{PHOTOS}"
partitions = 3
retry_tiers_ms = [200, 500]

[[queues]]
name = "{DOCS}"
partitions = 2
retry_tiers_ms = [200, 500]
"""
_OLD_QUEUE = f"""
[[queues]]
name = "{QUEUE}"
partitions = 3
retry_tiers_ms = [200, 500]
"""


@dataclass
class FanInPipeline(Pipeline):
    """The pipeline of pipeline_support with the two queues of this test."""

    workers: dict[str, Proc] = field(default_factory=dict)
    emitters: dict[str, Proc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert _OLD_QUEUE in CONFIG
        self.config = self.tmp / "dueflow.toml"
        self.config.write_text(CONFIG.replace(_OLD_QUEUE, QUEUES))
        self.settings = load_settings(config_file=self.config, env=self._dueflow_env())
        report = TopicAdmin(make_admin(self.settings), replication_factor=1).ensure(
            topic_layout(self.settings)
        )
        assert report.ok, report.differences

    def worker_proc(self, name: str) -> Proc:
        proc = self.start(
            name,
            "worker",
            "--app",
            APP,
            "--queues",
            f"{PHOTOS},{DOCS}",
            env={"FAN_IN_LEDGER": str(self.tmp / "callbacks.db")},
        )
        self.workers[name] = proc
        return proc

    def emitter_proc(self, name: str) -> Proc:
        proc = self.start(name, "emitter")
        self.emitters[name] = proc
        return proc


@contextlib.contextmanager
def pipeline(kafka: KafkaCluster, prefix: str, tmp: Path) -> Iterator[FanInPipeline]:
    pipe = FanInPipeline(kafka.bootstrap, prefix, tmp)
    try:
        yield pipe
    except BaseException:
        print(pipe.logs())
        raise
    finally:
        pipe.stop_all()


def _outcomes(pipe: FanInPipeline) -> list[dict[str, object]]:
    return outcomes_of(read_topic(pipe.settings, names(pipe.settings).outcomes))


@pytest.mark.timeout(600)
def test_the_callback_runs_once_with_200_states_through_kill_9(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(26)
    with pipeline(kafka, prefix, tmp_path) as pipe:
        for n in range(2):  # an active one and a hot standby
            pipe.emitter_proc(f"emitter-{n}")
        for n in range(3):
            pipe.worker_proc(f"worker-{n}")
        for queue in (PHOTOS, DOCS):
            finalize_when_workers_joined(pipe.settings, queue, workers=3)
        members: list[dict[str, object]] = []
        for i in range(MEMBERS):
            payload = {"i": i, "fail": i % 10 == 3, "sleep_ms": rng.choice([0, 0, 50, 300])}
            photo = i % 5 < 3
            member: dict[str, object] = {
                "task": "photo" if photo else "doc",
                "queue": PHOTOS if photo else DOCS,
                "payload": payload,
            }
            if i % 13 == 0:
                member["delay"] = "40s"  # cancelled before it is due
            members.append(member)
        with Scheduler(pipe.settings) as s:
            group = s.group(
                members, then={"task": "album-done", "queue": PHOTOS, "payload": {"album": 1}}
            )
            ids = list(group.member_ids)
            failing = {ids[i] for i in range(MEMBERS) if i % 10 == 3}
            to_cancel = [ids[i] for i in range(MEMBERS) if i % 13 == 0]
            cancelled = set()
            for job_id in to_cancel:
                # Acknowledged is enough: the callback's states say it was applied.
                assert s.cancel(job_id).cancelled
                cancelled.add(job_id)
        assert len(cancelled) == 16
        failing -= cancelled

        # Kill -9 a random worker every 2-4 s (the owner among them) or, one time in
        # four, an emitter (the active one half the time); start it again.
        stop = threading.Event()
        kills = [0]
        emitter_kills = [0]

        def faults() -> None:
            while not stop.is_set():
                stop.wait(rng.uniform(2.0, 4.0))  # the fault schedule, not a synchronization
                if stop.is_set():
                    return
                emitter = rng.random() < 0.25
                procs = pipe.emitters if emitter else pipe.workers
                name = rng.choice(sorted(procs))
                victim = procs[name]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim.pid, signal.SIGKILL)
                victim.popen.wait(10)
                if emitter:
                    emitter_kills[0] += 1
                    pipe.emitter_proc(name)
                else:
                    kills[0] += 1
                    pipe.worker_proc(name)

        killer = threading.Thread(target=faults, name="kill-9", daemon=True)
        killer.start()
        try:

            def callback_succeeded() -> bool:
                return any(
                    o["job_id"] == group.then_job_id and o["state"] == "succeeded"
                    for o in _outcomes(pipe)
                )

            wait_for("the callback's succeeded outcome", callback_succeeded, 300)
            # Faults go on for a while after it: late member ends must not run it again.
            wait_for("at least 8 worker kills", lambda: kills[0] >= 8, 120)
        finally:
            stop.set()
            killer.join(30)
        assert kills[0] >= 8

        # Every member ended and its end reached the owner long ago; give late
        # notices (members run again after a kill) the time to arrive and be ignored.
        wait_for(
            "every member's final outcome",
            lambda: _finals(_outcomes(pipe), ids) == len(ids),
            120,
        )
        time.sleep(3)  # a notice is due 0.4 s after its member's end: let stragglers land
        outcomes = _outcomes(pipe)
        callback = Counter(str(o["state"]) for o in outcomes if o["job_id"] == group.then_job_id)
        assert callback["scheduled"] == 1, callback
        assert callback["succeeded"] == 1, callback
        expected = {
            j: "cancelled" if j in cancelled else "dead" if j in failing else "succeeded"
            for j in ids
        }
        with ledger(tmp_path / "callbacks.db") as db:
            runs = db.execute("SELECT job, states FROM callbacks").fetchall()
        assert runs
        for job, states in runs:
            assert job == group.then_job_id
            assert json.loads(states) == expected
        state_topic = read_topic(pipe.settings, names(pipe.settings).steering(PHOTOS))
        last = {r.key: r.value for r in state_topic}
        assert group_key(group.group_id) in last
        assert last[group_key(group.group_id)] is None  # removed with the callback
        print(
            f"worker kills={kills[0]} emitter kills={emitter_kills[0]} callback runs={len(runs)} "
            f"dead={len(failing)} cancelled={len(cancelled)}"
        )


@pytest.mark.timeout(240)
def test_async_scheduler_group(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> None:
    """``await AsyncScheduler.group``: the callback runs with its members' states."""
    with pipeline(kafka, prefix, tmp_path) as pipe:
        pipe.emitter_proc("emitter")
        pipe.worker_proc("worker")
        for queue in (PHOTOS, DOCS):
            finalize_when_workers_joined(pipe.settings, queue)

        async def main() -> GroupScheduled:
            async with AsyncScheduler(pipe.settings) as s:
                return await s.group(
                    [
                        {"task": "photo", "queue": PHOTOS, "payload": {"i": 1}},
                        {"task": "doc", "queue": DOCS, "payload": {"i": 2, "fail": True}},
                    ],
                    then={"task": "album-done", "queue": PHOTOS, "payload": {}},
                    group_id="album-async",
                )

        group = asyncio.run(main())
        assert group.group_id == "album-async"

        def ran() -> list[tuple[str, str]]:
            with ledger(tmp_path / "callbacks.db") as db:
                return list(db.execute("SELECT job, states FROM callbacks").fetchall())

        wait_for("the callback's run", lambda: bool(ran()), 120)
        ((job, states),) = ran()
        assert job == group.then_job_id
        first, second = group.member_ids
        assert json.loads(states) == {first: "succeeded", second: "dead"}


def _finals(outcomes: list[dict[str, object]], ids: list[str]) -> int:
    wanted = set(ids)
    ended = {
        str(o["job_id"])
        for o in outcomes
        if o["job_id"] in wanted and o["state"] in ("succeeded", "dead", "cancelled")
    }
    return len(ended)
