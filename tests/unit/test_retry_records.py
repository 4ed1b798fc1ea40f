"""The records a failed attempt writes: a retry tier, or the timer wheel (pure, no broker).

A retry up to the top tier goes to its tier topic; a longer one becomes a job
timer in the timer topic, in the same batch (one transaction) as the
attempt's outcome, placed by the wheel's rule, that the emitter fires into the
job's own exec partition with its attempt, not-before and trace headers.
"""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.consumers import TaskRegistry, task
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import PartitionFeed, WireLimits, prepare
from dueflow.consumers.outputs import KEY_HEADERS
from dueflow.consumers.recorder import BatchRecorder
from dueflow.consumers.store import (
    CANCELLED,
    DEAD,
    DONE,
    MemoryKeyStore,
    is_final,
    retried,
    skips,
    state_of,
)
from dueflow.consumers.testing import exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind
from dueflow.records import codec
from dueflow.records import worker_codec as fast
from dueflow.records.timer_record import TimerPlacer, retry_timer
from dueflow.rules.drain import classify_timer
from dueflow.rules.wheel import place_timer
from tests.support.attempts import NOW, SETTINGS, batch_recorder, job_delivery

N = names(SETTINGS)
TRACE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@task("flaky", queue="jobs")
def flaky(payload: Any, ctx: Any) -> None:
    raise ValueError("no")


def failed_once(backoff: Backoff, *, partition: int = 4, attempt: int = 1) -> BatchRecorder:
    """A recorder after attempt ``attempt`` of a job in exec partition ``partition`` failed."""
    recorder = batch_recorder()
    job = make_job("flaky", {"a": 1}, queue="jobs", key="k1", backoff=backoff, due_ms=NOW - 5)
    headers = [*exec_headers(job, fired_ms=NOW - 4), ("traceparent", TRACE)]
    if attempt > 1:
        headers.append((hdr.ATTEMPT, str(attempt).encode()))
    feed = PartitionFeed(N.exec("jobs"), partition, None, MemoryKeyStore(10**9))
    d = job_delivery(feed, job, headers, 17)
    prepare(d, TaskRegistry([flaky]), now_ms=NOW, limits=WireLimits())
    d.max_attempts = job.max_attempts  # what the runtime sets before it runs the job
    recorder.failed(d, Failure("ValueError", "no"), 0.01, NOW)
    return recorder


FIXED = Backoff(BackoffKind.FIXED, base_ms=500, max_ms=60_000, jitter=False)
LONG = Backoff(BackoffKind.FIXED, base_ms=30_000, max_ms=60_000, jitter=False)


@pytest.mark.parametrize(("backoff", "topic"), [(FIXED, N.retry("jobs", 500)), (LONG, N.timers)])
def test_the_retry_goes_to_its_tier_or_to_the_wheel(backoff: Backoff, topic: str) -> None:
    recorder = failed_once(backoff)
    records = recorder.records
    # one batch, one transaction: the retry, the key handed on, the outcome
    assert [r[1] for r in records] == [topic, N.idempotency("jobs"), N.outcomes]
    (_, _, partition, key, value, headers) = records[1]
    assert (partition, key, headers) == (4, b"k1", KEY_HEADERS)
    assert fast.decode_key_state(value, KEY_HEADERS[0][1]) == ("retrying", NOW, 1)
    assert recorder.pending_final[b"k1"] == retried(1)  # skipped if read again meanwhile


@pytest.mark.parametrize(("backoff", "delay"), [(FIXED, 500), (LONG, 30_000)])
def test_the_retrying_outcome_says_when_the_next_attempt_is_due(
    backoff: Backoff, delay: int
) -> None:
    """Its df-next-due is the retry record's df-due; the outcome stays version 1 (every
    status view reads it) with the failed attempt's own due time."""
    recorder = failed_once(backoff)
    (_, _, _, _, _, retry_headers), _key_state, outcome = recorder.records
    (_, topic, _, key, value, headers) = outcome
    h = dict(headers)
    assert topic == N.outcomes
    assert h[hdr.NEXT_DUE] == dict(retry_headers)[hdr.DUE] == str(NOW + delay).encode()
    assert h[hdr.SCHEMA] == fast.OUTCOME_V1
    assert h[hdr.FIRED] == str(NOW - 4).encode()
    decoded = codec.decode("outcome", value, writer_version=1)
    assert (decoded["state"], decoded["attempt"], decoded["due_ms"]) == ("retrying", 1, NOW - 5)
    assert key == decoded["job_id"].encode()


