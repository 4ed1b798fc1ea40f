"""The test mode decides as the worker does: the same events, both ways, the same outcomes.

Each scenario runs twice on an :class:`~dueflow.testing.InMemoryPipeline` (the
same scheduler, emitter, log and fake clock): once with the test mode's worker
(:class:`~dueflow.testing.worker.InMemoryWorker`), once with a worker whose
every delivery goes through the production worker's own dispatch (the parts
of :class:`~dueflow.consumers.runtime.QueueRuntime`: the dispatcher's
``_dispatch`` calls ``decide`` and carries its verdict out, its attempts
run the attempt and record its end, the rebalance handler's ``recheck``
reads the key store again). Then
every verdict (delivery by delivery), every outcome record (state and
attempt, job by job), every key state, retry record, timer and dead letter
the two wrote must be the same. A drift of the test mode's mapping from
verdict to action (or of its decision) fails here.

The production side is a harness, :class:`ProductionWorker`: only how
records reach the runtime and how its batch is committed are the test
mode's (the log, the key stores fed from it); what is decided and written
is the runtime's. It reaches into ``QueueRuntime`` and its parts (the
attributes named in its docstring): a change to those names changes it, not
the scenarios.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from dueflow import PermanentJobError, task
from dueflow import headers as hdr
from dueflow.apps.ops.redrive import redrive_headers
from dueflow.config import QueueSpec
from dueflow.consumers import TaskContext
from dueflow.consumers import decision as decision_module
from dueflow.consumers import dispatch as dispatch_module
from dueflow.consumers.decision import Kind, Verdict
from dueflow.consumers.failures import permanent
from dueflow.consumers.feed_states import FeedState
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.runtime import QueueRuntime, Slots
from dueflow.consumers.store import CANCELLED, DEAD, DONE, MemoryKeyStore, memory_stores
from dueflow.kafka.topics import names
from dueflow.model import Backoff, BackoffKind
from dueflow.records import codec
from dueflow.records.reschedule import reschedule_key
from dueflow.records.worker_codec import decode_key_record
from dueflow.rules.partitioning import partition_for_key
from dueflow.testing import InMemoryPipeline
from dueflow.testing import pipeline as pipeline_module
from dueflow.testing import worker as test_mode
from dueflow.testing.attempts import run_attempt
from dueflow.testing.log import MemoryRecord
from dueflow.testing.views import JobRun
from dueflow.testing.worker import InMemoryWorker, _Queue

QUEUE = "jobs"
START = "2030-01-07T09:00:00Z"
FIXED = Backoff(BackoffKind.FIXED, base_ms=1_000, jitter=False)


@task("ok", queue=QUEUE)
def ok(payload: Any, ctx: TaskContext) -> str:
    return "fine"


@task("flaky", queue=QUEUE, max_attempts=4, backoff=FIXED)
def flaky(payload: Any, ctx: TaskContext) -> None:
    if ctx.attempt <= 2:
        raise ConnectionError(f"attempt {ctx.attempt}")


@task("broken", queue=QUEUE, max_attempts=2)
def broken(payload: Any, ctx: TaskContext) -> None:
    raise RuntimeError("always")


@task("refuses", queue=QUEUE)
def refuses(payload: Any, ctx: TaskContext) -> None:
    raise PermanentJobError("no such customer")


@task("late-flaky", queue=QUEUE, max_attempts=3, backoff=FIXED)
def late_flaky(payload: Any, ctx: TaskContext) -> None:
    if ctx.attempt == 1:
        raise ConnectionError("first")


@task("report", queue=QUEUE)
def report(payload: Any, ctx: TaskContext) -> None:
    """A cron occurrence's work."""


TASKS = [ok, flaky, broken, refuses, late_flaky, report]


# ------------------------------------------------------------------ the production side


class _KeysRead:
    """The key tail of the harness: the key stores read every key record of the log
    at each poll (InMemoryWorker.poll), so a recheck finds them read at once."""

    async def caught_up(self, partition: int) -> None:
        return None


class _Quarantine:
    """Where the runtime sets a command it cannot read aside (none here)."""

    def put(self, msg: Any, reason: str) -> None:
        raise AssertionError(f"quarantined: {reason}")


