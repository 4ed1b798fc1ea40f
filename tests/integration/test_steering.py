"""Steering jobs at any horizon on the real broker: cancel, move and update by command.

Each test runs real workers (threads or processes) on its own topics; the jobs'
timers are fired into the exec topic the way the emitter fires them
(``steering_support.fire``), so a job due in 2126 can be delivered now.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.clients import make_producer
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.producers import Scheduler
from dueflow.producers.results import Cancelled, Rescheduled, Updated
from dueflow.producers.steering_commands import command_records
from dueflow.records.job_request import JobRequest, encode_payload
from dueflow.records.steering_state import SCHEMA as STATE_SCHEMA
from dueflow.records.steering_state import encode_entry, topic_key
from dueflow.rules import steering as steering_rule
from dueflow.rules.partitioning import partition_for_key
from dueflow.steering_model import Command
from dueflow.timeutil import from_utc_ms
from tests.conftest import KafkaCluster
from tests.integration.steering_support import (
    RunLedger,
    finalize_when_workers_joined,
    fire,
    ledger_task,
    steering_states,
    timers_of,
)
from tests.integration.worker_support import (
    FAST_WORKER,
    OpenTransaction,
    Record,
    WorkerThread,
    commit_offset,
    logged,
    outcomes_of,
    read_topic,
    wait_for,
    waits_for_transaction,
)
from tests.support.emitters import AHEAD_MS, SMALL_WHEEL, ensure_topics, threaded_emitter

QUEUE = "steer"
CENTURY_MS = 100 * 365 * 86_400_000
DAY_MS = 86_400_000


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    return steering_settings(kafka, prefix)


def steering_settings(kafka: KafkaCluster, prefix: str, **extra: object) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[
            # Idempotency records live 2 s: a legacy cancel would be forgotten at once.
            {
                "name": QUEUE,
                "partitions": 3,
                "retry_tiers_ms": [200],
                "idempotency_retention_ms": 2000,
            }
        ],
        **{"wheel": SMALL_WHEEL, "worker": FAST_WORKER, **extra},
    )
    ensure_topics(s)
    return s


def _outcomes(settings: Settings, job_id: str) -> list[dict[str, object]]:
    records = read_topic(settings, names(settings).outcomes)
    return [o for o in outcomes_of(records) if o["job_id"] == job_id]


@pytest.mark.timeout(240)
def test_jobs_due_in_a_century_are_cancelled_moved_and_updated_beyond_the_retention(
    settings: Settings, tmp_path: Path
) -> None:
    ledger = RunLedger(tmp_path / "runs.db")
    n = names(settings)
    with WorkerThread(settings, ledger_task(ledger, queue=QUEUE)) as worker:
        finalize_when_workers_joined(settings, QUEUE)
        wait_for("the worker to own its partitions", lambda: worker.assigned() > 0)
        with Scheduler(settings) as s:
            now = int(time.time() * 1000)
            due = now + CENTURY_MS
            jobs = {
                kind: [
                    s.schedule(
                        "steered", {"kind": kind, "i": i}, queue=QUEUE, run_at=from_utc_ms(due)
                    )
                    for i in range(4)
                ]
                for kind in ("cancel", "move", "update", "keep")
            }
            verdicts: dict[str, Cancelled | Rescheduled | Updated] = {}
            for j in jobs["cancel"]:
                verdicts[j.job_id] = s.cancel(j.job_id, wait=30)
            for j in jobs["move"]:
                verdicts[j.job_id] = s.reschedule(
                    j.job_id, run_at=from_utc_ms(due + DAY_MS), wait=30
                )
            for j in jobs["update"]:
                verdicts[j.job_id] = s.update(j.job_id, payload={"kind": "updated"}, wait=30)
        assert all(
            v.verdict in ("cancelled", "rescheduled", "updated") for v in verdicts.values()
        ), [v.message for v in verdicts.values()]
        # Past the idempotency retention: a legacy cancel record would be gone now.
        time.sleep(2.5)  # time passing is the subject here, not a synchronization

        # The wheel fires every original timer (as it would in 2126).
        originals = read_topic(settings, n.timers)
        fire(settings, originals, due_now=True)

        def redirected() -> list[Record]:
            timers = read_topic(settings, n.timers)
            return [t for t in timers if hdr.VERSION in t.headers]

        moved_and_updated = {j.job_id for j in jobs["move"] + jobs["update"]}
        wait_for(
            "a new timer of every moved and updated job",
            lambda: {t.headers[hdr.JOB_ID].decode() for t in redirected()} == moved_and_updated,
            60,
        )
        wait_for(
            "the kept jobs to run",
            lambda: {r[0] for r in ledger.runs()} == {j.job_id for j in jobs["keep"]},
        )
        new_timers = redirected()
        for j in jobs["move"]:
            (t,) = timers_of(settings, j.job_id, new_timers)
            assert int(t.headers[hdr.DUE]) == due + DAY_MS
            assert t.headers[hdr.VERSION].decode() == verdicts[j.job_id].command_id
        for j in jobs["update"]:
            (t,) = timers_of(settings, j.job_id, new_timers)
            assert int(t.headers[hdr.DUE]) == due  # the same due time, a new payload
        # Their new timers fire (in 2126 and a day).
        fire(settings, new_timers, due_now=True)
        expected = {j.job_id for kind in ("move", "update", "keep") for j in jobs[kind]}
        wait_for(
            "the moved and updated jobs to run", lambda: {r[0] for r in ledger.runs()} == expected
        )
        wait_for(
            "every state removed once its job ended",
            lambda: (
                all(v is None for v in steering_states(settings, QUEUE).values())
                and len(steering_states(settings, QUEUE)) == 12
            ),
            60,
        )
    runs = ledger.runs()
    assert sorted(r[0] for r in runs) == sorted(expected), "each ran once"
    for r in runs:
        job_id, _attempt, payload, version, _at, _pid = r
        if job_id in {j.job_id for j in jobs["update"]}:
            assert payload == {"kind": "updated"}
            assert version == verdicts[job_id].command_id
        elif job_id in {j.job_id for j in jobs["move"]}:
            assert version == verdicts[job_id].command_id
        else:
            assert version == ""  # never steered: its original timer
    for j in jobs["cancel"]:
        states = [o["state"] for o in _outcomes(settings, j.job_id)]
        assert states.count("cancelled") == 2, states  # the verdict, then the skipped timer


# ------------------------------------------------------------------ the race at the due time


@dataclass
class Sent:
    """A command and the broker times (LogAppendTime of probes on the one broker)
    between which it was appended."""

    job_id: str
    op: str
    command_id: str
    before_ms: int
    after_ms: int


def _command_producer(settings: Settings) -> Producer:
    """The producer of :func:`_send_around`, its topics' metadata known (a first send
    asking for it under load could come after the commands' times)."""
    producer = make_producer(settings, **{"linger.ms": 0})
    n = names(settings)
    for topic in (n.clock, n.exec(QUEUE)):
        producer.list_topics(topic, timeout=30)
    return producer


