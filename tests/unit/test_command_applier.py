"""The owner's applier (dueflow.consumers.commands): what a command and a delivery of a
steered job add to the batch, record by record."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import QueueSpec, Settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.commands import CommandApplier, SteeringBook
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.steering_store import memory_steering_stores
from dueflow.consumers.store import CANCELLED, MemoryKeyStore
from dueflow.consumers.testing import exec_headers
from dueflow.kafka.topics import names
from dueflow.model import Job
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records import codec
from dueflow.records.command import command_headers, command_key, encode_command
from dueflow.records.steering_state import decode_job_state, job_key
from dueflow.records.timer_record import TimerPlacer
from dueflow.rules.steering import Step
from dueflow.steering_model import Command, JobSteering, Outstanding
from dueflow.testing.log import MemoryRecord

NOW = 1_800_000_000_000
DUE = NOW + 3_600_000
SETTINGS = Settings(queues=(QueueSpec("q", partitions=3),)).validate()
N = names(SETTINGS)


@task("t", queue="q")
def handler(payload: Any, ctx: TaskContext) -> None:
    pass


REGISTRY = TaskRegistry([handler])


class World:
    def __init__(self) -> None:
        spec = SETTINGS.queue("q")
        self.metrics = Metrics()
        self.batch = BatchRecorder(
            SETTINGS,
            spec,
            worker_id="w1",
            metrics=self.metrics,
            tracer=JobTracer(),
            rng=random.Random(0),
        )
        self.book = SteeringBook("q", 7 * 86_400_000, memory_steering_stores())
        self.book.attach(1)
        self.keys = MemoryKeyStore(86_400_000)
        self.feed = PartitionFeed(N.exec("q"), 1, None, self.keys)
        self.applier = CommandApplier(
            queue="q",
            book=self.book,
            recorder=self.batch,
            topics=N,
            placer=TimerPlacer(SETTINGS.wheel),
            worker_id="w1",
            metrics=self.metrics,
            key_state=lambda feed, key: self.batch.pending_final.get(key, feed.keys.get(key)),
        )
        self.batch.steering = self.applier
        self.offset = 0

    def delivery(
        self, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> Delivery:
        self.offset += 1
        msg = MemoryRecord(self.feed.topic, 1, self.offset, key, value, headers, NOW)
        d = Delivery(self.feed, msg, self.offset)
        prepare(d, REGISTRY, now_ms=DUE + 1_000, limits=WireLimits())  # delivered when due
        return d

    def command(self, cmd: Command, **changes: Any) -> Delivery:
        headers = command_headers(cmd)
        key = changes.pop("key", command_key(cmd.idempotency_key.encode()))
        value = changes.pop("value", encode_command(cmd))
        headers += changes.pop("extra_headers", [])
        return self.delivery(key, value, headers)

    def job(self, job: Job, extra: list[tuple[str, bytes]] = ()) -> Delivery:  # type: ignore[assignment]
        value = codec.encode("job", job.to_record())
        headers = exec_headers(job, fired_ms=job.due_ms)  # fired at its due time
        return self.delivery(job.idempotency_key.encode(), value, headers + list(extra))

    def commit(self) -> list[tuple[Any, ...]]:
        cut = self.batch.cut([self.feed])
        assert cut is not None
        batch, finals, marks = cut
        self.batch.committed(finals, marks)
        return [r[1:] for r in batch.records]


def outcome_of(records: list[tuple[Any, ...]]) -> dict[str, Any]:
    (rec,) = [r for r in records if r[0] == N.outcomes]
    _topic, _p, _key, value, headers = rec
    version = codec.parse_schema_header(hdr.header(headers, hdr.SCHEMA), expected="outcome")
    return codec.decode("outcome", value, writer_version=version)


def cmd(op: str = "cancel", cid: str = "c1", **kw: Any) -> Command:
    fields: dict[str, Any] = {"queue": "q", "known_due_ms": DUE, **kw}
    return Command(cid, op, "j1", "k1", at_ms=NOW, **fields)


JOB = Job("j1", "q", "t", b'{"v":1}', DUE, "k1", NOW, content_hash="h0")


def test_a_cancel_writes_the_state_the_key_and_the_verdict_in_one_batch() -> None:
    w = World()
    assert w.applier.command(w.command(cmd()), NOW, running=()) is None
    assert w.book.get(1, b"k1") is not None  # pending: read by what comes next
    records = w.commit()
    topics = [r[0] for r in records]
    assert topics == [N.steering("q"), N.idempotency("q"), N.outcomes]
    state_rec = records[0]
    assert (state_rec[1], state_rec[2]) == (1, job_key(b"k1"))
    state = decode_job_state(state_rec[3], hdr.header(state_rec[4], hdr.SCHEMA))
    assert state.cancelled
    assert state.outstanding == (Outstanding("", DUE),)
    out = outcome_of(records)
    assert (out["state"], out["command_id"], out["exec_partition"], out["worker"]) == (
        "cancelled",
        "c1",
        1,
        "w1",
    )
    assert w.keys.get(b"k1") == CANCELLED  # committed: the key store knows
    assert w.book.pending == {}
    assert w.book.store(1).get(b"k1") == state  # type: ignore[union-attr]


def test_a_command_that_does_not_decode_is_for_the_quarantine() -> None:
    w = World()
    bad = w.command(cmd(), value=b"\xff\x00garbage")
    assert "dueflow.Command" in (w.applier.command(bad, NOW, running=()) or "")
    assert len(w.batch) == 0


def test_a_replayed_command_is_ignored() -> None:
    w = World()
    d = w.command(cmd(), extra_headers=[(hdr.REPLAYED_FROM, b"x:1:2")])
    assert w.applier.command(d, NOW, running=()) is None
    assert len(w.batch) == 0


@pytest.mark.parametrize(
    ("command", "changes", "field"),
    [
        (cmd(queue="other"), {}, "queue"),
        (cmd(), {"key": b"k2\x00cmd"}, "key"),
        (cmd("move"), {}, "due_ms"),
        (cmd("replace", due_ms=NOW, job=b"\x02garbage"), {}, "job"),
        (cmd("patch", payload=b"x" * 2_000_000), {}, "payload"),
        (
            cmd(
                "replace",
                due_ms=NOW,
                job=codec.encode("job", Job("j1", "q", "t", b"{}", NOW, "other", NOW).to_record()),
            ),
            {},
            "job",
        ),
    ],
)
def test_a_command_with_a_bad_field_is_refused_naming_it(
    command: Command, changes: dict[str, Any], field: str
) -> None:
    w = World()
    assert w.applier.command(w.command(command, **changes), NOW, running=()) is None
    out = outcome_of(w.commit())
    assert out["state"] == "refused"
    assert out["error"].startswith(f"invalid: {field}: got")


def test_the_key_running_here_refuses_a_move_and_lets_a_cancel_end_the_job() -> None:
    w = World()
    w.applier.command(w.command(cmd("move", due_ms=DUE + 1)), NOW, running=(b"k1",))
    assert outcome_of(w.commit())["error"].startswith("started:")
    w.applier.command(w.command(cmd("cancel", "c2")), NOW, running=(b"k1",))
    out = outcome_of(w.commit())
    assert out["state"] == "cancelled"
    state = w.book.get(1, b"k1")
    assert state is not None
    assert state.cancelled
    assert state.ended is None


def test_a_redirect_writes_the_jobs_timer_again_with_the_waiting_update() -> None:
    w = World()
    w.applier.command(
        w.command(
            cmd("patch", payload=b'{"v":2}', content_type="application/json", due_ms=DUE + 60_000)
        ),
        NOW,
        running=(),
    )
    w.commit()
    d = w.job(JOB, [(hdr.EXPIRES, str(DUE + 5_000).encode()), (hdr.TRACEPARENT, b"00-t-s-01")])
    judged = w.book.judge(d)
    assert judged is not None
    assert judged.step is Step.REDIRECT
    w.applier.judged(d, judged, NOW + 10)
    records = w.commit()
    (timer,) = [r for r in records if r[0] == N.timers]
    _topic, _partition, key, value, headers = timer
    assert key == b"k1"
    h = dict(headers)
    assert h[hdr.VERSION] == b"c1"
    assert h[hdr.PARTITION] == b"1"
    assert h[hdr.KIND] == b"job"
    assert int(h[hdr.DUE]) == DUE + 60_000
    assert int(h[hdr.EXPIRES]) == DUE + 65_000  # the same window after the new due time
    assert h[hdr.TRACEPARENT] == b"00-t-s-01"
    job = Job.from_record(codec.decode("job", value))
    assert (job.payload, job.due_ms, job.job_id) == (b'{"v":2}', DUE + 60_000, "j1")
    assert job.content_hash != "h0"  # of the new payload
    out = outcome_of(records)
    assert (out["state"], out["version"], out["due_ms"], out["command_id"]) == (
        "rescheduled",
        "c1",
        DUE + 60_000,
        None,
    )
    state = w.book.get(1, b"k1")
    assert state is not None
    assert state.current == "c1"
    assert state.patch is None


def test_the_end_of_the_current_version_removes_the_state() -> None:
    w = World()
    w.book.store(1).put(  # type: ignore[union-attr]
        [(b"k1", JobSteering("j1", "k1", current="c1", outstanding=(Outstanding("c1", DUE),)))]
    )
    d = w.job(JOB, [(hdr.VERSION, b"c1")])
    assert w.book.judge(d).step is Step.PASS  # type: ignore[union-attr]
    w.batch.succeeded(d, 0.01, NOW)
    records = w.commit()
    assert (N.steering("q"), 1, job_key(b"k1"), None) in [r[:4] for r in records]  # tombstone
    assert w.book.get(1, b"k1") is None


def test_a_failed_attempt_of_a_cancelled_job_hands_no_retry_on() -> None:
    from dueflow.consumers.failures import failure_of

    w = World()
    w.book.store(1).put([(b"k1", JobSteering("j1", "k1", cancelled=True))])  # type: ignore[union-attr]
    d = w.job(JOB)
    d.max_attempts = 4
    w.batch.failed(d, failure_of(OSError("disk")), 0.01, NOW)
    records = w.commit()
    assert N.retry("q", SETTINGS.queue("q").retry_tiers_ms[0]) not in [r[0] for r in records]
    assert outcome_of(records)["state"] == "cancelled"
    assert w.keys.get(b"k1") == CANCELLED
    assert w.book.get(1, b"k1") is None  # ended, nothing outstanding


def test_the_sweep_writes_what_it_forgets() -> None:
    w = World()
    old = JobSteering(
        "j1",
        "k1",
        current="c2",
        outstanding=(Outstanding("", NOW - 10 * 86_400_000), Outstanding("c2", DUE)),
    )
    w.book.store(1).put([(b"k1", old)])  # type: ignore[union-attr]
    assert w.applier.sweep({1: w.feed}, NOW) == 1
    w.commit()
    assert w.book.get(1, b"k1") == JobSteering(
        "j1", "k1", current="c2", outstanding=(Outstanding("c2", DUE),)
    )
