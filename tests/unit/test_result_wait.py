"""``Scheduler.result``'s rule and its waiting (no broker: a fake lookup and clock)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from dueflow.errors import (
    InvalidInput,
    JobCancelled,
    JobFailed,
    JobNotRun,
    ResultNotKept,
    ResultTimeout,
)
from dueflow.producers.result_wait import (
    LOOKUP_MIN_S,
    POLL_MAX_S,
    await_result,
    check_timeout,
    settled,
    wait_for_result,
)
from dueflow.rules.job_status import JobStatus


def status(state: str, **fields: Any) -> JobStatus:
    view = {"job_id": "j", "queue": "q", "task": "t", "state": state, "attempts": 3, **fields}
    return JobStatus.from_view(view)


def test_a_succeeded_job_gives_its_result() -> None:
    assert settled("j", status("succeeded", result={"a": 1})) == (True, {"a": 1})
    assert settled("j", status("succeeded")) == (True, None)  # it returned None


@pytest.mark.parametrize("state", ["scheduled", "rescheduled", "retrying", "started", "fired"])
def test_a_job_that_has_not_ended_is_not_settled(state: str) -> None:
    assert settled("j", status(state)) == (False, None)
    assert settled("j", None) == (False, None)


def test_a_dead_job_raises_job_failed_with_its_last_error() -> None:
    dead = status("dead", last_error={"type": "ValueError", "message": "bad row", "attempt": 3})
    with pytest.raises(JobFailed) as err:
        settled("j", dead)
    assert (err.value.error_type, err.value.error, err.value.attempts) == (
        "ValueError",
        "bad row",
        3,
    )
    assert str(err.value) == "job 'j' is dead after 3 attempt(s): ValueError: bad row"
    assert err.value.state == "dead"
    assert not err.value.retriable


@pytest.mark.parametrize(
    ("state", "error"),
    [("cancelled", JobCancelled), ("expired", JobNotRun), ("skipped", JobNotRun)],
)
def test_a_job_that_ended_without_running_raises(state: str, error: type[Exception]) -> None:
    with pytest.raises(error, match=state if state != "cancelled" else "was cancelled"):
        settled("j", status(state))


def test_a_result_not_kept_raises_with_why() -> None:
    with pytest.raises(ResultNotKept, match="result of 9 bytes exceeds"):
        settled("j", status("succeeded", result_error="result of 9 bytes exceeds ..."))


class Fake:
    """A clock and a lookup that answers ``answers`` in turn (the last one forever)."""

    def __init__(self, *answers: JobStatus | None, lookup_s: float = 0.01) -> None:
        self.now = 100.0
        self.answers = list(answers)
        self.budgets: list[float] = []
        self.sleeps: list[float] = []
        self.lookup_s = lookup_s

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def lookup(self, budget: float) -> JobStatus | None:
        self.budgets.append(budget)
        self.now += self.lookup_s
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_waiting_asks_again_until_the_job_ends() -> None:
    fake = Fake(None, status("scheduled"), status("started"), status("succeeded", result=7))
    got = wait_for_result("j", fake.lookup, 30.0, clock=fake.clock, sleep=fake.sleep)
    assert got == 7
    assert fake.sleeps == [0.05, 0.1, 0.2]  # more and more rarely


def test_a_job_that_never_ends_raises_result_timeout_on_time() -> None:
    fake = Fake(status("started"))
    with pytest.raises(ResultTimeout) as err:
        wait_for_result("j", fake.lookup, 5.0, clock=fake.clock, sleep=fake.sleep)
    assert err.value.state == "started"
    assert err.value.retriable
    assert "did not finish within 5 s (it is started)" in str(err.value)
    assert 105.0 <= fake.now <= 105.0 + LOOKUP_MIN_S  # at the deadline, never long after
    assert max(fake.sleeps) == POLL_MAX_S
    assert min(fake.budgets) == LOOKUP_MIN_S  # the last lookup is given the least time


def test_an_unknown_job_times_out_saying_so() -> None:
    fake = Fake(None)
    with pytest.raises(ResultTimeout, match="no outcome of it was found"):
        wait_for_result("j", fake.lookup, 0, clock=fake.clock, sleep=fake.sleep)
    assert fake.sleeps == []  # timeout 0: one look


def test_the_awaitable_waits_the_same_way() -> None:
    answers = [status("started"), status("started"), status("succeeded", result=[1])]

    async def lookup(budget: float) -> JobStatus | None:
        return answers.pop(0)

    assert asyncio.run(await_result("j", lookup, 10.0)) == [1]

    async def never(budget: float) -> JobStatus | None:
        return status("scheduled")

    async def timed() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ResultTimeout):
            await await_result("j", never, 0.3)
        return loop.time() - start

    assert asyncio.run(timed()) >= 0.3  # never before the deadline


@pytest.mark.parametrize("bad", [-1, math.nan, "5", True])
def test_a_bad_timeout_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInput, match="timeout"):
        check_timeout(bad)
    assert check_timeout(None) is None
    assert check_timeout(math.inf) is None
    assert check_timeout(2) == 2.0
