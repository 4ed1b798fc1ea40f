"""schedule_many's ``scheduled`` outcomes.

The bulk planner builds each job's outcome from the pieces its timer record
already has: the bytes must be :func:`encode_scheduled`'s, on every path
(plain, general, traced). :class:`BulkRun` writes them only once the timers
are acknowledged (after a flush), none for a job whose timer was refused or
failed, and in batches of at most ``OUTCOMES_PER_FLUSH`` jobs, so a call's
memory does not grow with its input.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from dueflow import headers as hdr
from dueflow.errors import DueflowError
from dueflow.kafka.topics import names
from dueflow.observability.tracing import JobTracer, trace_id_of
from dueflow.producers import bulk as bulk_module
from dueflow.producers.bulk import BulkRun
from dueflow.producers.bulk_plan import BulkPlanner
from dueflow.producers.outcomes import OutcomeReports
from dueflow.producers.results import Scheduled
from dueflow.records import codec
from dueflow.records.job_request import JobRequest
from dueflow.records.worker_codec import OUTCOME_V1, encode_scheduled
from tests.unit.test_bulk_plan import REQUESTS, counting_bytes, planner
from tests.unit.test_planner import KNOWN, NOW, SETTINGS

OUTCOMES = names(SETTINGS).outcomes


@settings(max_examples=500, deadline=None)
@given(
    reqs=st.lists(REQUESTS, min_size=1, max_size=8),
    now=st.integers(0, 4 * 10**12),
    known=st.booleans(),
)
def test_property_outcomes_are_encode_scheduled(
    reqs: list[JobRequest], now: int, known: bool
) -> None:
    bulk = BulkPlanner(planner(counting_bytes(), rules=KNOWN if known else None), outcomes=True)
    expected = []
    for i, req in enumerate(reqs):
        try:
            got = bulk.plan(req, now + i)
        except DueflowError:
            continue
        if isinstance(got, Scheduled):  # an idempotent repeat: no new outcome
            continue
        job_id, due_ms, queue, task, key, _, _, _, _, chash = got
        value = encode_scheduled(job_id, queue, task, key, due_ms, now + i, None, None)
        expected.append((job_id.encode(), value, chash.encode()))
    assert bulk.outcomes == expected


class AckingProducer:
    """Keeps what is produced; ``flush`` acknowledges it, failing the timers whose
    key is in ``fail`` (their delivery callback gets an error, as librdkafka's)."""

    def __init__(self, *, fail: set[bytes] | None = None, refuse_partition: int = -2) -> None:
        self.fail = fail or set()
        self.refuse_partition = refuse_partition
        self.events: list[tuple[str, Any]] = []
        self.unacked: list[tuple[bytes, bytes, Any]] = []

    def produce(
        self, topic: str, value: bytes, key: bytes, partition: int, callback: Any, *rest: Any
    ) -> None:
        if partition == self.refuse_partition:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.events.append(("produce", (topic, value, key, rest[-1])))
        self.unacked.append((key, value, callback))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        for key, value, callback in self.unacked:
            if key in self.fail:
                callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Msg(value))
        self.unacked = []
        self.events.append(("flush", None))
        return 0

    def outcomes(self) -> list[tuple[bytes, bytes, Any]]:
        return [
            (key, value, headers)
            for kind, args in self.events
            if kind == "produce"
            for topic, value, key, headers in [args]
            if topic == OUTCOMES
        ]


class _Msg:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def run(reqs: list[Any], producer: AckingProducer, *, poll_every: int = 1000, **kw: Any) -> Any:
    return BulkRun(
        planner(counting_bytes()),
        producer,  # type: ignore[arg-type]
        clock=lambda: NOW,
        poll_every=poll_every,
        outcome_reports=OutcomeReports(),
        **kw,
    ).run(reqs, flush_timeout_s=1)