def _send_around(
    settings: Settings, producer: Producer, plan: list[tuple[float, Command]]
) -> list[Sent]:
    """Send each command at its wall time, in batches of 10 ms, each batch between two
    acknowledged probe records to the clock topic (LogAppendTime)."""
    clock_topic = names(settings).clock
    stamps: list[int] = []

    def probe() -> int:
        stamps.clear()

        def took(err: Any, msg: Any) -> None:
            assert err is None, err
            stamps.append(msg.timestamp()[1])

        producer.produce(clock_topic, b"probe", on_delivery=took)
        producer.flush(30)
        (ts,) = stamps
        return ts

    out: list[Sent] = []
    spec = settings.queue(QUEUE)
    i = 0
    while i < len(plan):
        at = plan[i][0]
        ahead = at - time.time()
        if ahead > 0:
            time.sleep(ahead)  # the load is sent on its schedule: not a synchronization
        batch = [c for t, c in plan[i:] if t < at + 0.010]
        i += len(batch)
        before = probe()
        for cmd in batch:
            for rec in command_records(names(settings), cmd, partitions=spec.partitions):
                produce: Any = producer.produce  # headers: bytes values
                produce(rec.topic, rec.value, rec.key, rec.partition, headers=rec.headers)
        assert producer.flush(30) == 0
        after = probe()
        out += [Sent(c.job_id, c.op, c.command_id, before, after) for c in batch]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ahead_ms", [0, AHEAD_MS], ids=["written-when-due", "fired-ahead"])