class _Clock:
    """The runtime's clock probe (due_now_ms, stamp_now_ms): the pipeline's fake clock."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock

    def due_now_ms(self) -> int:
        return self._clock()

    def stamp_now_ms(self) -> int:
        return self._clock()


class ProductionWorker(InMemoryWorker):
    """The in-memory worker's intake and commits around ``QueueRuntime``'s decisions.

    Uses of ``QueueRuntime`` internals: ``_dispatcher._dispatch(feed)`` (one
    delivery in the feed's backlog), and after it ``feed.checking`` (a recheck
    under way: the loop runs until it is done) and ``feed.held_until`` (held: not
    due); its collaborators ``_batch`` (the recorder), ``_steer`` and ``_book``
    (steering), ``_chain`` and ``_progress`` (what the feeds carry),
    ``_dispatcher._limits``; ``_rebalance._tail`` (the key tail a recheck waits
    for, replaced by :class:`_KeysRead`), ``_doubt.alive_at`` (the stall check of
    the dispatcher's pump) and ``_commits.txn_thread`` (shut down at close).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._aio = asyncio.new_event_loop()
        self.runtimes: dict[str, QueueRuntime] = {}
        self.quarantine = _Quarantine()
        self._last: tuple[Any, float] | None = None  # the last attempt's failure, seconds
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        for rt in self.runtimes.values():
            rt._commits.txn_thread.shutdown(wait=False)
        self._aio.close()
        super().close()

    def _add_queue(self, spec: QueueSpec) -> None:
        async def make() -> QueueRuntime:
            return QueueRuntime(
                self._settings,
                spec,
                registry=self._registry,
                executor=cast(Any, self),  # run() below
                slots=Slots(1),
                metrics=self._metrics,
                stores=memory_stores(),
                quarantine=cast(Any, self.quarantine),
                worker_id=test_mode.WORKER_ID,
                rng=self._rng,
                clock=cast(Any, _Clock(self._clock)),
            )

        rt = self.runtimes[spec.name] = self._aio.run_until_complete(make())
        rt._tail = rt._rebalance._tail = cast(Any, _KeysRead())
        n = self._names
        tiers = {n.retry(spec.name, t): t for t in spec.retry_tiers_ms}
        rt._steer.groups.book.owns_all = True
        feeds = []
        for p in range(spec.partitions):
            rt._book.attach(p)
            store = self._stores[(spec.name, p)] = MemoryKeyStore(spec.idempotency_retention_ms)
            for topic, tier in [(n.exec(spec.name), None), *tiers.items()]:
                feed = PartitionFeed(topic, p, tier, store, rt._chain)
                self._feeds[(topic, p)] = feed
                feed.reporter = rt._progress
                feed.advance(FeedState.LOADING)
                feed.advance(FeedState.LOADED)
                feeds.append(feed)
        self._queues[spec.name] = _Queue(
            spec, rt._batch, feeds, tiers, rt._chain, rt._dispatcher._limits, rt._steer
        )

    def run(self, job: Any, task: Any, payload: Any, ctx: Any, timeout_s: float, done: Any) -> None:
        """The runtime's executor (``JobExecutor.run``): the handler runs at once, as in
        the test mode (the attempt itself is not what is compared), and its end is
        reported to the runtime."""
        failure, seconds, returned = run_attempt(task, payload, ctx, timeout_s, self._loop)
        self._last = (failure, seconds)
        done(job, failure, seconds, returned)

    def _decide(self, d: Delivery, not_before: int, now_ms: int, *, eager: bool) -> JobRun | None:
        assert not eager, "the production worker has no eager mode"
        queue = self._queues[self._queue_of(d.feed.topic)]
        rt = self.runtimes[queue.spec.name]
        feed = d.feed
        self._last = None
        feed.backlog.append(d)
        rt._doubt.alive_at = time.monotonic()
        rt._dispatcher._dispatch(feed)
        if feed.checking:  # RECHECK: the runtime reads the key store, then decides again
            rt._doubt.alive_at = time.monotonic()
            pending = asyncio.all_tasks(self._aio)
            self._aio.run_until_complete(asyncio.gather(*pending))
        if feed.backlog:  # HOLD: not due, the partition waits
            assert feed.held_until > 0, f"{d} left undecided"
            if feed.timer is not None:
                feed.timer.cancel()
                feed.timer = None
            until, feed.held_until = feed.held_until, 0
            feed.backlog.clear()
            self._heap_push(until, d)
            return None
        ran = self._last is not None
        failure, seconds = self._last or (None, 0.0)
        if not ran and d.bad is not None:
            failure = d.bad[1]
        return self._commit(
            queue, d, not_before, now_ms, self._clock(), ran=ran, failure=failure, seconds=seconds
        )

    def _heap_push(self, until: int, d: Delivery) -> None:
        heapq.heappush(self._heap, (until, next(self._seq), d))


# ------------------------------------------------------------------ running both ways


@dataclass
class Seen:
    """What one run decided and wrote."""

    verdicts: list[tuple[str, int, str]] = field(default_factory=list)  # job, attempt, kind
    runs: list[tuple[str, int, bool, str]] = field(default_factory=list)
    outcomes: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    keys: list[tuple[Any, ...]] = field(default_factory=list)
    retries: list[tuple[Any, ...]] = field(default_factory=list)
    timers: list[tuple[Any, ...]] = field(default_factory=list)
    dead: list[tuple[Any, ...]] = field(default_factory=list)


def _recording(seen: Seen, decide: Any, force: dict[str, Verdict]) -> Any:
    """``decide``, its verdicts kept; a job named in ``force`` gets that verdict once."""
    forced = dict(force)

    def recorded(d: Delivery, **kwargs: Any) -> Verdict:
        verdict: Verdict = decide(d, **kwargs)
        if verdict.kind is not Kind.HOLD:
            job = d.hmap.get(hdr.JOB_ID, b"").decode()
            verdict = forced.pop(job, verdict)
            seen.verdicts.append((job, d.attempt, verdict.kind.value))
        return verdict

    return recorded


@pytest.fixture
def both(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Seen, Seen]]:
    """Run a scenario with the test mode's worker, then with the production dispatch."""

    def run(
        scenario: Callable[[InMemoryPipeline], None], *, force: dict[str, Verdict] | None = None
    ) -> tuple[Seen, Seen]:
        out = []
        for worker in (InMemoryWorker, ProductionWorker):
            seen = Seen()
            with monkeypatch.context() as m:
                recorded = _recording(seen, decision_module.decide, force or {})
                m.setattr(test_mode, "decide", recorded)
                m.setattr(dispatch_module, "decide", recorded)
                m.setattr(pipeline_module, "InMemoryWorker", worker)
                with InMemoryPipeline(TASKS, start=START, seed=7) as p:
                    assert isinstance(p.worker, worker)
                    scenario(p)
                    _observe(p, seen)
            out.append(seen)
        return out[0], out[1]

    return run


