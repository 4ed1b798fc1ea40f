"""The keyword sets of the scheduling calls are declared once
(dueflow.producers.call_options, dueflow.records.job_request) and every surface
takes them from there; a keyword outside a set is refused with an error naming it."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import fields
from typing import Any

import pytest

from dueflow import InvalidInput, task
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.context import TaskContext
from dueflow.producers.aio import AsyncScheduler
from dueflow.producers.call_options import (
    CRON_CHANGE_KEYWORDS,
    CRON_DEFINITION_KEYWORDS,
    SCHEDULE_KEYWORDS,
)
from dueflow.producers.scheduler import Scheduler
from dueflow.records.job_options import JOB_KEYWORDS, REQUEST_KEYWORDS, UnknownKeyword
from dueflow.records.job_request import JobRequest
from dueflow.testing import InMemoryPipeline


@task("t")
def handler(payload: Any, ctx: Any) -> None:
    pass


def test_a_job_request_has_the_fields_of_its_option_set() -> None:
    assert {f.name for f in fields(JobRequest)} == {"task", "payload"} | REQUEST_KEYWORDS
    assert {"expires", "max_lateness"} == REQUEST_KEYWORDS - JOB_KEYWORDS
    assert {
        "unique_key",
        "unique_for",
        "unique_until",
        "on_duplicate",
        "debounce",
        "admission_wait",
    } == SCHEDULE_KEYWORDS - REQUEST_KEYWORDS
    assert {"paused"} == CRON_DEFINITION_KEYWORDS - CRON_CHANGE_KEYWORDS
    assert len(CRON_DEFINITION_KEYWORDS) == 15  # and the schedule id: add_schedule's 16


@pytest.mark.parametrize(
    ("method", "options"),
    [
        (Scheduler.schedule, "ScheduleOptions"),
        (AsyncScheduler.schedule, "ScheduleOptions"),
        (TaskContext.schedule, "JobOptions"),
        (Scheduler.add_schedule, "CronDefinition"),
        (AsyncScheduler.add_schedule, "CronDefinition"),
        (Scheduler.update_schedule, "CronChanges"),
        (AsyncScheduler.update_schedule, "CronChanges"),
    ],
)
def test_every_scheduling_surface_takes_its_keywords_from_one_option_set(
    method: Any, options: str
) -> None:
    variadic = [p for p in inspect.signature(method).parameters.values() if p.kind is p.VAR_KEYWORD]
    assert [str(p.annotation) for p in variadic] == [f"Unpack[{options}]"]


def test_a_misspelled_keyword_of_schedule_is_named_with_the_one_meant() -> None:
    with InMemoryPipeline([handler]) as p:
        with pytest.raises(UnknownKeyword) as err:
            p.scheduler.schedule("t", {}, dealy="10m")  # type: ignore[call-arg]
        assert err.value.field == "dealy"
        assert err.value.value == "10m"
        assert "schedule()" in str(err.value)
        assert "did you mean 'delay'?" in str(err.value)
        # an InvalidInput as every bad input, and the TypeError Python gives
        assert isinstance(err.value, InvalidInput)
        assert isinstance(err.value, TypeError)
        with pytest.raises(UnknownKeyword, match=r"^colour: got 'red'; accepted: a keyword"):
            p.scheduler.schedule("t", {}, colour="red")  # type: ignore[call-arg]
        assert p.pending() == []  # nothing written
        ok = p.scheduler.schedule("t", {}, delay="10m", unique_key=None)
        assert [j.job_id for j in p.pending()] == [ok.job_id]


def test_the_async_client_names_an_unknown_keyword_before_anything_else() -> None:
    client = AsyncScheduler(Settings(queues=(QueueSpec("default"),)).validate())
    with pytest.raises(UnknownKeyword, match=r"idempotency_kye.*did you mean 'idempotency_key'"):
        asyncio.run(client.schedule("t", idempotency_kye="k"))  # type: ignore[call-arg]


def test_a_follow_up_takes_no_deadline_and_names_a_misspelled_keyword() -> None:
    ctx = TaskContext.for_test("parent", {})
    with pytest.raises(UnknownKeyword) as err:
        ctx.schedule("child", expires="2030-01-01T00:00:00Z")  # type: ignore[call-arg]
    assert err.value.field == "expires"
    assert "ctx.schedule()" in str(err.value)
    with pytest.raises(UnknownKeyword, match="did you mean 'max_attempts'"):
        ctx.schedule("child", max_attempt=2)  # type: ignore[call-arg]
    ctx.schedule("child", {"n": 1}, delay=5, max_attempts=2, queue="default")
    # the refused calls kept nothing: the one follow-up is the first call's index
    assert [(f.task, f.queue, f.call_index) for f in ctx.follow_ups] == [("child", "default", 0)]


def test_cron_calls_name_an_unknown_or_missing_keyword() -> None:
    with InMemoryPipeline([handler]) as p:
        s = p.scheduler
        with pytest.raises(UnknownKeyword, match="did you mean 'timezone'"):
            s.add_schedule("n", cron="0 3 * * *", timzone="UTC", task="t")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="missing required keyword argument: 'timezone'"):
            s.add_schedule("n", cron="0 3 * * *", task="t")  # type: ignore[call-arg]
        added = s.add_schedule("n", cron="0 3 * * *", timezone="UTC", task="t", paused=True)
        assert added.paused
        with pytest.raises(UnknownKeyword, match=r"^paused: .*update_schedule\(\)"):
            s.update_schedule("n", paused=False)  # type: ignore[call-arg]
        moved = s.update_schedule("n", cron="0 4 * * *")
        assert (moved.cron, moved.paused, moved.version > added.version) == (
            "0 4 * * *",
            True,
            True,
        )
