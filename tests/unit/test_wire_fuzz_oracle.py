"""The wire fuzzer's oracle (tests/support/wire_fuzz.py) agrees with the code, without a broker.

The fuzzer of tests/integration/test_wire_fuzz.py judges what the pipeline did
by fates it computes from the documented ranges; here the same specs go
through the emitter's and the worker's own checks (``classify_timer``,
``prepare``, ``decode_control``, the schedule and queue readers), so a
disagreement shows in a second, not after a broker run.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow import reasons
from dueflow.config import load_settings
from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.feeds import Delivery, PartitionFeed, WireLimits, prepare
from dueflow.consumers.store import MemoryKeyStore
from dueflow.errors import DueflowError, UndecodableRecord
from dueflow.reasons import reason_label
from dueflow.records import codec
from dueflow.records.pause_command import decode_control
from dueflow.records.queue_registry import decode_queue
from dueflow.records.record_size import record_size
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES
from dueflow.rules.cron_schedule import CronSchedule
from dueflow.rules.drain import classify_timer
from dueflow.streams.emitter.limits import EmitterLimits
from dueflow.testing.log import MemoryRecord
from tests.support import wire_fuzz as wf

NOW = 1_800_000_000_000


@task(wf.TASK, queue=wf.QUEUE, timeout=60)
def chaos_ok(payload: Any, ctx: TaskContext) -> None:
    return None


REGISTRY = TaskRegistry([chaos_ok])
LIMITS = WireLimits(skew_ms=wf.SKEW, tiers_ms=wf.TIERS)


def worker_verdict(rec: wf.Record, headers: list[tuple[str, bytes]], now: int) -> tuple[str, Any]:
    tier = None if rec.topic_role == "exec" or rec.role == "timer" else rec.tier
    feed = PartitionFeed("p.exec.chaos", rec.partition, tier, MemoryKeyStore(10**9))
    msg = MemoryRecord("t", rec.partition, 5, rec.key, rec.value, headers, now)
    d = Delivery(feed, msg, 5)
    prepare(d, REGISTRY, now_ms=now, limits=LIMITS)
    if d.bad is not None:
        return "dlq", d.bad
    if d.attempt == 1 and d.expires is not None and now > d.expires:
        return "expired", None
    return "run", d.not_before


def test_the_base_records_run() -> None:
    for role in ("exec", "retry", "timer"):
        rec = wf.materialize(wf.Spec(role), now=NOW, tok="0123456789ab")
        assert rec.fate == "run", role


def test_the_raw_job_writer_is_avro() -> None:
    f = wf.base_job("0123456789ab", due_ms=NOW, created_ms=NOW)
    assert codec.decode("job", wf.job_value(f))["job_id"] == "0123456789ab-job"


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=wf.role_specs(), lag=st.integers(0, 1_000))
def test_the_oracle_agrees_with_the_code(spec: wf.Spec, lag: int) -> None:
    rec = wf.materialize(spec, now=NOW, tok="0123456789ab")
    if rec.fate == "refused":
        assert record_size(rec.key, rec.value, rec.headers) > DEFAULT_MAX_MESSAGE_BYTES
        return
    if rec.sizing is not None and rec.sizing.task != wf.TASK:
        return  # a failing task near a budget: tests/unit/test_wire_fuzz_sizes.py
    if reasons.RECORD_TOO_LARGE in rec.reasons:
        assert rec.key is not None
        assert classify_timer(rec.headers, rec.key, {b"chaos": "p.exec.chaos"}, {b"chaos": 2})
        exec_headers = hdr.fired(list(rec.headers), fired_at=b"1" * 13, source=b"p.timers:0:5")
        limits = EmitterLimits(load_settings(env={}), read=lambda topics: {})
        too_large = limits.too_large("p.exec.chaos", rec.key, rec.value, exec_headers, what="x")
        assert too_large is not None
        return
    if rec.role == "timer":
        found = classify_timer(rec.headers, rec.key, {b"chaos": "p.exec.chaos"}, {b"chaos": 2})
        if isinstance(found, str):
            assert rec.fate == "quarantine", (found, rec)
            assert reason_label(found) in rec.reasons, (found, rec)
            return
        assert rec.fate != "quarantine", rec
        due = found[0]
        if rec.fate == "parked":
            assert due > NOW + 86_400_000
            return
        fired = max(due, NOW) + lag
        headers = [*rec.headers, ("df-fired", str(fired).encode())]
        _compare(rec, worker_verdict(rec, headers, fired))
        return
    if rec.role in ("exec", "retry"):
        _compare(rec, worker_verdict(rec, rec.headers, NOW + lag))
        return
    if rec.role == "control":
        try:
            decode_control(rec.key, rec.value)
        except UndecodableRecord:
            assert rec.fate == "quarantine", rec
            return
        assert rec.fate == "accepted", rec
        return
    assert rec.doc is not None
    if rec.role == "schedule":
        try:
            doc = codec.decode("schedule", codec.encode("schedule", rec.doc))
            CronSchedule.from_record(doc)
        except (DueflowError, OverflowError, ValueError, TypeError):
            return  # undecodable schedule
        return  # valid: an unknown queue
    try:
        value = codec.encode("queue", rec.doc)
    except (OverflowError, ValueError, TypeError):
        return
    try:
        decode_queue(rec.key, value, [("df-schema", codec.schema_header("queue"))])
    except UndecodableRecord:
        return
    raise AssertionError(f"a valid queue registry record was drawn: {rec.doc}")


def _compare(rec: wf.Record, verdict: tuple[str, Any]) -> None:
    kind, detail = verdict
    if rec.fate == "either":
        # out of range, or in range: it runs, unless it is a first attempt whose
        # df-expires has passed (then it expires instead)
        assert kind in ("run", "dlq", "expired"), (verdict, rec)
        if kind == "expired":
            expires = [v for k, v in rec.headers if k == "df-expires"]
            assert expires, (verdict, rec)
            assert int(expires[-1]) < NOW, (verdict, rec)
        return
    assert kind == rec.fate, (verdict, rec)
    if kind == "dlq":
        reason, failure = detail
        assert reason in rec.reasons, (verdict, rec)
        if rec.fields:
            assert failure.message.split(": ", 1)[0] in rec.fields, (failure.message, rec)
    elif kind == "run":
        assert detail == rec.not_before, (verdict, rec)


def test_a_control_document_is_json() -> None:
    rec = wf.materialize(wf.Spec("control", doc={"action": "pause"}), now=NOW, tok="t")
    assert rec.value is not None
    assert orjson.loads(rec.value) == {"action": "pause"}
    assert rec.fate == "accepted"