def test_a_command_appended_before_the_due_time_always_wins_the_race(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, ahead_ms: int
) -> None:
    """300 jobs due at T; a cancel or a move later for each, sent at random in
    [T - 300 ms, T + 100 ms]. One broker: the probes' LogAppendTime brackets when
    each command was appended. Every command appended before T wins: written when
    due (``fire_ahead_ms`` 0) the job is behind it in the log; fired ahead (the
    default lead, ``worker.steering_margin_ms`` 0) the job may be in front of it,
    and the worker starts the job only once it has handled every record appended
    before T (the lead fence). Never early, never twice, either way."""
    settings = steering_settings(
        kafka,
        prefix,
        emitter={"fire_ahead_ms": ahead_ms},
        worker={**FAST_WORKER, "steering_margin_ms": 0},
    )
    count = 300
    rng = random.Random(26)
    ledger = RunLedger(tmp_path / "runs.db")
    n = names(settings)
    with (
        threaded_emitter(settings) as em,
        WorkerThread(settings, ledger_task(ledger, queue=QUEUE)) as worker,
    ):
        em.wait_active()
        finalize_when_workers_joined(settings, QUEUE)
        wait_for("the worker to own its partitions", lambda: worker.assigned() > 0)
        producer = _command_producer(settings)
        with Scheduler(settings) as s:
            due = int(time.time() * 1000) + 10_000
            result = s.schedule_many(
                JobRequest("steered", {"i": i}, queue=QUEUE, run_at=from_utc_ms(due))
                for i in range(count)
            )
        assert result.ok, result.errors
        jobs = [j for j in result.job_ids if j is not None]
        moved_to = due + 3_000
        plan = []
        for i, job_id in enumerate(jobs):
            op = "cancel" if i % 2 else "move"
            at = (due + rng.uniform(-300, 100)) / 1000
            cmd = Command(
                command_id=uuid.uuid4().hex,
                op=op,
                job_id=job_id,
                idempotency_key=job_id,
                queue=QUEUE,
                at_ms=int(at * 1000),
                known_due_ms=due,
                due_ms=moved_to if op == "move" else None,
            )
            plan.append((at, cmd))
        plan.sort(key=lambda p: p[0])
        late_by_ms = int(time.time() * 1000) - int(plan[0][0] * 1000)
        sent = {s.job_id: s for s in _send_around(settings, producer, plan)}

        def finished() -> bool:
            outs = outcomes_of(read_topic(settings, n.outcomes))
            # ran, or its delivery was skipped as cancelled (not a command's verdict)
            done = {
                str(o["job_id"])
                for o in outs
                if o["state"] == "succeeded"
                or (o["state"] == "cancelled" and o.get("command_id") is None)
            }
            return done >= set(jobs) and time.time() * 1000 > moved_to + 2_000

        wait_for("every job to run or be cancelled", finished, 120)
    runs = ledger.runs()
    by_job: dict[str, list[tuple[str, int, Any, str, float, int]]] = {}
    for r in runs:
        by_job.setdefault(r[0], []).append(r)
    tally = {"before": 0, "between": 0, "after": 0}
    for job_id in jobs:
        s_ = sent[job_id]
        mine = by_job.get(job_id, [])
        assert len(mine) <= 1, f"{job_id} ran {len(mine)} times"
        where = "before" if s_.after_ms < due else "after" if s_.before_ms > due else "between"
        tally[where] += 1
        for _j, _a, _p, version, at, _pid in mine:
            start_ms = at * 1000
            if version == s_.command_id:
                assert start_ms >= moved_to - 2, "the moved version ran early"
            else:
                assert version == ""
                assert start_ms >= due - 2, "the old version ran early"
        if where == "before":
            if s_.op == "cancel":
                assert mine == [], f"cancelled before its due time, ran: {mine}"
            else:
                assert [r[3] for r in mine] == [s_.command_id], "the old version ran"
        if s_.op == "move":
            assert len(mine) == 1, f"a moved job runs once: {mine}"
    print(f"commands appended before / around / after the due time: {tally}")
    assert tally["before"] > 0, f"the first command was ready {late_by_ms} ms after its time"
    assert tally["after"] + tally["between"] > 0


