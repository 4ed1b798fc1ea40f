"""The worker's exactly-once decision for one delivery (dueflow.consumers.decision)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow import headers as hdr
from dueflow.consumers.commands import SteeringBook
from dueflow.consumers.decision import Kind, Verdict, decide
from dueflow.consumers.failures import permanent
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.overlap import OverlapGuard
from dueflow.consumers.steering_store import memory_steering_stores
from dueflow.consumers.store import CANCELLED, DEAD, DONE, MemoryKeyStore, retried, skips
from dueflow.reasons import OUT_OF_RANGE, UNDECODABLE
from dueflow.records.worker_codec import F_DUE_MS, F_SCHEDULE_ID
from dueflow.steering_model import JobSteering, Outstanding, Patch

KEY = b"order-7"
NOW = 1_000_000
DUE = NOW - 5_000  # the job's due time (its value's due_ms)
BAD = (UNDECODABLE, permanent("UndecodableRecord", "truncated"))
OUT_OF_RANGE_BAD = (OUT_OF_RANGE, permanent("FieldOutOfRange", "df-expires: b'soon' ..."))


@dataclass
class Case:
    """One delivery and what the worker knows when it reaches the head."""

    attempt: int = 1
    not_before: int = DUE
    headers: dict[str, bytes] = field(default_factory=dict)
    key: bytes = KEY
    decoded: bool = True  # False: the value was undecodable (no fields)
    bad: tuple[str, Any] | None = None
    rechecked: bool = False
    schedule_id: str = ""
    stored: int | None = None  # the key's state in the key store
    pending: int | None = None  # the key's state finished here, not committed yet
    run_only_due: int | None = None  # a reschedule record of the key
    key_running: bool = False  # an attempt of the key runs in this process
    occurrences_running: int = 0  # attempts of the schedule's occurrences running
    occurrence_buffered: bool = False  # one occurrence of the schedule waits already
    now: int = NOW
    command: bool = False  # a command record (df-kind steer), not a job
    steered: JobSteering | None = None  # the job's steering state
    ahead: bool = False  # fired before its due time
    fence_ms: int = 0  # the partition's lead fence
    margin: int = 0  # worker.steering_margin_ms


class _Msg:
    pass


def delivery(case: Case, feed: PartitionFeed) -> Delivery:
    d = Delivery(feed, _Msg(), 41)
    if case.decoded:
        fields: list[Any] = [None] * 17
        fields[F_DUE_MS] = DUE
        fields[F_SCHEDULE_ID] = case.schedule_id
        d.fields = tuple(fields)
    d.bad = case.bad
    d.key = case.key
    d.hmap = dict(case.headers)
    expires = case.headers.get(hdr.EXPIRES)  # as prepare reads it (checked there)
    d.expires = None if expires is None else int(expires)
    d.attempt = case.attempt
    d.not_before = case.not_before
    d.rechecked = case.rechecked
    d.command = case.command
    d.ahead = case.ahead
    return d


def judge(case: Case) -> Verdict:
    store = MemoryKeyStore(retention_ms=86_400_000)
    if case.stored is not None:
        store.apply([(case.key, case.stored, NOW - 60_000)], next_offset=3)
    if case.run_only_due is not None:
        store.reschedule([(case.key, case.run_only_due, NOW - 30_000)])
    feed = PartitionFeed("p.exec.default", 0, None, store)
    feed.fence_ms = case.fence_ms
    d = delivery(case, feed)
    guard = OverlapGuard()
    if case.occurrences_running:
        guard.running[case.schedule_id] = case.occurrences_running
    if case.occurrence_buffered:
        guard.buffered[case.schedule_id] = delivery(Case(schedule_id=case.schedule_id), feed)
    pending = {} if case.pending is None else {case.key: case.pending}
    running = {case.key: d} if case.key_running else {}
    before = (copy.copy(guard.running), dict(guard.buffered), dict(pending), store.get(case.key))
    book = SteeringBook("default", 86_400_000, memory_steering_stores())
    if case.steered is not None:
        book.attach(0).put([(case.key, case.steered)])
    verdict = decide(
        d,
        store=store,
        pending=pending,
        running=running,
        occurrences=guard,
        now_ms=case.now,
        steering=book,
        margin_ms=case.margin,
    )
    # Pure: nothing it was given has changed.
    after = (guard.running, guard.buffered, pending, store.get(case.key))
    assert after == before
    assert d.rechecked is case.rechecked
    return verdict


EXPIRES_PAST = {hdr.EXPIRES: str(NOW - 1).encode()}
REDRIVEN = {hdr.REDRIVEN_AT: str(NOW - 2_000).encode()}
SKIP = {hdr.OVERLAP: b"skip"}
BUFFER_ONE = {hdr.OVERLAP: b"buffer_one"}
ALLOW = {hdr.OVERLAP: b"allow"}
V1 = {hdr.VERSION: b"c1"}
# A job moved by a replace (c1 current) whose original timer is still in the wheel.
REPLACED = JobSteering(
    "j", "order-7", current="c1", outstanding=(Outstanding("", DUE), Outstanding("c1", DUE))
)
MOVED = JobSteering(
    "j",
    "order-7",
    outstanding=(Outstanding("", DUE),),
    patch=Patch("c2", DUE + 9, None, None, "c2"),
)

TABLE: list[tuple[str, Case, Kind]] = [
    # -- commands to the partition's owner: applied at once, never held
    ("a command is applied", Case(command=True), Kind.COMMAND),
    ("a command is never held", Case(command=True, not_before=NOW + 9), Kind.COMMAND),
    # -- steered jobs (dueflow.rules.steering)
    ("steered: the original timer of a replaced job", Case(steered=REPLACED), Kind.RESCHEDULED),
    ("steered: the current version runs", Case(steered=REPLACED, headers=V1), Kind.RUN),
    (
        "steered: the current version runs whatever reschedule record of the release before "
        "the key has (it governs the timers without a version)",
        Case(steered=REPLACED, headers=V1, run_only_due=DUE - 60_000),
        Kind.RUN,
    ),
    (
        "steered: the original timer with such a record, after a refused command",
        Case(steered=JobSteering("j", "order-7"), run_only_due=DUE - 60_000),
        Kind.RESCHEDULED,
    ),
    ("steered: a move waits: redirect", Case(steered=MOVED), Kind.REDIRECT),
    (
        "steered: a retry of a moved job's current timer runs",
        Case(steered=MOVED, attempt=2),
        Kind.RUN,
    ),
    (
        "steered: cancelled",
        Case(steered=JobSteering("j", "order-7", cancelled=True, ended="cancelled")),
        Kind.CANCELLED,
    ),
    (
        "steered: the current version after the job ended",
        Case(steered=JobSteering("j", "order-7", ended="done", outstanding=(Outstanding("x", 1),))),
        Kind.DUPLICATE,
    ),
    ("a version whose state is gone: superseded", Case(headers=V1), Kind.RESCHEDULED),
    ("a retry of a version whose state is gone runs", Case(headers=V1, attempt=2), Kind.RUN),
    ("a final key wins over steering", Case(steered=MOVED, stored=DONE), Kind.DUPLICATE),
    # -- nothing known of the key: it runs
    ("new key runs", Case(), Kind.RUN),
    ("due exactly now runs", Case(not_before=NOW), Kind.RUN),
    ("a retry of a key never seen runs", Case(attempt=3), Kind.RUN),
    # -- not due: held, whatever else is true (a record never runs early)
    ("not due yet: held", Case(not_before=NOW + 1), Kind.HOLD),
    # -- fired ahead (dueflow.consumers.lead_fence)
    ("fired ahead, not due yet: held", Case(ahead=True, not_before=NOW + 1), Kind.HOLD),
    ("fired ahead, due, the fence before its due time", Case(ahead=True), Kind.FENCE),
    ("fired ahead, the fence one ms short", Case(ahead=True, fence_ms=DUE - 1), Kind.FENCE),
    ("fired ahead, the fence at its due time: runs", Case(ahead=True, fence_ms=DUE), Kind.RUN),
    (
        "fired ahead, already done: the fence first (a command may be behind it)",
        Case(ahead=True, stored=DONE),
        Kind.FENCE,
    ),
    (
        "fired ahead, the fence past it, cancelled meanwhile",
        Case(ahead=True, fence_ms=NOW, stored=CANCELLED),
        Kind.CANCELLED,
    ),
    ("written when due: no fence", Case(fence_ms=0), Kind.RUN),
    (
        "fired ahead, the fence at its due time less the margin: runs",
        Case(ahead=True, fence_ms=DUE - 50, margin=50),
        Kind.RUN,
    ),
    (
        "fired ahead, the fence short of its due time less the margin",
        Case(ahead=True, fence_ms=DUE - 51, margin=50),
        Kind.FENCE,
    ),
    ("not due, already done: held first", Case(not_before=NOW + 9, stored=DONE), Kind.HOLD),
    # (a record that failed its checks is due at once: prepare sets not_before 0)
    ("undecodable: never held", Case(not_before=0, bad=BAD), Kind.DEAD_LETTER),
    # -- final states: a duplicate of a committed run, or cancelled
    ("done in the store: duplicate", Case(stored=DONE), Kind.DUPLICATE),
    ("dead in the store: duplicate", Case(stored=DEAD), Kind.DUPLICATE),
    ("a retry of a done key: duplicate", Case(attempt=4, stored=DONE), Kind.DUPLICATE),
    ("cancelled in the store", Case(stored=CANCELLED), Kind.CANCELLED),
    ("done here, not committed yet: duplicate", Case(pending=DONE), Kind.DUPLICATE),
    ("cancelled here, not committed yet", Case(pending=CANCELLED), Kind.CANCELLED),
    (
        "what finished here is newer than the store",
        Case(stored=retried(1), attempt=2, pending=DONE),
        Kind.DUPLICATE,
    ),
    # -- retries: an attempt handed on is a duplicate; a newer attempt runs
    ("an older attempt than the one handed on", Case(stored=retried(2), attempt=1), Kind.DUPLICATE),
    ("the same attempt as the one handed on", Case(stored=retried(2), attempt=2), Kind.DUPLICATE),
    ("the next attempt after the one handed on", Case(stored=retried(2), attempt=3), Kind.RUN),
    (
        "a newer attempt handed on here, not committed",
        Case(stored=retried(2), attempt=3, pending=retried(3)),
        Kind.DUPLICATE,
    ),
    # -- a redriven record: the store reads that far first, then decides
    ("redriven, key dead: recheck first", Case(stored=DEAD, headers=REDRIVEN), Kind.RECHECK),
    (
        "redriven, rechecked, still dead: duplicate",
        Case(stored=DEAD, headers=REDRIVEN, rechecked=True),
        Kind.DUPLICATE,
    ),
    ("redriven, key cleared: runs", Case(headers=REDRIVEN), Kind.RUN),
    # -- reschedules (IdempotencyRecord v3 marks)
    ("rescheduled to this delivery's due time: runs", Case(run_only_due=DUE), Kind.RUN),
    (
        "rescheduled later: the old timer is skipped",
        Case(run_only_due=DUE + 60_000),
        Kind.RESCHEDULED,
    ),
    (
        "rescheduled earlier: this later timer is skipped",
        Case(run_only_due=DUE - 60_000),
        Kind.RESCHEDULED,
    ),
    ("a retry of the rescheduled job runs", Case(run_only_due=DUE, attempt=2), Kind.RUN),
    (
        "a final state wins over a reschedule",
        Case(run_only_due=DUE + 1, stored=DONE),
        Kind.DUPLICATE,
    ),
    (
        "cancelled wins over a reschedule",
        Case(run_only_due=DUE + 1, stored=CANCELLED),
        Kind.CANCELLED,
    ),
    (
        "a reschedule does not apply to an undecodable value",
        Case(run_only_due=DUE + 1, decoded=False, bad=BAD),
        Kind.DEAD_LETTER,
    ),
    # -- the key runs here now (a replay): wait for it
    ("key running here: waits", Case(key_running=True), Kind.WAIT),
    (
        "key running, but done already: duplicate",
        Case(key_running=True, pending=DONE),
        Kind.DUPLICATE,
    ),
    (
        "key running, but rescheduled away",
        Case(key_running=True, run_only_due=DUE + 1),
        Kind.RESCHEDULED,
    ),
    (
        "key running, past the deadline: waits first",
        Case(key_running=True, headers=EXPIRES_PAST),
        Kind.WAIT,
    ),
    ("no key: no key checks", Case(key=b"", key_running=True, stored=DONE), Kind.RUN),
    # -- deadlines (expires / max_lateness): first attempts only
    ("first attempt past its deadline: expired", Case(headers=EXPIRES_PAST), Kind.EXPIRED),
    ("at its deadline it still runs", Case(headers={hdr.EXPIRES: str(NOW).encode()}), Kind.RUN),
    ("a retry past the deadline runs", Case(attempt=2, headers=EXPIRES_PAST), Kind.RUN),
    ("out of range: dead letter", Case(bad=OUT_OF_RANGE_BAD), Kind.DEAD_LETTER),
    ("expired and done: duplicate", Case(headers=EXPIRES_PAST, stored=DONE), Kind.DUPLICATE),
    ("expired and undecodable: dead letter", Case(headers=EXPIRES_PAST, bad=BAD), Kind.DEAD_LETTER),
    # -- undecodable, unknown task: dead letter at once
    ("undecodable value: dead letter", Case(decoded=False, bad=BAD), Kind.DEAD_LETTER),
    ("unknown task: dead letter", Case(bad=BAD), Kind.DEAD_LETTER),
    ("undecodable, no key: dead letter", Case(decoded=False, key=b"", bad=BAD), Kind.DEAD_LETTER),
    ("undecodable but done: duplicate", Case(decoded=False, bad=BAD, stored=DONE), Kind.DUPLICATE),
    # -- cron overlap policies
    ("skip, nothing of the schedule running: runs", Case(schedule_id="s", headers=SKIP), Kind.RUN),
    (
        "skip while another occurrence runs",
        Case(schedule_id="s", headers=SKIP, occurrences_running=1),
        Kind.SKIP_OCCURRENCE,
    ),
    (
        "buffer_one while another runs: waits its turn",
        Case(schedule_id="s", headers=BUFFER_ONE, occurrences_running=1),
        Kind.BUFFER_OCCURRENCE,
    ),
    (
        "buffer_one with one waiting already: skipped",
        Case(schedule_id="s", headers=BUFFER_ONE, occurrences_running=1, occurrence_buffered=True),
        Kind.SKIP_OCCURRENCE,
    ),
    (
        "allow runs beside the running one",
        Case(schedule_id="s", headers=ALLOW, occurrences_running=2),
        Kind.RUN,
    ),
    (
        "a policy header without a schedule id runs",
        Case(headers=SKIP, occurrences_running=1),
        Kind.RUN,
    ),
    (
        "an occurrence already done: duplicate",
        Case(schedule_id="s", headers=SKIP, occurrences_running=1, stored=DONE),
        Kind.DUPLICATE,
    ),
]


@pytest.mark.parametrize(
    ("case", "kind"), [(c, k) for _, c, k in TABLE], ids=[name for name, _, _ in TABLE]
)
def test_the_verdict(case: Case, kind: Kind) -> None:
    assert judge(case).kind is kind


def test_every_kind_is_in_the_table() -> None:
    assert {kind for _, _, kind in TABLE} == set(Kind)


def test_a_steering_verdict_carries_its_judgement() -> None:
    verdict = judge(Case(steered=MOVED))
    assert verdict.judgement is not None
    assert verdict.judgement.timer is not None
    assert verdict.judgement.timer.token == "c2"
    assert judge(Case(steered=REPLACED, headers=V1)).judgement is None


def test_a_hold_says_until_when() -> None:
    assert judge(Case(not_before=NOW + 1_500)) == Verdict(Kind.HOLD, until_ms=NOW + 1_500)


@pytest.mark.parametrize(
    ("case", "state"),
    [
        (Case(stored=DONE), DONE),
        (Case(stored=DEAD), DEAD),
        (Case(stored=CANCELLED), CANCELLED),
        (Case(stored=retried(3), attempt=2), retried(3)),
        (Case(stored=DONE, pending=DEAD), DEAD),  # this process's is the newer
    ],
)
def test_a_skip_carries_the_state_that_decided_it(case: Case, state: int) -> None:
    assert judge(case).state == state


def test_a_reschedule_says_which_due_time_runs() -> None:
    verdict = judge(Case(run_only_due=DUE + 60_000))
    assert verdict == Verdict(Kind.RESCHEDULED, run_only_due_ms=DUE + 60_000)


def test_a_dead_letter_carries_reason_and_failure() -> None:
    verdict = judge(Case(bad=BAD))
    assert (verdict.kind, verdict.reason, verdict.failure) == (Kind.DEAD_LETTER, *BAD)


@given(
    stored=st.one_of(
        st.none(), st.sampled_from([DONE, DEAD, CANCELLED]), st.integers(1, 9).map(retried)
    ),
    attempt=st.integers(1, 10),
    not_before=st.integers(NOW - 10, NOW + 10),
    key_running=st.booleans(),
)
def test_never_runs_early_nor_twice(
    stored: int | None, attempt: int, not_before: int, key_running: bool
) -> None:
    """A record whose key's state skips it, that is early, or whose key runs here never
    gets RUN; one that is none of these does."""
    case = Case(stored=stored, attempt=attempt, not_before=not_before, key_running=key_running)
    kind = judge(case).kind
    blocked = not_before > NOW or (stored is not None and skips(stored, attempt)) or key_running
    assert (kind is Kind.RUN) is not blocked