def _observe(p: InMemoryPipeline, seen: Seen) -> None:
    n = names(p.settings)
    seen.runs = [(r.job_id, r.attempt, r.ran, r.outcome) for r in p.history]
    for record in p.log.records(n.outcomes):
        version = codec.parse_schema_header(
            hdr.header(record.headers(), hdr.SCHEMA), expected="outcome"
        )
        o = codec.decode("outcome", record.value() or b"", writer_version=version)
        if o.get("worker") is None:
            continue  # the client's (scheduled, its cancel request): the same code both ways
        seen.outcomes.setdefault(o["job_id"], []).append(
            (o["state"], o["attempt"], o["due_ms"], o["error_type"], o.get("command_id"))
        )
    for record in p.log.records(n.idempotency(QUEUE)):
        value = record.value()
        state = None
        if value is not None:
            state = decode_key_record(value, hdr.header(record.headers(), hdr.SCHEMA))
        seen.keys.append((record.partition(), record.key(), state))
    for tier in p.settings.queue(QUEUE).retry_tiers_ms:
        for record in p.log.records(n.retry(QUEUE, tier)):
            h = dict(record.headers())
            seen.retries.append((tier, h.get(hdr.JOB_ID), h.get(hdr.ATTEMPT), h.get(hdr.DUE)))
    seen.timers = [
        (t.due_ms, t.record.key(), dict(t.record.headers()).get(hdr.VERSION))
        for t in p.emitter.pending()
    ]
    seen.dead = [
        (e.job_id, e.reason, e.attempts, e.error_type, e.idempotency_key) for e in p.dead_letters()
    ]


def _same(test: Seen, production: Seen, *, kinds: set[Kind]) -> None:
    assert test.verdicts == production.verdicts
    assert test.outcomes == production.outcomes
    assert test.keys == production.keys
    assert test.retries == production.retries
    assert test.timers == production.timers
    assert test.dead == production.dead
    assert test.runs == production.runs
    # The scenario reached what it is about.
    assert {Kind(k) for _, _, k in production.verdicts} >= kinds


# ------------------------------------------------------------------ the scenarios


def jobs_and_retries(p: InMemoryPipeline) -> None:
    s = p.scheduler
    s.schedule("ok", {"n": 1}, job_id="ok-1", idempotency_key="key-1")
    s.schedule("ok", {"n": 2}, job_id="ok-2", idempotency_key="key-1", delay=1)  # a duplicate
    s.schedule("flaky", job_id="flaky-1")  # retried twice, then succeeds
    s.schedule("broken", job_id="broken-1")  # exhausts its 2 attempts: dead
    s.schedule("refuses", job_id="refuses-1")  # permanent: dead at once
    s.schedule("ghost", queue=QUEUE, job_id="ghost-1")  # unknown task
    p.run_until_idle()
    s.schedule("ok", job_id="ok-3", idempotency_key="key-1")  # the key is done: duplicate
    p.run_until_idle()