@pytest.mark.timeout(180)
def test_the_command_line_steers_with_commands_and_prints_the_verdicts(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dueflow.apps.cli.main import main

    ledger = RunLedger(tmp_path / "runs.db")
    wheel = settings.wheel
    options = [
        *["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix],
        *["--queues", f"{QUEUE}:3"],
    ]
    env = {
        "DUEFLOW_WHEEL_LEVELS": SMALL_WHEEL["levels"],
        "DUEFLOW_WHEEL_NEAR_PARTITIONS": str(wheel.near_partitions),
        "DUEFLOW_WHEEL_NEAR_WINDOW_MS": str(wheel.near_window_ms),
        "DUEFLOW_WHEEL_LOOKAHEAD_MS": str(wheel.lookahead_ms),
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    try:
        with WorkerThread(settings, ledger_task(ledger, queue=QUEUE)) as worker:
            wait_for("the worker to own its partitions", lambda: worker.assigned() > 0)
            capsys.readouterr()
            assert main(["queue", "finalize", QUEUE, *options]) == 0
            assert f"queue {QUEUE} finalized" in capsys.readouterr().out

            def cli(*argv: str) -> tuple[int, Any]:
                capsys.readouterr()
                code = main([*argv, *options, "--json"])
                return code, orjson.loads(capsys.readouterr().out)

            code, a = cli("schedule", "steered", "--queue", QUEUE, "--delay", "36500d")
            assert code == 0
            code, b = cli("schedule", "steered", "--queue", QUEUE, "--delay", "36500d")
            code, cancelled = cli("cancel", a["job_id"], "--wait", "30s")
            assert (code, cancelled["verdict"], cancelled["cancelled"]) == (0, "cancelled", True)
            code, updated = cli("update", b["job_id"], "--payload", '{"v": 2}', "--wait", "30s")
            assert (code, updated["verdict"]) == (0, "updated")
            code, moved = cli("reschedule", b["job_id"], "--delay", "36600d", "--wait", "30s")
            assert (code, moved["verdict"]) == (0, "rescheduled")
            code, again = cli("update", a["job_id"], "--payload", "3", "--wait", "30s")
            assert (code, again["updated"]) == (1, False)
    finally:
        mp.undo()
    assert ledger.runs() == []


# ------------------------------------------------------------------ a new owner's load


@pytest.mark.timeout(180)
def test_a_new_owner_waits_for_the_previous_owners_steering_record_before_judging_its_jobs(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    """The previous owner's last transaction held an update's state record and the
    command's offset. Its commit markers are written partition by partition: the offset
    can count as committed while the state record's partition has no marker yet (its
    last stable offset is still before it). Modelled exactly: the state record in a
    transaction kept open, the command's offset committed. A new owner that loads the
    partition meanwhile must not judge the job against the state without the update."""
    ledger = RunLedger(tmp_path / "runs.db")
    n = names(settings)
    spec = settings.queue(QUEUE)
    metrics = Metrics()
    # The previous owner: it made the group (and left).
    with WorkerThread(settings, ledger_task(ledger, queue=QUEUE)) as previous:
        wait_for("the previous owner to own its partitions", lambda: previous.assigned() > 0)
    with Scheduler(settings) as s:
        due = int(time.time() * 1000) + CENTURY_MS
        job = s.schedule("steered", {"v": "old"}, queue=QUEUE, run_at=from_utc_ms(due))
    key = job.job_id.encode()  # its idempotency key
    partition = partition_for_key(key, spec.partitions)
    payload, content_type = encode_payload({"v": "new"})
    now = int(time.time() * 1000)
    cmd = Command(
        command_id=uuid.uuid4().hex,
        op="patch",
        job_id=job.job_id,
        idempotency_key=job.job_id,
        queue=QUEUE,
        at_ms=now,
        known_due_ms=due,
        payload=payload,
        content_type=content_type,
    )
    # The command, as a client writes it.
    (rec,) = command_records(n, cmd, partitions=spec.partitions)
    written: list[int] = []
    producer = make_producer(settings)
    produce: Any = producer.produce  # headers: bytes values
    produce(
        rec.topic,
        rec.value,
        rec.key,
        rec.partition,
        headers=rec.headers,
        on_delivery=lambda err, msg: written.append(msg.offset()) if err is None else None,
    )
    assert producer.flush(30) == 0
    assert len(written) == 1
    # The previous owner applied it: the state record its rule makes, as it writes it,
    applied = steering_rule.apply(
        None,
        cmd,
        key=None,
        now_ms=now,
        grace_ms=settings.worker.steering_grace(spec),
        exec_partition=partition,
    )
    assert applied.state is not None
    assert applied.state.patch is not None
    state = encode_entry(applied.state)
    record = (n.steering(QUEUE), partition, topic_key(key), state, [(hdr.SCHEMA, STATE_SCHEMA)])
    with OpenTransaction(settings, f"{prefix}.previous-owner", [record]) as previous_txn:
        # ... and the command's offset: that marker is written, the other one not yet.
        commit_offset(
            settings,
            n.worker_group(QUEUE),
            TopicPartition(n.exec(QUEUE), partition, written[0] + 1),
        )
        # The job's timer fires (as it will in 2126), behind the command.
        (timer,) = timers_of(settings, job.job_id, read_topic(settings, n.timers))
        fire(settings, [timer], due_now=True)
        with (
            logged("dueflow.worker") as events,
            WorkerThread(settings, ledger_task(ledger, queue=QUEUE), metrics=metrics),
        ):
            wait_for(
                "the new owner to load the partition (it runs the job, or waits for the "
                "transaction)",
                lambda: bool(ledger.runs()) or waits_for_transaction(events, "steering"),
            )
            previous_txn.commit()
            wait_for(
                "the job to run, or to be redirected to its new version",
                lambda: (
                    bool(ledger.runs())
                    or any(o["state"] == "rescheduled" for o in _outcomes(settings, job.job_id))
                ),
            )
            assert ledger.runs() == [], "the job ran its old version"
            timers = timers_of(settings, job.job_id, read_topic(settings, n.timers))
            (new_timer,) = [t for t in timers if hdr.VERSION in t.headers]
            assert new_timer.headers[hdr.VERSION].decode() == cmd.command_id
            fire(settings, [new_timer], due_now=True)
            wait_for(
                "the updated job's run to commit",
                lambda: any(o["state"] == "succeeded" for o in _outcomes(settings, job.job_id)),
            )
    runs = ledger.runs()
    assert [(r[0], r[2], r[3]) for r in runs] == [(job.job_id, {"v": "new"}, cmd.command_id)]
    waited = metrics.registry.get_sample_value(
        "dueflow_store_load_wait_seconds_sum", {"queue": QUEUE, "store": "steering"}
    )
    assert waited is not None
    assert waited > 0
