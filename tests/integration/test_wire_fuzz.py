"""Bad input at the wire: random bytes, truncated Avro and wrong headers on every topic
dueflow consumes, while an emitter, a worker and the status view run.

Afterwards every process still runs, every bad record was set aside with a
reason (quarantine topic, or the DLQ for exec and retry records), and jobs
scheduled after the garbage ran. Hypothesis draws the records (bounded
examples: this runs in CI in well under a minute of fuzzing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.apps.ops.dlq import read_dead_letters
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.errors import DueflowError, UndecodableRecord
from dueflow.kafka.reading import ops_consumer
from dueflow.kafka.topics import names
from dueflow.model import Job
from dueflow.producers.scheduler import Scheduler
from dueflow.reasons import DEAD_LETTER_REASONS, QUARANTINE_REASONS, reason_label
from dueflow.records import codec
from dueflow.records.fast import decode_key_state
from dueflow.records.pause_command import decode_control
from dueflow.records.queue_registry import decode_queue
from tests.chaos.ledger import Ledger
from tests.conftest import KafkaCluster
from tests.integration.status_support import start_view
from tests.integration.worker_support import read_topic, wait_for
from tests.support.emitters import (
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    emitter_env,
    ensure_topics,
)

QUEUE = "chaos"  # the queue of tests/chaos/handlers.py
ROOT = Path(__file__).resolve().parents[2]
NOW = time.time_ns() // 1_000_000

# Topics dueflow consumes, and who must set a bad record aside there.
QUARANTINED = ("timers", "schedules", "idempotency", "control", "outcomes", "queues")
DEAD_LETTERED = ("exec", "retry")
TOLERATED = ("dlq", "cron_state")  # read by tools / only written by the emitter: no crash
ROLES = QUARANTINED + DEAD_LETTERED + TOLERATED
COMPACTED = ("schedules", "idempotency", "control", "cron_state", "queues")


def _valid_values() -> list[bytes]:
    """Valid Avro records of every schema, to truncate."""
    job = Job(
        job_id="j",
        queue=QUEUE,
        task="chaos-ok",
        payload=b"{}",
        due_ms=NOW,
        idempotency_key="j",
        created_ms=NOW,
    )
    return [
        codec.encode("job", job.to_record()),
        codec.encode(
            "idempotency",
            {"idempotency_key": "k", "job_id": "j", "state": "done", "at_ms": NOW},
        ),
        codec.encode(
            "outcome",
            {
                "job_id": "j",
                "queue": QUEUE,
                "task": "t",
                "idempotency_key": "k",
                "state": "succeeded",
                "at_ms": NOW,
            },
        ),
    ]


VALID = _valid_values()
HEADER_NAMES = [hdr.DUE, hdr.QUEUE, hdr.KIND, hdr.SCHEMA, hdr.ATTEMPT, hdr.JOB_ID, "x-junk"]


@st.composite
def values(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    whole = draw(st.sampled_from(VALID))
    return whole[: draw(st.integers(0, len(whole) - 1))]  # truncated Avro


@st.composite
def header_values(draw: st.DrawFn, name: str) -> bytes:
    if name == hdr.DUE and draw(st.booleans()):
        # a time in the past (never the future: a record due later legitimately waits)
        return str(NOW - draw(st.integers(0, 10**9))).encode()
    if name == hdr.QUEUE and draw(st.booleans()):
        return QUEUE.encode()
    if name == hdr.SCHEMA and draw(st.booleans()):
        return draw(st.sampled_from([b"dueflow.Job/1", b"dueflow.Job/99", b"nonsense"]))
    text = draw(st.binary(max_size=20))
    if name == hdr.DUE and text.strip().isdigit():
        return b"not-a-number"
    return text


@st.composite
def headers(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    chosen = draw(st.lists(st.sampled_from(HEADER_NAMES), max_size=5, unique=True))
    return [(name, draw(header_values(name))) for name in chosen]


@dataclass(frozen=True)
class Garbage:
    role: str
    partition_seed: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


@st.composite
def garbage(draw: st.DrawFn) -> Garbage:
    role = draw(st.sampled_from(ROLES))
    unique = f"fuzz-{uuid.uuid4().hex[:12]}"
    key: bytes | None = unique.encode()
    if role not in COMPACTED and draw(st.integers(0, 3)) == 0:
        key = None  # (compacted topics refuse records without a key)
    if role == "control" and key is not None:
        key = b"queue:" + draw(st.sampled_from([b"", QUEUE.encode(), unique.encode()]))
    value: bytes | None = draw(values())
    if role in ("exec", "retry", "timers", "outcomes") and draw(st.integers(0, 9)) == 0:
        value = None  # a tombstone where none belongs
    return Garbage(role, draw(st.integers(0, 1000)), key, value, draw(headers()))


def _explicit_key(role: str) -> bytes:
    return b"queue:" + QUEUE.encode() if role == "control" else f"fuzz-{role}".encode()


def _topic(s: Settings, role: str) -> tuple[str, int]:
    n = names(s)
    q = s.queue(QUEUE)
    return {
        "timers": (n.timers, s.wheel.total_partitions),
        "schedules": (n.schedules, s.schedules_partitions),
        "exec": (n.exec(QUEUE), q.partitions),
        "retry": (n.retry(QUEUE, q.retry_tiers_ms[0]), q.partitions),
        "idempotency": (n.idempotency(QUEUE), q.partitions),
        "control": (n.control, 1),
        "outcomes": (n.outcomes, s.outcomes_partitions),
        "dlq": (n.dlq(QUEUE), q.partitions),
        "cron_state": (n.emitter_cron, 1),
        "queues": (n.queues, 1),
    }[role]


@dataclass(frozen=True)
class Sent:
    role: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def valid(self) -> bool:
        """Random bytes can still be a valid record (rarely): those are not garbage."""
        schema = hdr.header(self.headers, hdr.SCHEMA)
        try:
            if self.role == "idempotency":
                decode_key_state(self.value or b"", schema)
                return self.key is not None
            if self.role == "outcomes":
                version = codec.parse_schema_header(schema, expected="outcome")
                codec.decode("outcome", self.value or b"", writer_version=version)
                return True
            if self.role == "control":
                return decode_control(self.key, self.value) is not None
            if self.role == "queues":
                return decode_queue(self.key, self.value, self.headers)[1] is not None
        except (UndecodableRecord, DueflowError):
            return False
        return False


class Worker:
    """`dueflow worker` for the chaos handlers, as a process (stopped by pid)."""

    def __init__(self, s: Settings, ledger: Path, log: Path) -> None:
        env = emitter_env(
            s,
            {
                "DUEFLOW_WORKER_SESSION_TIMEOUT_MS": "3000",
                "DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "50",
                "DUEFLOW_CHAOS_LEDGER": str(ledger),
                "PYTHONPATH": str(ROOT),
            },
        )
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dueflow",
                    "worker",
                    "--app",
                    "tests.chaos.handlers",
                    "--queues",
                    QUEUE,
                ],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _quarantined(s: Settings) -> set[tuple[str, int, int]]:
    out = set()
    for r in read_topic(s, names(s).quarantine):
        try:
            q = codec.decode("quarantined", r.value or b"")
        except UndecodableRecord:
            continue
        assert reason_label(q["reason"]) in QUARANTINE_REASONS, q  # the documented set
        out.add((q["source_topic"], q["source_partition"], q["source_offset"]))
    return out


def _dead_letters(s: Settings) -> tuple[set[tuple[str, int, int]], set[str]]:
    consumer = ops_consumer(s)
    try:
        entries = read_dead_letters(s, consumer, QUEUE)
    finally:
        consumer.close()
    origins, keys = set(), set()
    for e in entries:
        if e.record is None:
            continue  # garbage written to the DLQ itself
        assert e.reason in DEAD_LETTER_REASONS, e.summary()
        assert e.summary()["error_message"], e.summary()
        rec = e.record
        origins.add((rec["original_topic"], rec["original_partition"], rec["original_offset"]))
        if e.key is not None:
            keys.add(e.key.decode(errors="replace"))
    return origins, keys


@pytest.mark.timeout(300)
def test_garbage_on_every_topic_is_set_aside_and_valid_jobs_keep_flowing(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = kafka.settings(prefix, queues=f"{QUEUE}:2", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    ensure_topics(s)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    emitter = EmitterSubprocess(s, tmp_path / "emitter.log").start()
    worker = Worker(s, ledger.path, tmp_path / "worker.log")
    view = start_view(
        s,
        port=free_port(),
        data_dir=tmp_path / "view",
        log_path=tmp_path / "view.log",
        queues=f"{QUEUE}:2",
    )
    try:
        view.wait_ready(90)
        wait_for("the emitter", lambda: emitter.active_count() >= 1, 60)
        producer = Producer(s.client_config(**{"acks": "all", "enable.idempotence": True}))
        produce: Callable[..., None] = producer.produce
        sent: list[Sent] = []

        @settings(
            max_examples=80,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(st.lists(garbage(), min_size=1, max_size=6))
        @example([Garbage(role, 0, _explicit_key(role), b"\x00\x01garbage", []) for role in ROLES])
        def throw(batch: list[Garbage]) -> None:
            reports: list[tuple[str, Any]] = []
            for g in batch:
                topic, count = _topic(s, g.role)
                partition = g.partition_seed % count

                def report(err: Any, msg: Any, role: str = g.role) -> None:
                    assert err is None, err
                    reports.append((role, msg))

                produce(topic, g.value, g.key, partition, headers=g.headers, on_delivery=report)
            assert producer.flush(30) == 0
            for role, msg in reports:
                sent.append(
                    Sent(
                        role,
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.value(),
                        list(msg.headers() or []),
                    )
                )

        throw()
        assert {x.role for x in sent} == set(ROLES)
        assert len(sent) >= 100

        # Valid jobs, scheduled after the garbage, still run.
        with Scheduler(s) as scheduler:
            valid = [
                scheduler.schedule("chaos-ok", {"n": i}, delay=f"{i % 3}s", queue=QUEUE).job_id
                for i in range(10)
            ]
        wait_for("the valid jobs", lambda: set(valid) <= set(ledger.effect_keys()), 90)

        def accounted() -> list[Sent]:
            quarantined = _quarantined(s)
            origins, dlq_keys = _dead_letters(s)
            missing = []
            for x in sent:
                if x.valid():
                    continue
                where = (x.topic, x.partition, x.offset)
                if x.role in QUARANTINED:
                    fired = (
                        x.role == "timers"
                        and x.key is not None
                        and x.key.decode(errors="replace") in dlq_keys
                    )
                    if where not in quarantined and not fired:
                        missing.append(x)
                elif x.role in DEAD_LETTERED and where not in origins:
                    missing.append(x)
            return missing

        missing: list[Sent] = []

        def all_accounted() -> bool:
            missing[:] = accounted()
            return not missing

        with contextlib.suppress(AssertionError):
            wait_for("every bad record set aside", all_accounted, 60)
        assert not missing, missing[:10]
        for name, proc in (("emitter", emitter.proc), ("worker", worker.proc), ("view", view.proc)):
            assert proc is not None
            assert proc.poll() is None, f"the {name} died"
        assert view.get("/healthz")[0] == 200
    finally:
        worker.stop()
        emitter.stop()
        view.stop()