def test_jobs_retries_duplicates_and_dead_letters(both: Any) -> None:
    test, production = both(jobs_and_retries)
    _same(test, production, kinds={Kind.RUN, Kind.DUPLICATE, Kind.DEAD_LETTER})
    assert [d[:3] for d in production.dead] == [
        ("refuses-1", "permanent_error", 1),
        ("ghost-1", "unknown_task", 0),
        ("broken-1", "exhausted", 2),
    ]


def deadlines(p: InMemoryPipeline) -> None:
    s = p.scheduler
    s.schedule("ok", job_id="late-1", delay=10, max_lateness=5)  # not started in time
    s.schedule("ok", job_id="in-time-1", delay=10, max_lateness=60)
    s.schedule("ok", job_id="at-deadline-1", delay=10, max_lateness=20)  # starts at it
    s.schedule("late-flaky", job_id="retried-late-1", delay=10, max_lateness=25)
    p.clock.advance(30)  # every process down meanwhile
    p.run_due()
    p.run_until_idle()  # the retry, after the deadline: it runs


def test_expired_deadlines(both: Any) -> None:
    test, production = both(deadlines)
    _same(test, production, kinds={Kind.EXPIRED, Kind.RUN})
    assert [o[0] for o in production.outcomes["late-1"]] == ["expired"]
    assert [o[:2] for o in production.outcomes["retried-late-1"]] == [
        ("retrying", 1),
        ("succeeded", 2),
    ]


def steering(p: InMemoryPipeline) -> None:
    s = p.scheduler
    s.schedule("ok", job_id="cancelled-1", delay=60)
    s.schedule("ok", job_id="moved-1", delay=60)
    s.schedule("ok", {"v": 1}, job_id="updated-1", delay=60)
    s.schedule("ok", job_id="moved-twice-1", delay=60)
    p.advance(10)
    s.cancel("cancelled-1", queue=QUEUE)
    s.reschedule("moved-1", delay=120, queue=QUEUE)
    s.update("updated-1", payload={"v": 2}, delay=30, queue=QUEUE)
    s.reschedule("moved-twice-1", delay=200, queue=QUEUE)
    s.reschedule("moved-twice-1", delay=20, queue=QUEUE)
    p.run_until_idle()


def test_cancelled_rescheduled_and_updated_jobs(both: Any) -> None:
    test, production = both(steering)
    _same(test, production, kinds={Kind.CANCELLED, Kind.REDIRECT, Kind.DUPLICATE, Kind.RUN})


def _legacy_reschedule(p: InMemoryPipeline, job_id: str, key: str, due_ms: int) -> None:
    """A reschedule record as a client of the release before steering writes it."""
    value = codec.encode(
        "idempotency",
        {
            "idempotency_key": key,
            "job_id": job_id,
            "state": "cancelled",
            "at_ms": p.clock(),
            "attempts": 0,
            "content_hash": None,
            "run_only_due_ms": due_ms,
        },
    )
    p.log.append(
        names(p.settings).idempotency(QUEUE),
        reschedule_key(key.encode()),
        value,
        [(hdr.SCHEMA, codec.schema_header("idempotency", 3))],
        partition_for_key(key.encode(), p.settings.queue(QUEUE).partitions),
    )


def _exec_record(p: InMemoryPipeline, job_id: str) -> MemoryRecord:
    (record,) = [
        r
        for r in p.log.records(names(p.settings).exec(QUEUE))
        if hdr.header(r.headers(), hdr.JOB_ID) == job_id.encode()
    ]
    return record


def legacy_then_moved(p: InMemoryPipeline) -> None:
    s = p.scheduler
    s.schedule("ok", job_id="legacy-1", idempotency_key="legacy-key", delay=60)
    s.schedule("ok", job_id="legacy-2", idempotency_key="legacy-key-2", delay=60)
    p.advance(5)
    # legacy-1: rescheduled by an old client to +90 s (its new timer never came),
    # then moved by a command to +120 s: the command's timer runs.
    _legacy_reschedule(p, "legacy-1", "legacy-key", p.clock() + 85_000)
    s.reschedule("legacy-1", delay=115, queue=QUEUE)
    # legacy-2: an old client's reschedule alone: its original timer is superseded.
    _legacy_reschedule(p, "legacy-2", "legacy-key-2", p.clock() + 85_000)
    p.run_until_idle()


