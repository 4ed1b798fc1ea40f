"""The wire fuzzed, against the real broker, while an emitter, a worker and the status view run.

Two properties, both drawn by hypothesis:

- ``test_garbage_on_every_topic_is_set_aside_and_valid_jobs_keep_flowing``: random
  bytes, truncated Avro and wrong headers on every topic dueflow consumes; every
  bad record ends in the quarantine or the DLQ with a reason, every process
  lives, and jobs scheduled after the garbage run.
- ``test_the_wire_at_its_boundaries``: records of the timer topic, an exec
  topic, each retry tier, the control, schedules and queue registry topics,
  with every field at and around its limits, and job records at and one byte
  around every size budget (tests/support/wire_fuzz.py draws them and computes
  each one's fate from docs/wire-format.md#accepted-ranges and #size-budget).
  After each batch, good jobs written behind the bad records on the same
  partitions all ran once and on time (never before their due time), and every
  record met its fate: run once, dead-lettered or quarantined with the reason
  and the field, expired, refused by the broker (over its topic's limit); a
  failing job near a budget ran as often as its retries fit and its dead letter
  was whole, trimmed or by reference as the oracle says.

Size and reproduction: ``DUEFLOW_FUZZ_EXAMPLES`` (default 60 batches for the
boundaries, 80 for the garbage) sets how many examples run; the draws are
derandomized (the same examples on every run, so a CI failure reproduces),
unless ``DUEFLOW_FUZZ_SEED`` is set, then that seed draws them (printed with a
failure). ``DUEFLOW_FUZZ_SHRINK=1`` lets hypothesis shrink a failing batch
(slow: every try runs against the broker). See tests/README.md.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.apps.ops.dlq import decode_entry, read_dead_letters
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.errors import DueflowError, UndecodableRecord
from dueflow.kafka.clients import make_admin
from dueflow.kafka.reading import ops_consumer, partitions_of
from dueflow.kafka.topics import names
from dueflow.model import Job
from dueflow.producers.scheduler import Scheduler
from dueflow.reasons import DEAD_LETTER_REASONS, QUARANTINE_REASONS, reason_label
from dueflow.records import codec
from dueflow.records.pause_command import decode_control
from dueflow.records.queue_registry import decode_queue
from dueflow.records.worker_codec import decode_key_state
from tests.chaos.ledger import Ledger, Run, now_ms
from tests.conftest import KafkaCluster
from tests.integration.status_support import start_view
from tests.integration.worker_support import read_topic, wait_for
from tests.support import wire_fuzz as wf
from tests.support import wire_sizes as ws
from tests.support.emitters import (
    FAST_EMITTER,
    SMALL_WHEEL,
    EmitterSubprocess,
    ensure_topics,
)
from tests.support.worker_process import WorkerProcess

QUEUE = "chaos"  # the queue of tests/chaos/handlers.py
NOW = time.time_ns() // 1_000_000
_EXAMPLES = os.environ.get("DUEFLOW_FUZZ_EXAMPLES")
GARBAGE_EXAMPLES = int(_EXAMPLES) if _EXAMPLES else 80
BOUNDARY_EXAMPLES = int(_EXAMPLES) if _EXAMPLES else 60
_SEED = os.environ.get("DUEFLOW_FUZZ_SEED")


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings of a fuzzer against the broker: derandomized (or seeded by
    ``DUEFLOW_FUZZ_SEED``), no deadline, no example database, no shrinking unless
    ``DUEFLOW_FUZZ_SHRINK=1``."""
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("DUEFLOW_FUZZ_SHRINK") == "1":
        phases.append(Phase.shrink)

    def wrap(test: Any) -> Any:
        configured = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=_SEED is None,
            phases=phases,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        )(test)
        return seed(int(_SEED))(configured) if _SEED is not None else configured

    return wrap


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