def test_only_a_retrying_outcome_names_a_next_due_time() -> None:
    recorder = batch_recorder()
    job = make_job("flaky", {}, queue="jobs", key="k2", max_attempts=1, due_ms=NOW - 5)
    feed = PartitionFeed(N.exec("jobs"), 0, None, MemoryKeyStore(10**9))
    d = job_delivery(feed, job, exec_headers(job, fired_ms=NOW - 4), 3)
    prepare(d, TaskRegistry([flaky]), now_ms=NOW, limits=WireLimits())
    d.max_attempts = job.max_attempts
    recorder.failed(d, Failure("ValueError", "no"), 0.01, NOW)  # its last attempt: dead
    outcomes = [r for r in recorder.records if r[1] == N.outcomes]
    assert [codec.decode("outcome", r[4], writer_version=1)["state"] for r in outcomes] == ["dead"]
    assert hdr.NEXT_DUE not in dict(outcomes[0][5])


def test_a_handed_on_attempt_is_skipped_and_the_next_one_runs() -> None:
    state = retried(2)
    assert [skips(state, attempt) for attempt in (1, 2, 3, 4)] == [True, True, False, False]
    assert all(skips(final, 99) for final in (DONE, DEAD, CANCELLED))
    assert not is_final(state)
    assert state_of("retrying", 2) == state
    store = MemoryKeyStore(10**9)
    store.apply([(b"k", state, NOW)], None)
    assert store.get(b"k") == state
    store.apply([(b"k", DONE, NOW + 1)], None)  # a later final state replaces it
    assert store.get(b"k") == DONE
    assert store.expire(NOW + 10**9 + 2) == 1


def test_a_retry_beyond_the_top_tier_is_a_job_timer_for_the_jobs_own_partition() -> None:
    recorder = failed_once(LONG, partition=4, attempt=2)
    (_, topic, partition, key, value, headers), _key_state, _outcome = recorder.records
    h = dict(headers)
    due = NOW + 30_000
    assert topic == N.timers
    placed = place_timer(due_ms=due, now_ms=NOW, geometry=SETTINGS.wheel, spread=spread(key))
    assert partition == placed.partition  # explicit, by the wheel's rule
    assert key == b"k1"
    assert h[hdr.DUE] == str(due).encode()  # the not-before
    assert h[hdr.ATTEMPT] == b"3"
    assert h[hdr.PARTITION] == b"4"
    assert (h[hdr.KIND], h[hdr.QUEUE]) == (b"job", b"jobs")
    assert h["traceparent"] == TRACE
    assert h[hdr.LAST_FAILURE] == str(NOW).encode()
    assert hdr.FIRED not in h  # the emitter sets df-fired and df-src when it fires it
    assert hdr.SOURCE not in h
    assert codec.decode("job", value)["idempotency_key"] == "k1"  # the value unchanged
    # The emitter reads it as a job timer for exec partition 4 of the queue.
    exec_topics = {b"jobs": N.exec("jobs")}
    assert classify_timer(headers, key, exec_topics, {b"jobs": 6}) == (
        due,
        N.exec("jobs"),
        False,
        4,
    )
    metric = recorder._metrics.retries.labels("jobs", "wheel")._value.get()
    assert metric == 1


def test_a_cron_occurrences_retry_is_not_an_occurrence_again() -> None:
    headers = [
        (hdr.DUE, b"1"),
        (hdr.QUEUE, b"jobs"),
        (hdr.KIND, b"cron"),
        (hdr.SCHEDULE, b"s"),
        (hdr.FIRED, b"2"),
    ]
    rec = retry_timer(
        key=b"s@1",
        value=b"v",
        headers=headers,
        queue="jobs",
        exec_partition=1,
        due_ms=NOW + 90_000,
        now_ms=NOW,
        placer=TimerPlacer(SETTINGS.wheel),
    )
    h = dict(rec.headers)
    assert (h[hdr.KIND], h[hdr.PARTITION], h[hdr.DUE]) == (b"job", b"1", b"%d" % (NOW + 90_000))
    assert hdr.FIRED not in h
    assert rec.size >= len(rec.value) + len(rec.key)


def spread(key: bytes) -> int:
    import zlib

    return zlib.crc32(key)