def test_a_reschedule_record_of_the_release_before(both: Any) -> None:
    test, production = both(legacy_then_moved)
    _same(test, production, kinds={Kind.REDIRECT, Kind.RESCHEDULED, Kind.RUN})
    assert ("legacy-1", 1, "run") in production.verdicts  # the command's timer


def redriven(p: InMemoryPipeline) -> None:
    s = p.scheduler
    n = names(p.settings)
    s.schedule("refuses", job_id="dead-1", idempotency_key="dead-key")
    s.schedule("refuses", job_id="dead-2", idempotency_key="dead-key-2")
    p.run_until_idle()
    for job_id, clear in (("dead-1", False), ("dead-2", True)):
        record = _exec_record(p, job_id)
        if clear:  # the redrive's tombstone clears `dead` first
            p.log.append(n.idempotency(QUEUE), record.key(), None, [], record.partition())
        headers = redrive_headers(
            dict(record.headers()), by="ops", at_ms=p.clock(), source="dlq:0:0"
        )
        p.log.append(n.exec(QUEUE), record.key(), record.value(), headers, record.partition())
    p.run_until_idle()


def test_redriven_records(both: Any) -> None:
    test, production = both(redriven)
    # dead-1: its key still dead when read: rechecked, then a duplicate; dead-2 runs again.
    _same(test, production, kinds={Kind.RECHECK, Kind.DUPLICATE, Kind.RUN})


def undecodable(p: InMemoryPipeline) -> None:
    n = names(p.settings)
    p.log.append(
        n.exec(QUEUE), b"garbage-key", b"\xff\x00 not a job", [(hdr.DUE, b"%d" % p.clock())], 0
    )
    p.scheduler.schedule("ok", job_id="after-garbage-1")
    p.run_until_idle()
    record = _exec_record(p, "after-garbage-1")
    headers = [(k, v) for k, v in record.headers() if k not in (hdr.DUE, hdr.EXPIRES)]
    headers += [(hdr.DUE, b"%d" % p.clock()), (hdr.EXPIRES, b"soon")]
    p.log.append(n.exec(QUEUE), b"out-of-range", record.value(), headers, record.partition())
    p.run_until_idle()


def test_undecodable_and_out_of_range_records(both: Any) -> None:
    test, production = both(undecodable)
    _same(test, production, kinds={Kind.DEAD_LETTER, Kind.RUN})
    assert {d[1] for d in production.dead} == {"undecodable", "out_of_range"}


def cron(p: InMemoryPipeline) -> None:
    s = p.scheduler
    for policy in ("allow", "skip", "buffer_one"):
        s.add_schedule(
            f"every-minute-{policy}",
            cron="* * * * *",
            task="report",
            queue=QUEUE,
            overlap=policy,
            timezone="UTC",
        )
    p.advance(minutes=3)
    p.clock.advance(minutes=5)  # down: the misfire policy fires once
    p.run_due()


def test_cron_occurrences_with_overlap_policies(both: Any) -> None:
    test, production = both(cron)
    _same(test, production, kinds={Kind.RUN})
    assert len(production.runs) >= 9


# Verdicts no scenario above reaches in memory (one delivery at a time): each
# given to a delivery, carried out both ways.
FORCED = {
    "duplicate": Verdict(Kind.DUPLICATE, state=DONE),
    "dead key": Verdict(Kind.DUPLICATE, state=DEAD),
    "cancelled": Verdict(Kind.CANCELLED, state=CANCELLED),
    "rescheduled": Verdict(Kind.RESCHEDULED, run_only_due_ms=1),
    "expired": Verdict(Kind.EXPIRED),
    "dead letter": Verdict(
        Kind.DEAD_LETTER, reason="undecodable", failure=permanent("UndecodableRecord", "bad")
    ),
    "skipped occurrence": Verdict(Kind.SKIP_OCCURRENCE),
}


def forced(p: InMemoryPipeline) -> None:
    p.scheduler.schedule("ok", job_id="forced-1")
    p.scheduler.add_schedule(
        "every-minute", cron="* * * * *", timezone="UTC", task="report", overlap="skip"
    )
    p.advance(minutes=2)


@pytest.mark.parametrize("verdict", list(FORCED.values()), ids=list(FORCED))
def test_each_verdict_is_carried_out_alike(both: Any, verdict: Verdict) -> None:
    job = "every-minute@1894006860000" if verdict.kind is Kind.SKIP_OCCURRENCE else "forced-1"
    test, production = both(forced, force={job: verdict})
    _same(test, production, kinds={verdict.kind})
    assert (job, 1, verdict.kind.value) in production.verdicts