@pytest.mark.timeout(300 + 2 * GARBAGE_EXAMPLES)
def test_garbage_on_every_topic_is_set_aside_and_valid_jobs_keep_flowing(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    s = kafka.settings(prefix, queues=f"{QUEUE}:2", wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    ensure_topics(s)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    emitter = EmitterSubprocess(s, tmp_path / "emitter.log").start()
    worker = WorkerProcess(
        s,
        tmp_path / "worker.log",
        app="tests.chaos.handlers",
        queues=QUEUE,
        env={"DUEFLOW_CHAOS_LEDGER": str(ledger.path)},
    )
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

        @fuzz_settings(GARBAGE_EXAMPLES)
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


# ============================================================ the wire at its boundaries

LATE_MS = 10_000  # "on time": started this long after its due time (or its write) at most
WAIT_S = 60.0  # for every record of a batch to meet its fate


@dataclass
class Seen:
    """What the pipeline did, read from its topics and the handlers' ledger."""

    quarantined: dict[tuple[str, int, int], str] = field(default_factory=dict)
    dead: list[dict[str, Any]] = field(default_factory=list)  # decoded, plus "key"
    expired: set[str] = field(default_factory=set)  # job ids with outcome expired


class Wire:
    """Writes fuzzed records and reads what became of them (quarantine, DLQ, outcomes:
    one read_committed consumer tailing them; runs: the chaos ledger)."""

    def __init__(self, s: Settings, ledger: Ledger) -> None:
        self.s = s
        self.n = names(s)
        self.ledger = ledger
        self.seen = Seen()
        # Records of up to the topics' limits (librdkafka's own default is below them),
        # uncompressed: the broker sees the size the oracle counts.
        big = {"message.max.bytes": 16 * 1024 * 1024, "compression.type": "none"}
        self.producer = Producer(
            s.client_config(**{"acks": "all", "enable.idempotence": True, **big})
        )
        # Records over a topic's limit, which the broker refuses: not through the
        # idempotent producer (a refused batch must not disturb its sequence).
        self.oversize = Producer(s.client_config(**{"acks": "all", "linger.ms": 0, **big}))
        self.consumer = ops_consumer(s)
        tps = [
            TopicPartition(topic, p, 0)
            for topic in (self.n.quarantine, self.n.dlq(wf.QUEUE), self.n.outcomes)
            for p in partitions_of(self.consumer, topic)
        ]
        self.consumer.assign(tps)

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(10)
        self.oversize.flush(10)

    def place(self, spec: wf.Spec) -> wf.Place:
        """Where a job record of ``spec`` will land: the next offset of its partition
        (asked only for a record near a size budget: ``df-src`` and ``df-origin``
        name the offset, and its digits count)."""
        place = wf.Place(self.s.topic_prefix)
        if spec.size is None or spec.size.budget is None:
            return place
        tp = TopicPartition(place.topic(spec.role, spec.tier), spec.partition)
        _, high = self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        return wf.Place(self.s.topic_prefix, high)

    def topic(self, rec: wf.Record) -> str:
        return {
            "timer": self.n.timers,
            "exec": self.n.exec(wf.QUEUE),
            "retry": self.n.retry(wf.QUEUE, rec.tier),
            "control": self.n.control,
            "schedule": self.n.schedules,
            "queue": self.n.queues,
        }[rec.topic_role]

    def write(self, records: list[wf.Record]) -> list[tuple[wf.Record, tuple[str, int, int]]]:
        """Write ``records`` in order; each with where it landed (offset -1: refused as
        too large, as its fate says), its size fates settled there."""
        landed: list[Any] = [None] * len(records)
        for i, rec in enumerate(records):
            value, headers = rec.value, list(rec.headers)
            if rec.doc is not None:
                value, headers = _avro_doc(rec)
            if rec.fate == "refused":
                self._refused(rec, landed, i)
                continue

            def done(err: Any, msg: Any, i: int = i) -> None:
                assert err is None, err
                landed[i] = (msg.topic(), msg.partition(), msg.offset())

            self.producer.produce(
                self.topic(rec),
                value,
                rec.key,
                rec.partition,
                headers=headers,  # type: ignore[arg-type]
                on_delivery=done,
            )
        assert self.producer.flush(30) == 0
        for rec, (_, _, offset) in zip(records, landed, strict=True):
            if rec.sizing is not None and offset >= 0:
                wf.settle(rec, offset)
        return list(zip(records, landed, strict=True))

    def _refused(self, rec: wf.Record, landed: list[Any], i: int) -> None:
        """Write ``rec``, larger than its topic's limit: the broker must refuse it."""
        errors: list[Any] = []
        self.oversize.produce(
            self.topic(rec),
            rec.value,
            rec.key,
            rec.partition,
            headers=rec.headers,  # type: ignore[arg-type]
            on_delivery=lambda err, _msg: errors.append(err),
        )
        assert self.oversize.flush(30) == 0
        (err,) = errors
        assert err is not None, f"the broker took a record over its limit: {_show(rec)}"
        assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE, (err, _show(rec))
        landed[i] = (self.topic(rec), rec.partition, -1)

    def poll(self) -> None:
        for msg in self.consumer.consume(5_000, 0.2):
            if msg.error() is not None:
                continue
            topic = msg.topic()
            if topic == self.n.quarantine:
                q = codec.decode("quarantined", msg.value() or b"")
                where = (q["source_topic"], q["source_partition"], q["source_offset"])
                self.seen.quarantined[where] = q["reason"]
            elif topic == self.n.outcomes:
                raw: Any = msg.headers() or []
                version = codec.parse_schema_header(hdr.header(raw, hdr.SCHEMA), expected="outcome")
                out = codec.decode("outcome", msg.value() or b"", writer_version=version)
                if out["state"] == "expired":
                    self.seen.expired.add(out["job_id"])
            else:
                entry = decode_entry(wf.QUEUE, msg)
                assert entry.record is not None, entry.problem  # the worker's own records
                self.seen.dead.append({**entry.record, "key": entry.key or b""})


def _avro_doc(rec: wf.Record) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A schedule or queue registry record's value: the doc as Avro when it encodes,
    else the doc as JSON (which is no Avro: undecodable, as a foreign writer's)."""
    name = "schedule" if rec.role == "schedule" else "queue"
    assert rec.doc is not None
    try:
        value = codec.encode(name, rec.doc)
    except (OverflowError, ValueError, TypeError):
        value = repr(rec.doc).encode()
    return value, [(hdr.SCHEMA, codec.schema_header(name))]


def _good(role: str, partition: int, tier: int, now: int) -> wf.Record:
    spec = wf.Spec(role, partition=partition, tier=tier)
    rec = wf.materialize(spec, now=now, tok=wf.token())
    assert rec.fate == "run", rec
    return rec


class Batch:
    """One example: its records (bad ones first, then good ones behind them) and where
    each landed."""

    def __init__(self, wire: Wire, specs: list[wf.Spec]) -> None:
        now = now_ms()
        bad = [
            wf.materialize(spec, now=now, tok=wf.token(), place=wire.place(spec)) for spec in specs
        ]
        lanes = {
            (r.topic_role, r.partition, r.tier) for r in bad if r.role in ("exec", "retry", "timer")
        }
        lanes |= {("exec", p, 0) for p in range(wf.EXEC_PARTITIONS)}  # behind control & co.
        role_of = {"exec": "exec", "retry": "retry", "timer": "timer"}
        good = [_good(role_of[r], p, t or wf.TIERS[0], now) for r, p, t in sorted(lanes)]
        self.records = wire.write([*bad, *good])
        self.wire = wire

    def _runs(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = {}
        runs = self.wire.ledger.runs()
        for rec, _ in self.records:
            out[rec.token] = [r for r in runs if rec.token in r.job_id]
        return out

    def _dead(self, rec: wf.Record, where: tuple[str, int, int]) -> dict[str, Any] | None:
        for d in self.wire.seen.dead:
            origin = (d["original_topic"], d["original_partition"], d["original_offset"])
            texts = (d["key"].decode("utf-8", "replace"), d["idempotency_key"], d["job_id"])
            if origin == where or any(rec.token in t for t in texts):
                return d
        return None

    def pending(self) -> list[str]:
        """What has not met its fate yet (empty: the batch is done)."""
        self.wire.poll()
        runs = self._runs()
        left = []
        for rec, where in self.records:
            ran = bool(runs[rec.token])
            done = {
                "run": ran,
                "expired": any(rec.token in j for j in self.wire.seen.expired),
                "dlq": self._dead(rec, where) is not None,
                "either": ran or self._dead(rec, where) is not None,
                "quarantine": where in self.wire.seen.quarantined,
                "accepted": True,
                "parked": True,
                "refused": True,
            }[rec.fate]
            if not done:
                left.append(f"{rec.fate} {rec.role} {rec.token} at {where}: {_show(rec)}")
        return left

    def check(self) -> None:
        """Every record met its fate, and only it."""
        runs = self._runs()
        seen = self.wire.seen
        for rec, where in self.records:
            ran = runs[rec.token]
            what = f"{rec.fate} {rec.role} at {where}: {_show(rec)}"
            dead = self._dead(rec, where)
            if rec.fate == "run" or (rec.fate == "either" and ran):
                assert len(ran) == 1, (what, ran)  # exactly once
                run = ran[0]
                assert run.started_ms >= rec.not_before, ("early", what, run)
                late = run.started_ms - max(rec.not_before, rec.written_ms)
                assert late <= LATE_MS, (f"{late} ms late", what, run)
                assert dead is None, (what, dead)
            elif rec.fate == "dlq":
                assert len(ran) == rec.runs, (what, ran)  # a failing task's attempts
                if ran:
                    first = min(r.started_ms for r in ran)
                    assert first >= rec.not_before, ("early", what, ran)
                    late = first - max(rec.not_before, rec.written_ms)
                    assert late <= LATE_MS, (f"{late} ms late", what, ran)
            else:
                assert ran == [], ("ran", what, ran)
            if rec.fate == "dlq" or (rec.fate == "either" and not ran):
                assert dead is not None, what
                assert dead["reason"] in rec.reasons, (what, dead["reason"])
                kept = wf.dead_letter_kept(dead)
                message = dead["error_message"]
                assert message or kept == "texts", what
                if kept != "texts":
                    assert message.startswith(rec.message), (what, message)
                if rec.cut is not None:  # near the DLQ's budget: trimmed as the oracle says
                    assert kept == rec.cut or (rec.cut == "kept" and kept != "reference"), (
                        what,
                        kept,
                    )
                if dead["reason"] == reasons.OUT_OF_RANGE and rec.fields:
                    assert message.split(": ", 1)[0] in rec.fields, (what, message)
                    assert "accepted: " in message, (what, message)
            if rec.fate == "refused":
                assert dead is None, (what, dead)
            if rec.fate == "quarantine":
                reason = seen.quarantined[where]
                assert reason_label(reason) in rec.reasons, (what, reason)
            elif rec.role in ("timer", "control", "schedule", "queue"):
                assert where not in seen.quarantined, (what, seen.quarantined[where])


def _show(rec: wf.Record) -> str:
    headers = [(k, v[:40]) for k, v in rec.headers]
    key = rec.key[:40] if rec.key else rec.key
    size = ""
    if rec.size is not None and rec.size.budget is not None:
        what = wf.BUDGETS[rec.size.budget][0]
        size = f" size={rec.size.budget}{rec.size.delta:+d} ({what}) task={rec.size.task}"
        size += f" dead letter={rec.cut}"
    return (
        f"key={key!r} headers={headers} fields={sorted(rec.fields)} reasons={sorted(rec.reasons)}"
        f"{size}"
    )


# The probe findings, and a cron occurrence whose misfire plan could not be computed.
FINDINGS = [
    *[wf.Spec("exec", partition=0, headers=[("df-attempt", 2**64)]) for _ in range(6)],
    wf.Spec("exec", partition=1, headers=[("df-due", wf.Rel("now", 86_400_000 * 365 * 974))]),
    wf.Spec("exec", partition=1, fields={"timeout_ms": -5_000}),
    wf.Spec("retry", partition=0, tier=500, headers=[("df-due", wf.Rel("bound", 1))]),
    wf.Spec(
        "timer",
        headers=[("df-kind", b"cron"), ("df-sv", 1), ("df-occurrence", -(10**30))],
    ),
    wf.Spec("control", doc={"action": "pause", "at_ms": 2**64}),
]


def _at(role: str, budget: str, delta: int, task: str = wf.TASK, **changes: Any) -> wf.Spec:
    spec = wf.Spec(role, **changes)
    wf.with_size(spec, wf.Size(budget, delta, task=task))
    return spec


# Every budget at its limit and one byte over (the draws reach the rest): records of
# about a megabyte, so once, in one batch. A cron occurrence is fired as a plain job.
CRON = [("df-kind", b"cron"), ("df-sv", 1), ("df-occurrence", 5)]
AT_THE_LIMITS = [
    _at("timer", "timers", 0),
    _at("timer", "timers", 1, partition=1),
    _at("timer", "fire", 0),
    _at("timer", "fire", 1, partition=1),
    _at("timer", "fire", 0, headers=CRON),
    wf.Spec("timer", size=wf.Size("fire", 1, pad=wf.HEAVY_HEADER)),
    _at("exec", "exec", 0),
    _at("exec", "exec", 1, partition=1),
    _at("exec", "retry-fit", 0, wf.DOOMED),
    _at("exec", "retry-fit", 1, wf.DOOMED, partition=1),
    _at("exec", "dead-letter", 0, wf.PERMANENT),
    _at("retry", "retry", 0, tier=wf.TIERS[1]),
    _at("retry", "retry", 1),
    _at("retry", "retry-fit", 1, wf.DOOMED, partition=1),
    _at("retry", "dead-letter", 1, wf.DOOMED),
]


def _check_limits(s: Settings) -> None:
    """The topics have the limits the oracle counts with (tests/support/wire_sizes.py),
    under the names it gives them."""
    n = names(s)
    place = wf.Place(s.topic_prefix)
    assert (place.timers, place.exec) == (n.timers, n.exec(wf.QUEUE))
    assert [place.retry(t) for t in wf.TIERS] == [n.retry(wf.QUEUE, t) for t in wf.TIERS]
    want = {
        n.timers: ws.TOPIC_MAX_BYTES,
        n.exec(wf.QUEUE): ws.TOPIC_MAX_BYTES,
        **{n.retry(wf.QUEUE, t): ws.TOPIC_MAX_BYTES for t in wf.TIERS},
        n.dlq(wf.QUEUE): ws.SET_ASIDE_MAX_BYTES,
        n.quarantine: ws.SET_ASIDE_MAX_BYTES,
    }
    admin = make_admin(s)  # kept until the answers are in
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in want])
    got = {res.name: int(f.result(30)["max.message.bytes"].value) for res, f in futures.items()}
    assert got == want


@pytest.mark.timeout(300 + 5 * BOUNDARY_EXAMPLES)
def test_the_wire_at_its_boundaries(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> None:
    queue = {"name": wf.QUEUE, "partitions": wf.EXEC_PARTITIONS, "retry_tiers_ms": list(wf.TIERS)}
    s = kafka.settings(prefix, queues=[queue], wheel=SMALL_WHEEL, emitter=FAST_EMITTER)
    ensure_topics(s)
    _check_limits(s)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    emitter = EmitterSubprocess(s, tmp_path / "emitter.log").start()
    worker = WorkerProcess(
        s,
        tmp_path / "worker.log",
        app="tests.chaos.handlers",
        queues=wf.QUEUE,
        env={
            "DUEFLOW_CHAOS_LEDGER": str(ledger.path),
            "DUEFLOW_WORKER_MAX_CLOCK_SKEW_MS": str(wf.SKEW),
            "DUEFLOW_WORKER_CONCURRENCY": "4",  # a slot taken for ever shows at once
        },
    )
    wire = Wire(s, ledger)
    batches = 0
    tally: Counter[tuple[str, str]] = Counter()
    sizes: Counter[tuple[str, int, str]] = Counter()
    slowest: list[tuple[float, int]] = []  # seconds, records
    try:
        wait_for("the emitter", lambda: emitter.active_count() >= 1, 60)
        warm = Batch(wire, [])  # the worker has joined and runs jobs
        wait_for("the first jobs", lambda: not warm.pending(), 90)

        @fuzz_settings(BOUNDARY_EXAMPLES)
        @given(st.lists(wf.role_specs(), min_size=1, max_size=8))
        @example(FINDINGS)
        @example(AT_THE_LIMITS)
        def batch_meets_its_fates(specs: list[wf.Spec]) -> None:
            nonlocal batches
            batches += 1
            started = time.monotonic()
            batch = Batch(wire, specs)
            left: list[str] = []

            def done() -> bool:
                left[:] = batch.pending()
                return not left

            with contextlib.suppress(AssertionError):
                wait_for("the batch", done, WAIT_S)
            assert not left, left[:5]
            batch.check()
            tally.update((rec.role, rec.fate) for rec, _ in batch.records)
            sizes.update(
                (rec.size.budget, rec.size.delta, rec.fate)
                for rec, _ in batch.records
                if rec.size is not None and rec.size.budget is not None
            )
            assert worker.alive(), "the worker died"
            assert emitter.alive(), "the emitter died"
            slowest.append((round(time.monotonic() - started, 1), len(specs)))

        batch_meets_its_fates()
        print(f"{batches} batches, records by role and fate: {sorted(tally.items())}")
        print(f"near a size budget, by budget, bytes over, fate: {sorted(sizes.items())}")
        print(f"slowest batches (seconds, records): {sorted(slowest, reverse=True)[:5]}")
        assert batches >= min(BOUNDARY_EXAMPLES, 5)
        for name, text in (("worker", worker.text()), ("emitter", emitter.log_path.read_text())):
            assert "Traceback" not in text, f"the {name} logged a traceback"
    finally:
        wire.close()
        worker.stop()
        emitter.stop()