def test_one_outcome_per_written_job_after_its_timer_is_acknowledged() -> None:
    producer = AckingProducer()
    reqs: list[Any] = [JobRequest("t", {"i": i}, delay=i) for i in range(5)]
    reqs.insert(2, {"task": ""})  # refused: no timer, no outcome
    reqs.append(JobRequest("t", {"i": 0}, job_id="mine", labels={"k": "v"}))  # general path
    reqs.append(JobRequest("t", {"i": 0}, job_id="mine", labels={"k": "v"}))  # a repeat
    result = run(reqs, producer)
    assert (result.scheduled, result.duplicates, len(result.errors)) == (6, 1, 1)
    kinds = [kind for kind, args in producer.events if kind == "flush" or args[0] == OUTCOMES]
    assert kinds == ["flush", *["produce"] * 6, "flush"]  # timers acknowledged first
    due = {j: d for j, d in zip(result.job_ids, result.due_ms, strict=True) if j is not None}
    written = producer.outcomes()
    assert [key.decode() for key, _, _ in written] == list(due)
    for key, value, headers in written:
        outcome = codec.decode("outcome", value, writer_version=1)
        assert outcome["job_id"] == key.decode()
        assert (outcome["state"], outcome["attempt"], outcome["at_ms"]) == ("scheduled", 0, NOW)
        assert outcome["due_ms"] == due[key.decode()]
        assert headers[0] == (hdr.SCHEMA, OUTCOME_V1)
        assert headers[1][0] == hdr.CONTENT_HASH
        assert len(headers[1][1]) == 32


def test_no_outcome_for_a_timer_the_broker_refused_or_that_failed() -> None:
    reqs = [JobRequest("t", {"i": i}, job_id=f"j{i}") for i in range(4)]
    producer = AckingProducer(fail={b"j1"})
    result = run(reqs, producer)
    assert result.scheduled == 3
    assert [e.job_id for e in result.errors] == ["j1"]
    assert [key for key, _, _ in producer.outcomes()] == [b"j0", b"j2", b"j3"]

    # refused at produce(): the planner drops the outcome it built
    p = planner(counting_bytes())
    first = BulkPlanner(p).plan(JobRequest("t", {}, job_id="k0", delay=600), NOW)
    assert not isinstance(first, Scheduled)
    producer = AckingProducer(refuse_partition=first[5])
    reqs = [JobRequest("t", {}, job_id="k0", delay=600), JobRequest("t", {}, job_id="k1")]
    result = run(reqs, producer)
    assert [e.job_id for e in result.errors] == ["k0"]
    assert [key for key, _, _ in producer.outcomes()] == [b"k1"]


def test_outcomes_are_written_in_bounded_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_module, "OUTCOMES_PER_FLUSH", 10)
    reqs = [JobRequest("t", {"i": i}, job_id=f"j{i}") for i in range(35)]
    producer = AckingProducer(fail={b"j3", b"j12", b"j34"})
    result = run(reqs, producer, poll_every=5)
    assert result.scheduled == 32
    assert sorted(e.job_id for e in result.errors) == ["j12", "j3", "j34"]
    # a batch is written after the flush that acknowledged its timers
    seen: list[str] = []
    batches: list[list[str]] = [[]]
    for kind, args in producer.events:
        if kind == "flush":
            batches.append([])
        elif args[0] == OUTCOMES:
            batches[-1].append(args[2].decode())
        else:
            seen.append(args[2].decode())
            assert not batches[-1] or batches[-1][-1] in seen
    outcomes = [j for batch in batches for j in batch]
    assert outcomes == [f"j{i}" for i in range(35) if i not in (3, 12, 34)]
    assert max(len(b) for b in batches) <= 10
    assert len([b for b in batches if b]) == 4


def test_a_traced_job_outcome_names_its_trace() -> None:
    producer = AckingProducer()
    tracer = JobTracer(TracerProvider())
    result = run([JobRequest("t", {"i": i}) for i in range(3)], producer, tracer=tracer)
    assert result.scheduled == 3
    timers = {
        args[2]: args[3]
        for kind, args in producer.events
        if kind == "produce" and args[0] != OUTCOMES
    }
    for key, value, _ in producer.outcomes():
        trace_id = trace_id_of(timers[key])
        assert trace_id is not None
        assert codec.decode("outcome", value, writer_version=1)["trace_id"] == trace_id
