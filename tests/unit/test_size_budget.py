"""The size budget: its bounds hold the records every hop really writes, its fast
limit never lets a job through that some hop could not write, and a refusal names
the hop, the topic and the payload that fits."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.apps.ops.redrive import redrive_headers
from dueflow.apps.ops.replay import replay_headers
from dueflow.config import QueueSpec, load_settings
from dueflow.consumers.failures import Failure
from dueflow.consumers.outputs import dead_letter_fields, dead_letter_headers, retry_headers
from dueflow.errors import InvalidInput
from dueflow.kafka.topic_limits import default_limits_of
from dueflow.kafka.topics import TopicNames
from dueflow.model import Job
from dueflow.records import codec
from dueflow.records.record_size import header_bytes, producer_size, record_size
from dueflow.records.size_budget import (
    BY_MAX_CHARS,
    DEAD_LETTER_TEXT_RESERVE,
    VALUE_REF,
    JobBudget,
    JobShape,
    QueueLimits,
    RecordTooLarge,
    TopicLimit,
    header_allowance,
    job_shape,
)
from dueflow.records.timer_record import TimerPlacer, retry_timer, timer_record
from dueflow.streams.emitter.quarantine_records import quarantine_record

SETTINGS = load_settings(env={}, overrides={"queues": "default"})
PLACER = TimerPlacer(SETTINGS.wheel)
NOW = 1_800_000_000_000
PREFIX = "p" * 100  # the longest prefix: the longest topic names
QUEUE = "q" * 100
SPEC = QueueSpec(QUEUE, retry_tiers_ms=(1_000, 86_400_000))
LIMITS = default_limits_of(TopicNames(PREFIX), SPEC)
BUDGET = JobBudget(LIMITS)
BIG_MS = 99_999_999_999_999  # 14 digits
TRACE = [
    (hdr.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    (hdr.TRACESTATE, b"v=" + b"x" * 510),
]
LINK = (hdr.TRACE_LINK, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203332-01")


def _limits(**changes: int) -> QueueLimits:
    """LIMITS with some topics' max.message.bytes (``exec=``, ``dlq=``, ...) changed."""
    out = LIMITS
    for name, max_bytes in changes.items():
        if name == "producer":
            out = dataclasses.replace(out, producer_max_bytes=max_bytes)
        elif name == "retry":
            out = dataclasses.replace(out, retries=(TopicLimit(out.retries[0].topic, max_bytes),))
        else:
            topic = getattr(out, name)
            changed: dict[str, Any] = {name: TopicLimit(topic.topic, max_bytes)}
            out = dataclasses.replace(out, **changed)
    return out


def test_the_allowance_is_the_headers_every_hop_adds_at_their_longest() -> None:
    longest = max(len(t.topic) for t in LIMITS.topics)  # topic:partition:offset below
    by = "€" * BY_MAX_CHARS
    added = [
        (hdr.FIRED, b"9" * 15),
        (hdr.SOURCE, b"t" * (longest + 31)),
        (hdr.ATTEMPT, b"2147483647"),
        (hdr.DUE, b"9" * 15),
        (hdr.FIRST_FAILURE, b"9" * 15),
        (hdr.LAST_FAILURE, b"9" * 15),
        (hdr.ERROR, "€".encode() * 200),
        (hdr.ORIGIN, b"t" * (longest + 31)),
        (hdr.PARTITION, b"2147483647"),
        (hdr.REDRIVEN_BY, by.encode()),
        (hdr.REDRIVEN_AT, b"9" * 15),
        (hdr.REDRIVEN_FROM, b"t" * (longest + 31)),
        (hdr.REPLAYED_FROM, b"t" * (longest + 31)),
        (hdr.REPLAYED_BY, by.encode()),
        (hdr.REPLAYED_AT, b"9" * 15),
        *TRACE,
        LINK,
    ]
    allowance = header_allowance(LIMITS)
    assert allowance.size >= header_bytes(added)
    assert allowance.size - header_bytes(added) < 1_500  # df-error, --by: 4 bytes a character
    assert allowance.entries == len(added)


