"""The owner's steering rule (dueflow.rules.steering): tables, and a model of any
interleaving of commands and deliveries."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.records.command import Command
from dueflow.records.steering_state import JobSteering, Outstanding, Patch
from dueflow.rules import steering
from dueflow.rules.steering import Step, apply, ended, judge, sweep, sweep_due

NOW = 1_800_000_000_000
DUE = NOW + 3_600_000
GRACE = 7 * 86_400_000


def cmd(op: str, cid: str = "c1", **kw: object) -> Command:
    return Command(
        command_id=cid,
        op=op,
        job_id="j1",
        idempotency_key="k1",
        queue="q",
        at_ms=NOW,
        known_due_ms=kw.pop("known_due_ms", DUE),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def run(state: JobSteering | None, command: Command, key: str | None = None) -> steering.Applied:
    return apply(state, command, key=key, now_ms=NOW, grace_ms=GRACE, exec_partition=3)


# ----------------------------------------------------------------- apply: tables


def test_cancel_of_a_pending_job_keeps_its_timer_outstanding_and_marks_the_key() -> None:
    got = run(None, cmd("cancel"))
    assert got.outcome == "cancelled"
    assert got.cancel_key
    assert got.changed
    assert got.state is not None
    assert got.state.cancelled
    assert got.state.ended == "cancelled"
    assert got.state.outstanding == (Outstanding("", DUE),)
    assert got.state.exec_partition == 3


def test_move_later_is_lazy_a_patch_waiting_for_the_current_timer() -> None:
    got = run(None, cmd("move", due_ms=DUE + 1000))
    assert got.outcome == "rescheduled"
    assert got.due_ms == DUE + 1000
    assert got.timer is None
    assert not got.cancel_key
    assert got.state is not None
    assert got.state.patch == Patch("c1", DUE + 1000, None, None, "c1")
    assert got.state.current == ""
    assert got.state.version == "c1"


def test_patch_keeps_an_earlier_move_and_a_move_keeps_an_earlier_payload() -> None:
    moved = run(None, cmd("move", "c1", due_ms=DUE + 1000)).state
    patched = run(moved, cmd("patch", "c2", payload=b"{}", content_type="application/json"))
    assert patched.outcome == "updated"
    assert patched.due_ms == DUE + 1000
    assert patched.state is not None
    assert patched.state.patch == Patch("c2", DUE + 1000, b"{}", "application/json", "c2")
    again = run(patched.state, cmd("move", "c3", due_ms=DUE + 5000))
    assert again.state is not None
    assert again.state.patch == Patch("c3", DUE + 5000, b"{}", "application/json", "c3")


def test_replace_writes_the_new_timer_now_and_makes_it_current() -> None:
    got = run(None, cmd("replace", due_ms=NOW + 10, job=b"value"))
    assert got.outcome == "rescheduled"
    assert got.timer == steering.NewTimer("c1", NOW + 10)
    assert got.state is not None
    assert got.state.current == "c1"
    assert got.state.current_due_ms == NOW + 10
    assert got.state.outstanding == (Outstanding("", DUE), Outstanding("c1", NOW + 10))


@pytest.mark.parametrize(
    ("key", "op", "code"),
    [
        ("done", "cancel", steering.FINISHED),
        ("dead", "move", steering.FINISHED),
        ("cancelled", "cancel", steering.CANCELLED),
        ("running", "move", steering.STARTED),
        ("retrying", "patch", steering.STARTED),
        ("running", "replace", steering.STARTED),
    ],
)
def test_refusals_by_what_the_key_says(key: str, op: str, code: str) -> None:
    got = run(None, cmd(op, due_ms=DUE + 1, payload=b"x", job=b"v"), key=key)
    assert (got.outcome, got.code, got.changed) == ("refused", code, False)
    assert got.error.startswith(code + ": ")


@pytest.mark.parametrize("key", ["running", "retrying"])
def test_cancel_of_a_started_job_lets_the_attempt_finish_and_no_other_run(key: str) -> None:
    got = run(None, cmd("cancel"), key=key)
    assert got.outcome == "cancelled"
    assert got.cancel_key
    assert got.state is not None
    assert got.state.cancelled
    assert got.state.ended is None
    assert got.state.outstanding == ()  # its timer was delivered already
    # the attempt ends: the job ends, the state goes
    assert ended(got.state, token="", how="done") == (None, True)


def test_moving_earlier_needs_the_value_and_the_same_time_is_refused() -> None:
    assert run(None, cmd("move", due_ms=DUE - 1)).code == steering.NEEDS_VALUE
    assert run(None, cmd("move", due_ms=DUE)).code == steering.DUE_ALREADY
    assert run(None, cmd("patch", payload=b"x", due_ms=DUE - 1)).code == steering.NEEDS_VALUE
    # a payload update alone keeps the due time
    assert run(None, cmd("patch", payload=b"x")).outcome == "updated"


def test_expect_version_guards_moves_and_updates_but_not_cancels() -> None:
    state = run(None, cmd("move", "c1", due_ms=DUE + 1)).state
    stale = run(state, cmd("patch", "c2", payload=b"x", expect_version=""))
    assert stale.code == steering.CHANGED
    fresh = run(state, cmd("patch", "c2", payload=b"x", expect_version="c1"))
    assert fresh.outcome == "updated"
    assert run(state, cmd("cancel", "c3", expect_version="zzz")).outcome == "cancelled"


def test_a_cancelled_or_ended_job_refuses_everything() -> None:
    cancelled = run(None, cmd("cancel")).state
    for op in ("cancel", "move", "patch", "replace"):
        got = run(cancelled, cmd(op, "c9", due_ms=DUE + 1, payload=b"x", job=b"v"))
        assert (got.outcome, got.code) == ("refused", steering.CANCELLED)
    done = replace(JobSteering("j1", "k1", outstanding=(Outstanding("x", 1),)), ended="done")
    assert run(done, cmd("move", due_ms=DUE + 1)).code == steering.FINISHED


def test_a_job_due_long_ago_that_the_worker_does_not_know_is_refused() -> None:
    got = run(None, cmd("cancel", known_due_ms=NOW - GRACE - 1))
    assert (got.outcome, got.code, got.state) == ("refused", steering.UNKNOWN, None)


def test_ops_of_other_work_packages_are_refused_as_unsupported() -> None:
    assert run(None, cmd("admit")).code == steering.UNSUPPORTED


# ----------------------------------------------------------------- judge: tables


def test_no_state_and_no_token_is_any_job() -> None:
    assert judge(None, token="", attempt=1).step is Step.PASS


def test_a_token_whose_state_is_gone_is_superseded_but_its_retries_and_redrives_run() -> None:
    assert judge(None, token="c1", attempt=1).step is Step.SUPERSEDED
    assert judge(None, token="c1", attempt=2).step is Step.PASS
    assert judge(None, token="c1", attempt=1, redriven=True).step is Step.PASS


def test_the_current_timer_with_a_patch_is_redirected_and_the_old_token_superseded() -> None:
    state = run(None, cmd("patch", "c1", payload=b"new", due_ms=DUE + 50)).state
    got = judge(state, token="", attempt=1, due_ms=DUE)
    assert got.step is Step.REDIRECT
    assert got.timer == steering.NewTimer("c1", DUE + 50)
    assert got.patch is not None
    assert got.patch.payload == b"new"
    assert got.state is not None
    assert got.state.current == "c1"
    assert got.state.patch is None
    assert got.state.outstanding == (Outstanding("c1", DUE + 50),)
    # the new timer runs; its end ends the job and removes the state
    assert judge(got.state, token="c1", attempt=1).step is Step.PASS
    assert ended(got.state, token="c1", how="done") == (None, True)


def test_a_payload_update_redirects_to_the_same_due_time() -> None:
    state = run(None, cmd("patch", "c1", payload=b"new", known_due_ms=None)).state
    got = judge(state, token="", attempt=1, due_ms=DUE)
    assert got.timer == steering.NewTimer("c1", DUE)


def test_a_superseded_token_leaves_the_current_one_outstanding() -> None:
    state = run(None, cmd("replace", "c1", due_ms=DUE + 9, job=b"v")).state
    got = judge(state, token="", attempt=1)
    assert got.step is Step.SUPERSEDED
    assert got.changed
    assert got.state is not None
    assert got.state.outstanding == (Outstanding("c1", DUE + 9),)


def test_cancelled_skips_every_delivery_and_goes_once_the_last_timer_came() -> None:
    state = run(None, cmd("replace", "c1", due_ms=DUE + 9, job=b"v")).state
    state = run(state, cmd("cancel", "c2")).state
    first = judge(state, token="c1", attempt=1)
    assert first.step is Step.CANCELLED
    assert first.cancel_key
    assert first.state is not None  # the original timer is still in the wheel
    last = judge(first.state, token="", attempt=1)
    assert last.step is Step.CANCELLED
    assert last.state is None
    assert last.changed


def test_a_redrive_runs_unless_cancelled() -> None:
    dead = JobSteering("j1", "k1", current="c1", ended="dead", outstanding=(Outstanding("z", 1),))
    assert judge(dead, token="c1", attempt=1, redriven=True).step is Step.PASS
    assert judge(replace(dead, cancelled=True), token="c1", attempt=1, redriven=True).step is (
        Step.CANCELLED
    )


def test_ended_by_a_retry_keeps_the_job_and_drops_its_token() -> None:
    state = JobSteering("j1", "k1", current="c1", outstanding=(Outstanding("c1", DUE),))
    after, changed = ended(state, token="c1", how=None)
    assert changed
    assert after is not None
    assert after.ended is None
    assert after.outstanding == ()


# ----------------------------------------------------------------- sweep


def test_sweep_forgets_old_other_tokens_never_the_current_version_of_a_job_to_run() -> None:
    state = JobSteering(
        "j1",
        "k1",
        current="c2",
        outstanding=(Outstanding("", DUE), Outstanding("c2", DUE + 1)),
        updated_ms=NOW,
    )
    due = sweep_due(state, grace_ms=GRACE)
    assert due == DUE + GRACE + 1
    assert sweep(state, now_ms=due - 1, grace_ms=GRACE) == (state, False)
    after, changed = sweep(state, now_ms=due + 10**12, grace_ms=GRACE)
    assert changed
    assert after is not None
    assert after.outstanding == (Outstanding("c2", DUE + 1),)
    assert sweep_due(after, grace_ms=GRACE) is None


def test_sweep_ends_a_cancelled_job_whose_timers_are_long_past() -> None:
    state = run(None, cmd("cancel")).state
    assert state is not None
    assert sweep(state, now_ms=DUE + GRACE + 1, grace_ms=GRACE) == (None, True)
    started = run(None, cmd("cancel"), key="running").state
    assert started is not None
    assert sweep(started, now_ms=NOW + GRACE + 1, grace_ms=GRACE) == (None, True)


# ----------------------------------------------------------------- the model


@dataclass
class Timer:
    token: str
    due_ms: int
    payload: str


@dataclass
class World:
    """One job on one partition, its timers in the wheel, the owner's state and key
    store, and what ran."""

    wheel: list[Timer] = field(default_factory=lambda: [Timer("", DUE, "p0")])
    state: JobSteering | None = None
    key: str | None = None  # None, retrying, done, dead, cancelled
    retried: int = 0  # the attempt handed on last
    running: tuple[str, str, int] | None = None  # token, payload, attempt
    retry: tuple[str, str, int] | None = None  # a retry record waiting in its tier
    runs: list[tuple[str, str, int]] = field(default_factory=list)
    cancelled: bool = False  # a cancel was applied
    # the version the latest applied command asked for: payload, earliest due
    payload: str = "p0"
    due_at_least: int = DUE
    commands: int = 0

    def key_view(self) -> str | None:
        return "running" if self.running else self.key

    def command(self, op: str, due_ms: int, payload: str) -> None:
        self.commands += 1
        cid = f"c{self.commands}"
        c = cmd(op, cid, due_ms=due_ms, payload=payload.encode(), job=payload.encode())
        got = apply(
            self.state, c, key=self.key_view(), now_ms=NOW, grace_ms=GRACE, exec_partition=0
        )
        if got.changed:
            self.state = got.state
        if got.cancel_key:
            self.key = "cancelled"
        if got.outcome == "cancelled":
            self.cancelled = True
        elif got.outcome in ("rescheduled", "updated"):
            if op in ("patch", "replace"):
                self.payload = payload
            if op in ("move", "replace") or (op == "patch" and c.due_ms is not None):
                self.due_at_least = due_ms if op != "patch" else max(self.due_at_least, due_ms)
            if op == "replace":
                self.due_at_least = due_ms
        if got.timer is not None:
            assert got.timer.due_ms is not None
            self.wheel.append(Timer(got.timer.token, got.timer.due_ms, payload))

    def _skip_final(self, token: str, how: str | None) -> None:
        if self.state is not None:
            after, changed = ended(self.state, token=token, how=how)
            if changed:
                self.state = after

    def deliver(self, token: str, payload: str, due_ms: int, attempt: int) -> None:
        key = self.key
        if key in ("done", "dead", "cancelled") or (key == "retrying" and attempt <= self.retried):
            self._skip_final(token, key if key != "retrying" else None)
            return
        j = judge(self.state, token=token, attempt=attempt, due_ms=due_ms)
        if j.changed:
            self.state = j.state
        if j.cancel_key:
            self.key = "cancelled"
        if j.step is Step.REDIRECT:
            assert j.timer is not None
            assert j.patch is not None
            assert j.timer.due_ms is not None
            new = j.patch.payload.decode() if j.patch.payload is not None else payload
            self.wheel.append(Timer(j.timer.token, j.timer.due_ms, new))
        elif j.step is Step.PASS:
            assert not self.cancelled, "ran after a cancel"
            if attempt == 1:  # (a retry runs the version of its first attempt)
                assert payload == self.payload, "ran an old payload"
                assert due_ms >= self.due_at_least, "ran before the latest due time"
            self.runs.append((token, payload, attempt))
            self.running = (token, payload, attempt)

    def fire(self, index: int) -> None:
        if self.running or not self.wheel:
            return
        t = self.wheel.pop(index % len(self.wheel))
        if self.state is not None:
            assert t.token in self.state.tokens, "a timer in the wheel is not outstanding"
        self.deliver(t.token, t.payload, t.due_ms, 1)

    def finish(self, how: str) -> None:
        if self.running is None:
            return
        token, payload, attempt = self.running
        self.running = None
        if how == "retry" and self.state is not None and self.state.cancelled:
            how = "cancelled"  # the recorder hands no retry on for a cancelled job
        if how == "retry" and attempt < 3:
            self.key, self.retried = "retrying", attempt
            self.retry = (token, payload, attempt + 1)
            self._skip_final(token, None)
            return
        end = {"retry": "dead", "done": "done", "dead": "dead", "cancelled": "cancelled"}[how]
        self.key = end
        self._skip_final(token, end)

    def deliver_retry(self) -> None:
        if self.retry is None or self.running:
            return
        token, payload, attempt = self.retry
        self.retry = None
        self.deliver(token, payload, DUE, attempt)

    def drain(self) -> None:
        for _ in range(100):
            if self.running:
                self.finish("done")
            elif self.retry:
                self.deliver_retry()
            elif self.wheel:
                self.fire(0)
            else:
                return
        raise AssertionError("did not drain")


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("command"),
            st.sampled_from(["cancel", "move", "patch", "replace"]),
            st.integers(min_value=-5_000, max_value=5_000),
            st.sampled_from(["p1", "p2", "p3"]),
        ),
        st.tuples(st.just("fire"), st.integers(min_value=0, max_value=10)),
        st.tuples(st.just("finish"), st.sampled_from(["done", "dead", "retry"])),
        st.tuples(st.just("retry")),
        st.tuples(st.just("sweep")),
    ),
    max_size=30,
)


@given(events)
@settings(max_examples=600, deadline=None)
def test_any_interleaving_runs_at_most_once_the_latest_version_never_after_a_cancel(
    script: list[tuple[object, ...]],
) -> None:
    w = World()
    for ev in script:
        if ev[0] == "command":
            _, op, delta, payload = ev
            w.command(str(op), DUE + int(delta), str(payload))  # type: ignore[call-overload]
        elif ev[0] == "fire":
            w.fire(int(ev[1]))  # type: ignore[call-overload]
        elif ev[0] == "finish":
            w.finish(str(ev[1]))
        elif ev[0] == "retry":
            w.deliver_retry()
        elif ev[0] == "sweep" and w.state is not None:
            # no outage longer than the grace: the earliest timer in the wheel is
            # at most that old, and no attempt runs (or waits to retry) that long
            earliest = min((t.due_ms for t in w.wheel), default=DUE + 10**6)
            if w.running or w.retry:
                earliest = min(earliest, NOW)
            after, changed = sweep(w.state, now_ms=earliest + GRACE - 1, grace_ms=GRACE)
            if changed:
                w.state = after
    w.drain()
    firsts = [r for r in w.runs if r[2] == 1]
    assert len(firsts) <= 1, f"ran {len(firsts)} times: {w.runs}"
    assert firsts or w.cancelled or w.key == "dead", "neither ran nor was cancelled"
    assert w.state is None, f"state left after the job ended: {steering.describe(w.state)}"
