"""The scheduling client against the real broker."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import ConflictError, InvalidInput, KafkaOperationError
from dueflow.kafka.clients import make_admin, producer_config
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.producers.scheduler import Scheduler
from dueflow.records import codec
from dueflow.records.job_request import JobRequest
from dueflow.records.timer_record import spread_of
from dueflow.rules.wheel import place_timer
from dueflow.timeutil import from_utc_ms
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, high_watermarks, read_all
from tests.integration.worker_support import decode_outcome
from tests.support.emitters import ensure_topics

# A small wheel: 2 near partitions and 2 levels of 10 slots (22 partitions).
WHEEL = {
    "levels": "10x1000,10x5000",
    "near_partitions": 2,
    "near_window_ms": 1500,
    "lookahead_ms": 200,
}


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, wheel=WHEEL, queues="default:3,billing:2")
    ensure_topics(s)
    return s


class FixedClock:
    """A clock the test moves; starts at the real time so records look real."""

    def __init__(self) -> None:
        self.now_ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def scheduler(settings: Settings, clock: FixedClock) -> Iterator[Scheduler]:
    with Scheduler(settings, clock=clock, metrics=Metrics(), delivery_timeout_s=10) as s:
        yield s


def timers(settings: Settings) -> list[Any]:
    return read_all(settings, names(settings).timers)


def test_scheduled_job_lands_in_its_wheel_partition_with_headers(
    settings: Settings, scheduler: Scheduler, clock: FixedClock
) -> None:
    result = scheduler.schedule(
        "send_email",
        {"to": "a@example.com"},
        delay="20s",
        queue="billing",
        job_id="job-1",
        idempotency_key="welcome:a@example.com",
        max_attempts=3,
        backoff="fixed:500:5000",
        timeout="30s",
        labels={"tenant": "acme"},
    )
    assert result.job_id == "job-1"
    assert result.due_ms == clock.now_ms + 20_000
    assert result.due == from_utc_ms(clock.now_ms + 20_000)
    assert result.due.utcoffset() == timedelta(0)
    assert not result.duplicate

    (msg,) = timers(settings)
    expected = place_timer(
        due_ms=result.due_ms,
        now_ms=clock.now_ms,
        geometry=settings.wheel,
        spread=spread_of(b"welcome:a@example.com"),
    )
    assert expected.level == 1  # 20 s is beyond level 0's reach of 8.8 s
    assert msg.partition() == expected.partition == result.partition
    assert msg.key() == b"welcome:a@example.com"
    h = msg.headers()
    assert hdr.header_int(h, hdr.DUE) == result.due_ms
    assert hdr.header_text(h, hdr.QUEUE) == "billing"
    assert hdr.header_text(h, hdr.KIND) == "job"
    assert hdr.header_text(h, hdr.JOB_ID) == "job-1"
    assert hdr.header_text(h, hdr.TASK) == "send_email"
    assert hdr.header(h, hdr.SCHEMA) == b"dueflow.Job/1"
    assert hdr.header(h, hdr.TRACEPARENT) is None  # tracing is off
    value = codec.decode("job", msg.value() or b"")
    assert value["job_id"] == "job-1"
    assert value["due_ms"] == result.due_ms
    assert value["payload"] == b'{"to":"a@example.com"}'
    assert value["max_attempts"] == 3
    assert value["backoff"]["kind"] == "fixed"
    assert value["timeout_ms"] == 30_000
    assert value["labels"] == {"tenant": "acme"}
    assert value["content_hash"] == result.content_hash


@pytest.mark.parametrize("when", ["now", "past", "near"])
def test_due_now_or_past_goes_to_a_near_partition(
    settings: Settings, scheduler: Scheduler, clock: FixedClock, when: str
) -> None:
    cases: dict[str, dict[str, Any]] = {
        "now": {},
        "past": {"run_at": from_utc_ms(clock.now_ms - 3_600_000)},
        "near": {"delay": "1s"},
    }
    kwargs = cases[when]
    result = scheduler.schedule("t", **kwargs)
    assert result.partition < settings.wheel.near_partitions
    (msg,) = timers(settings)
    assert msg.partition() == result.partition


def test_run_at_in_another_zone_is_stored_as_utc(settings: Settings, scheduler: Scheduler) -> None:
    result = scheduler.schedule("t", run_at="2031-03-30T02:30:00+02:00")
    assert result.due_ms == int(datetime(2031, 3, 30, 0, 30, tzinfo=UTC).timestamp() * 1000)
    assert result.due.isoformat() == "2031-03-30T00:30:00+00:00"


def test_schedule_many_20k_all_acknowledged_and_all_in_the_topic(
    settings: Settings, scheduler: Scheduler
) -> None:
    n = 20_000
    jobs = (
        JobRequest("send_email", {"n": i}, delay=i % 600, queue="billing" if i % 2 else "default")
        for i in range(n)
    )
    result = scheduler.schedule_many(jobs)
    assert result.ok, result.errors[:3]
    assert (result.total, result.scheduled, result.duplicates) == (n, n, 0)
    assert len(set(result.job_ids)) == n
    assert sum(high_watermarks(settings, [names(settings).timers]).values()) == n
    written = {m.key() for m in timers(settings)}
    assert written == {str(j).encode() for j in result.job_ids}
    metrics = scheduler.metrics
    assert metrics is not None
    assert metrics.schedules_produced.labels("billing")._value.get() == n // 2


def test_schedule_many_reports_errors_per_job_and_writes_the_rest(
    settings: Settings, scheduler: Scheduler
) -> None:
    scheduler.schedule("t", {"a": 1}, job_id="taken")
    jobs: list[Any] = [
        {"task": "t", "payload": 1},
        {"task": "t", "delay": "-5s"},
        JobRequest("t", queue="nope"),
        {"task": "t", "payload": 2},
        {"task": "t", "job_id": "taken", "payload": {"a": 2}},  # conflict
        {"task": "t", "job_id": "taken", "payload": {"a": 1}},  # idempotent repeat
        {"task": "t", "max_attempts": 0},
        {"tsak": "t"},
        {"task": "t", "payload": 3, "job_id": "dup-in-batch"},
        {"task": "t", "payload": 3, "job_id": "dup-in-batch"},
    ]
    result = scheduler.schedule_many(jobs)
    assert (result.total, result.scheduled, result.duplicates, result.failed) == (10, 3, 2, 5)
    assert [(e.index, e.field) for e in result.errors] == [
        (1, "delay"),
        (2, "queue"),
        (4, None),
        (6, "max_attempts"),
        (7, "jobs[7].tsak"),
    ]
    assert isinstance(result.errors[2].error, ConflictError)
    assert result.errors[2].job_id == "taken"
    assert [i is None for i in result.job_ids] == [
        False,
        True,
        True,
        False,
        True,
        False,
        True,
        True,
        False,
        False,
    ]
    assert result.job_ids[5] == "taken"
    assert result.job_ids[8] == result.job_ids[9] == "dup-in-batch"
    assert len(timers(settings)) == 1 + 3


def edge_jobs() -> list[Any]:
    """A bulk call with bad jobs at the limits between good ones (see
    tests/unit/test_input_limits.py for every limit)."""
    return [
        {"task": "t", "payload": {"i": 0}, "job_id": "good-0"},
        {"task": "t", "payload": {"i": 1}, "job_id": "long", "delay": 2**62},  # > an Avro long
        {"task": "t", "payload": {"i": 2}, "job_id": "good-2", "delay": "20s"},
        {"task": "t", "payload": {"i": 3, "x": float("nan")}, "job_id": "nan"},
        {"task": "send email", "payload": {"i": 4}, "job_id": "space"},  # no worker takes it
        {"task": "t", "payload": {"i": 5}, "job_id": "tmo", "timeout": 2**64, "jitter": "1s"},
        {"task": "t", "payload": {"i": 6}, "job_id": "good-6", "delay": "2d"},
    ]


def check_edge_result(settings: Settings, result: Any) -> None:
    assert (result.total, result.scheduled, result.failed) == (7, 3, 4)
    assert [(str(e.job_id), e.field) for e in result.errors] == [
        ("long", "delay"),
        ("nan", "payload['x']"),
        ("space", "task"),
        ("tmo", "timeout"),
    ]
    first = str(result.errors[0])
    assert first.startswith("jobs[1] (job id 'long'): delay: got 4611686018427387904"), first
    # every good job and no bad one is in the timer topic, each record whole
    written = {m.key(): codec.decode("job", m.value()) for m in timers(settings)}
    assert sorted(written) == [b"good-0", b"good-2", b"good-6"]
    assert [written[k]["payload"] for k in sorted(written)] == [
        b'{"i":0}',
        b'{"i":2}',
        b'{"i":6}',
    ]


def test_schedule_many_refuses_bad_jobs_at_the_limits_and_writes_the_good_ones(
    settings: Settings, scheduler: Scheduler
) -> None:
    # Before: the overflowing delay raised a plain ValueError out of the call after
    # job 0 was written, and the NaN payload was written as {"i":3,"x":null}.
    check_edge_result(settings, scheduler.schedule_many(edge_jobs()))


def bad_inputs(clock: FixedClock) -> list[tuple[dict[str, Any], str, str]]:
    return [
        ({"run_at": datetime(2031, 1, 1, 9)}, "run_at", "naive datetimes are rejected"),
        ({"run_at": "2031-01-01T09:00:00"}, "run_at", "has no offset"),
        (
            {"queue": "reports"},
            "queue",
            "one of the queues ['billing', 'default']; to create 'reports'",
        ),
        ({"delay": "-30s"}, "delay", "must not be negative"),
        ({"max_attempts": 0}, "max_attempts", "an integer from 1"),
        ({"backoff": "linear"}, "backoff", "exponential, fixed or none"),
        ({"payload": object()}, "payload", "JSON-serializable"),
        ({"payload": b"x" * 1_100_000}, "payload", "over max.message.bytes 1048588 of"),
        ({"jitter": "soon"}, "jitter", "'30s'"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_bad_input_is_refused_and_nothing_is_written(
    settings: Settings, scheduler: Scheduler, clock: FixedClock, case: int
) -> None:
    kwargs, field, fragment = bad_inputs(clock)[case]
    before = high_watermarks(settings, [names(settings).timers])
    with pytest.raises(InvalidInput) as info:
        scheduler.schedule("send_email", **kwargs)
    assert info.value.field == field
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{field}: got ")
    assert high_watermarks(settings, [names(settings).timers]) == before
    metrics = scheduler.metrics
    assert metrics is not None
    queue = kwargs.get("queue", "default")
    label = queue if queue in settings.queue_names else "unknown"
    assert metrics.schedule_errors.labels(label)._value.get() == 1


def set_topic_config(settings: Settings, topic: str, key: str, value: str) -> None:
    """Change one topic config and wait until the broker reports it."""
    admin = make_admin(settings)
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (fut,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        if fut.result()[key].value == value:
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} {key} did not become {value}")


def test_payload_limit_is_the_timer_topics_max_message_bytes(
    settings: Settings, clock: FixedClock
) -> None:
    topic = names(settings).timers
    set_topic_config(settings, topic, "max.message.bytes", "20000")
    with Scheduler(settings, clock=clock) as s:
        ok = s.schedule("t", b"x" * 12_000)
        before = high_watermarks(settings, [topic])
        with pytest.raises(InvalidInput) as info:
            s.schedule("t", b"x" * 20_000)
        assert info.value.field == "payload"
        assert str(info.value).startswith("payload: got 20000 bytes: the ")
        assert f"over max.message.bytes 20000 of {topic}" in str(info.value)
        assert high_watermarks(settings, [topic]) == before
    assert [m.key() for m in timers(settings)] == [ok.job_id.encode()]


def test_job_id_reuse_same_payload_is_idempotent_other_payload_conflicts(
    settings: Settings, scheduler: Scheduler, clock: FixedClock
) -> None:
    first = scheduler.schedule("charge", {"amount": 10}, job_id="order-7", delay=60)
    clock.now_ms += 5_000
    again = scheduler.schedule("charge", {"amount": 10}, job_id="order-7", delay=60)
    assert again.duplicate
    assert (again.job_id, again.due_ms, again.partition) == (
        first.job_id,
        first.due_ms,
        first.partition,
    )
    before = high_watermarks(settings, [names(settings).timers])
    with pytest.raises(ConflictError, match="job_id 'order-7' was already scheduled"):
        scheduler.schedule("charge", {"amount": 11}, job_id="order-7", delay=60)
    assert high_watermarks(settings, [names(settings).timers]) == before
    assert len(timers(settings)) == 1


def test_cancel_lands_on_the_partition_of_the_exec_record(
    settings: Settings, scheduler: Scheduler
) -> None:
    n = names(settings)
    keys = [f"order-{i}" for i in range(12)]
    for key in keys:
        scheduler.schedule(
            "charge",
            {"k": key},
            queue="billing",
            job_id=f"job-{key}",
            idempotency_key=key,
            delay=600,
        )
    cancelled = [scheduler.cancel(f"job-{key}") for key in keys]
    assert all(c.known and c.queue == "billing" for c in cancelled)
    # The exec record of a job is produced keyed by its idempotency key with the
    # murmur2 partitioner (as the emitter does): the cancellation must be there.
    exec_partition: dict[str, int] = {}
    plain = Producer(producer_config(settings))

    def remember(err: Any, msg: Any) -> None:
        assert err is None
        exec_partition[msg.key().decode()] = msg.partition()

    for key in keys:
        plain.produce(n.exec("billing"), b"exec", key.encode(), on_delivery=remember)
    assert plain.flush(30) == 0
    assert len(set(exec_partition.values())) > 1  # the keys spread over partitions
    for key, c in zip(keys, cancelled, strict=True):
        assert c.idempotency_key == key
        assert c.partition == exec_partition[key]
    idem = {bytes(m.key() or b"").decode(): m for m in read_all(settings, n.idempotency("billing"))}
    assert set(idem) == set(keys)
    for key in keys:
        rec = codec.decode(
            "idempotency",
            idem[key].value() or b"",
            writer_version=codec.parse_schema_header(
                hdr.header(headers_of(idem[key]), hdr.SCHEMA), expected="idempotency"
            ),
        )
        assert (rec["state"], rec["job_id"]) == ("cancelled", f"job-{key}")
        assert idem[key].partition() == exec_partition[key]
        assert rec["content_hash"]
    decoded = [
        decode_outcome(m.value() or b"", hdr.header(m.headers() or [], hdr.SCHEMA))  # type: ignore[arg-type]
        for m in read_all(settings, n.outcomes)
    ]
    cancels = [o for o in decoded if o["state"] == "cancelled"]
    assert sorted(o["job_id"] for o in cancels) == sorted(f"job-{k}" for k in keys)
    assert {o["state"] for o in decoded} == {"scheduled", "cancelled"}  # and the client's own


def test_cancel_of_a_job_this_client_does_not_know(
    settings: Settings, scheduler: Scheduler
) -> None:
    c = scheduler.cancel("someone-elses-job", queue="default")
    assert (c.known, c.idempotency_key, c.queue) == (False, "someone-elses-job", "default")
    with pytest.raises(InvalidInput) as info:
        scheduler.cancel("x", queue="reports")
    assert info.value.field == "queue"
    scheduler.schedule("t", job_id="in-billing", queue="billing")
    with pytest.raises(InvalidInput, match="the queue job 'in-billing' was scheduled to"):
        scheduler.cancel("in-billing", queue="default")


def test_missing_topics_and_wrong_wheel_are_clear_errors(
    kafka: KafkaCluster, prefix: str, settings: Settings
) -> None:
    with pytest.raises(KafkaOperationError, match="does not exist: create dueflow's topics"):
        Scheduler(kafka.settings(prefix + "x")).start()
    other_wheel = kafka.settings(
        prefix,
        wheel={"near_partitions": 3, **{k: v for k, v in WHEEL.items() if k != "near_partitions"}},
    )
    with pytest.raises(Exception, match="has 22 partitions but the timing wheel"):
        Scheduler(other_wheel).start()


def test_delivery_failures_are_reported_per_job(settings: Settings, clock: FixedClock) -> None:
    topic = names(settings).timers
    with Scheduler(settings, clock=clock, delivery_timeout_s=10) as s:
        assert s.schedule_many([JobRequest("t", "small", job_id="fine")]).scheduled == 1
        # The broker now refuses what the client was told it accepts.
        set_topic_config(settings, topic, "max.message.bytes", "1000")
        jobs = [JobRequest("t", os.urandom(3_000), job_id=f"j{i}") for i in range(5)]
        result = s.schedule_many([JobRequest("t", "small", job_id="fine"), *jobs])
        assert (result.scheduled, result.duplicates) == (0, 1)
        assert [e.index for e in result.errors] == [1, 2, 3, 4, 5]
        assert [e.job_id for e in result.errors] == [f"j{i}" for i in range(5)]
        assert all(isinstance(e.error, KafkaOperationError) for e in result.errors)
        assert "too large" in result.errors[0].error.message.lower()
        assert result.job_ids == ["fine"] + [None] * 5
        with pytest.raises(KafkaOperationError, match="scheduling job 'single'"):
            s.schedule("t", os.urandom(3_000), job_id="single")
        # a failed job is forgotten: it can be scheduled again later
        assert s.planner.recent.get("j0") is None
        assert s.planner.recent.get("single") is None
    assert [m.key() for m in timers(settings)] == [b"fine"]


def test_trace_context_travels_in_headers_and_value(settings: Settings, clock: FixedClock) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dueflow.observability import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Scheduler(settings, clock=clock, tracer=tracing.JobTracer(provider)) as scheduler:
        one = scheduler.schedule("send_email", {"to": "a"}, delay=30, job_id="traced-1")
        bulk = scheduler.schedule_many([JobRequest("t", i) for i in range(3)])
        assert bulk.scheduled == 3
        again = scheduler.schedule("send_email", {"to": "a"}, delay=30, job_id="traced-1")
        assert again.duplicate
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [tracing.SCHEDULE] * 5
    attrs = [dict(s.attributes or {}) for s in spans]
    assert attrs[0]["dueflow.job_id"] == "traced-1"
    assert attrs[0]["dueflow.due_ms"] == one.due_ms
    assert [a["dueflow.job_id"] for a in attrs[1:4]] == bulk.job_ids  # ids given before planning
    by_job = {bytes(m.key() or b"").decode(): m for m in timers(settings)}
    assert len(by_job) == 4  # the repeat wrote nothing
    trace_ids = set()
    for span, job_id in zip(spans, [one.job_id, *bulk.job_ids], strict=False):
        msg = by_job[str(job_id)]
        trace_id = tracing.trace_id_of(headers_of(msg))
        assert trace_id == f"{span.context.trace_id:032x}"
        value = codec.decode("job", msg.value() or b"")
        assert value["trace"]["traceparent"] == hdr.header_text(headers_of(msg), hdr.TRACEPARENT)
        trace_ids.add(trace_id)
    assert len(trace_ids) == 4  # one trace per job