def _job(payload: bytes, job_id: str, *, traced: bool) -> tuple[Job, bytes, bytes, list[Any]]:
    job = Job(
        job_id=job_id,
        queue=QUEUE,
        task="t" * 200,
        payload=payload,
        due_ms=NOW + 60_000,
        idempotency_key=job_id,
        created_ms=NOW,
    )
    extra = [*TRACE, (hdr.EXPIRES, b"9" * 15), (hdr.PARENT, job_id.encode())] if traced else []
    rec = timer_record(job, now_ms=NOW, placer=PLACER, trace_headers=extra)
    return job, rec.key, rec.value, list(rec.headers)


def _every_hop(key: bytes, value: bytes, timer: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """The records each hop writes of the job, with the longest values those hops write."""
    n = TopicNames(PREFIX)
    _exec_topic, retry_topic = n.exec(QUEUE), n.retry(QUEUE, 86_400_000)
    fired = hdr.fired(
        list(timer), fired_at=str(BIG_MS).encode(), source=f"{n.timers}:4095:{2**62}".encode()
    )
    failure = Failure("x" * 300, "€" * 2_000, "tb\n" * 5_000)
    retried = retry_headers(
        fired,
        attempt=2**31 - 1,
        due_ms=BIG_MS,
        first_failure_ms=BIG_MS,
        failed_ms=BIG_MS,
        failure=failure,
        origin=f"{retry_topic}:4095:{2**62}",
        trace=[LINK],
    )
    wheel = retry_timer(
        key=key,
        value=value,
        headers=retried,
        queue=QUEUE,
        exec_partition=2**31 - 1,
        due_ms=BIG_MS,
        now_ms=NOW,
        placer=PLACER,
    )
    fired_again = hdr.fired(
        list(wheel.headers), fired_at=str(BIG_MS).encode(), source=f"{n.timers}:1:{2**62}".encode()
    )
    redriven = redrive_headers(
        dict(hdr.replace(fired_again, [])),
        by="€" * BY_MAX_CHARS,
        at_ms=BIG_MS,
        source=f"{n.dlq(QUEUE)}:4095:{2**62}",
    )
    replayed = replay_headers(
        hdr.replace(redriven, [(hdr.ATTEMPT, 2**31 - 1), (hdr.ERROR, "€".encode() * 200)]),
        source=f"{retry_topic}:4095:{2**62}",
        by="€" * BY_MAX_CHARS,
        at_ms=BIG_MS,
    )
    short = Failure("E" * 100, "m" * 500, "t" * (DEAD_LETTER_TEXT_RESERVE - 700))
    dead = codec.encode(
        "dead_letter",
        dead_letter_fields(
            job_id=key.decode(),
            queue=QUEUE,
            task="t" * 200,
            idempotency_key=key.decode(),
            reason="exhausted",
            failure=short,
            attempts=2**31 - 1,
            first_failure_ms=BIG_MS,
            last_failure_ms=BIG_MS,
            dead_ms=BIG_MS,
            origin=(retry_topic, 2**31 - 1, 2**62),
            trace_id="f" * 32,
            value=value,
            headers=dict(replayed),
        ),
    )
    dead_headers = hdr.replace(
        dead_letter_headers(replayed, failure=short, attempts=2**31 - 1),
        [(VALUE_REF, f"{retry_topic}:4095:{2**62}")],
    )
    quarantined = quarantine_record(
        reason="record too large: " + "r" * 400,
        topic=n.timers,
        partition=2**31 - 1,
        offset=2**62,
        key=key,
        value=value,
        headers=wheel.headers,
        at_ms=BIG_MS,
    )
    return {
        "timer record": [(key, value, timer)],
        "exec record": [(key, value, fired), (key, value, fired_again), (key, value, redriven)],
        "retry record": [(key, value, retried), (key, value, replayed)],
        "retry timer": [(key, value, wheel.headers)],
        "dead-letter record": [(key, dead, dead_headers)],
        "quarantine record": [(quarantined.key, quarantined.value, quarantined.headers)],
    }


@given(
    payload=st.integers(min_value=0, max_value=300_000),
    job_id=st.text(alphabet=st.sampled_from(["a", "é", "€", "😀"]), min_size=1, max_size=255),
    traced=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_the_bound_of_each_hop_holds_the_record_it_writes(
    payload: int, job_id: str, traced: bool
) -> None:
    _, key, value, timer = _job(b"x" * payload, job_id, traced=traced)
    shape = job_shape(key, value, timer, payload=payload)
    bounds = {h.hop: h for h in BUDGET.hops(shape)}
    for hop, records in _every_hop(key, value, timer).items():
        bound = bounds[hop]
        for k, v, h in records:
            assert record_size(k, v, h) <= bound.size, hop
            assert producer_size(k, v, h) <= bound.producer_size, hop
    assert bounds["timer record"].size == record_size(key, value, timer)


@given(
    payload=st.integers(min_value=0, max_value=1_100_000),
    id_chars=st.integers(min_value=1, max_value=255),
    wide=st.sampled_from(["a", "é", "€", "😀"]),
    traced=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_a_job_within_the_fast_limit_fits_every_hop(
    payload: int, id_chars: int, wide: str, traced: bool
) -> None:
    """The hot path's one comparison never lets through what a hop could not write."""
    _, key, value, timer = _job(b"x" * payload, wide * id_chars, traced=traced)
    shape = job_shape(key, value, timer, payload=payload)
    if record_size(key, value, timer) <= BUDGET.fast_limit:
        assert BUDGET.overflow(shape) is None


def test_the_fast_limit_is_close_to_what_fits() -> None:
    """A plain job with a UUID: the fast limit costs it little payload."""
    shape = JobShape(32, 0, 120, 6, 32, 9, 0)
    most = BUDGET.max_payload(shape._replace(value=200).with_payload(0))
    assert 0 < LIMITS.exec.max_bytes - most < 6_000
    assert LIMITS.exec.max_bytes - BUDGET.fast_limit < 6_000


@pytest.mark.parametrize(
    ("changes", "hop", "topic"),
    [
        ({"timers": 200_000}, "retry timer", LIMITS.timers.topic),
        ({"exec": 200_000}, "exec record", LIMITS.exec.topic),
        ({"retry": 200_000}, "retry record", LIMITS.retries[0].topic),
        ({"dlq": 200_000}, "dead-letter record", LIMITS.dlq.topic),
        ({"quarantine": 200_000}, "quarantine record", LIMITS.quarantine.topic),
        ({"producer": 200_000}, "dead-letter record", "dueflow's producers"),
    ],
)
def test_a_refusal_names_the_hop_the_topic_and_what_fits(
    changes: dict[str, int], hop: str, topic: str
) -> None:
    budget = JobBudget(_limits(**changes))
    _, key, value, timer = _job(b"x" * 300_000, "job-1", traced=False)
    shape = job_shape(key, value, timer, payload=300_000)
    err = budget.refusal(shape)
    assert isinstance(err, RecordTooLarge)
    assert isinstance(err, InvalidInput)
    assert err.field == "payload"
    assert err.overflow.hop == hop
    text = str(err)
    assert text.startswith(f"payload: got 300000 bytes: the {hop} would be {err.overflow.size} ")
    if topic == "dueflow's producers":
        assert "over their message.max.bytes 200000" in text
    else:
        assert f"over max.message.bytes 200000 of {topic}" in text
    fits = err.max_payload
    assert text.endswith(f"; accepted: at most {fits} bytes of payload")
    assert budget.overflow(shape.with_payload(fits)) is None
    assert budget.overflow(shape.with_payload(fits + 1)) is not None


def test_no_payload_fits_when_the_rest_of_the_job_does_not() -> None:
    budget = JobBudget(_limits(exec=2_000))
    _, key, value, timer = _job(b"x" * 10, "j" * 255, traced=True)
    err = budget.refusal(job_shape(key, value, timer, payload=10))
    assert err is not None
    assert err.max_payload == -1
    assert "no payload fits" in str(err)
