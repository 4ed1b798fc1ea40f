"""Routing: which queue a task's jobs go to (pure), and the route table settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dueflow.config import load_settings
from dueflow.consumers import TaskRegistry, task
from dueflow.consumers.worker_process import select_queues
from dueflow.errors import ConfigError, InvalidInput, UnknownQueue
from dueflow.producers.core import JobIds, PlannedTimer, TimerPlanner
from dueflow.producers.recent import RecentJobs
from dueflow.records.job_request import JobRequest, JobRules
from dueflow.rules.routing import Route, Router, served_queues

ROUTES = (
    ("billing.*", "billing"),
    ("billing.refund", "refunds"),  # exact: beats the glob before it
    ("report-?", "reports"),
    ("*", "catchall"),
)
DECLARED = {"send_email": "mail", "billing.charge": "declared"}


@pytest.mark.parametrize(
    ("routes", "declared", "task", "explicit", "expected"),
    [
        # 1. an explicit queue wins over everything
        (ROUTES, DECLARED, "billing.charge", "manual", Route("manual", "explicit")),
        # 2. the route table: an exact name first, then globs in order
        (ROUTES, DECLARED, "billing.refund", None, Route("refunds", "routes", "billing.refund")),
        (ROUTES, DECLARED, "billing.charge", None, Route("billing", "routes", "billing.*")),
        (ROUTES, DECLARED, "report-7", None, Route("reports", "routes", "report-?")),
        (ROUTES, DECLARED, "report-77", None, Route("catchall", "routes", "*")),
        # 3. the @task declaration when no route matches
        ((("billing.*", "billing"),), DECLARED, "send_email", None, Route("mail", "task")),
        # 4. else the default queue
        ((("billing.*", "billing"),), DECLARED, "other", None, Route("default", "default")),
        ((), {}, "anything", None, Route("default", "default")),
        # globs are case-sensitive and anchored
        ((("Billing.*", "billing"),), {}, "billing.x", None, Route("default", "default")),
        ((("bill", "billing"),), {}, "billing", None, Route("default", "default")),
    ],
)
def test_precedence_explicit_routes_task_default(
    routes: tuple[tuple[str, str], ...],
    declared: dict[str, str],
    task: str,
    explicit: str | None,
    expected: Route,
) -> None:
    router = Router(routes, declared)
    assert router.resolve(task, explicit) == expected
    if explicit is None:
        assert router.queue_for(task) == expected.queue
        assert router.queue_for(task) == expected.queue  # memoized: the same answer


def test_a_worker_selects_what_was_asked_else_where_its_tasks_route() -> None:
    @task("send", queue="mail")
    def send(_p: object, _c: object) -> None: ...

    @task("report.daily")
    def report(_p: object, _c: object) -> None: ...

    registry = TaskRegistry([send, report])
    routed = load_settings(env={}, overrides={"routes": {"report.*": "reports"}})
    assert select_queues(routed, registry, None) == ["mail", "reports"]
    assert select_queues(load_settings(env={}), registry, None) == ["mail", "default"]
    assert select_queues(routed, registry, ["x", "x", "y"]) == ["x", "y"]
    assert select_queues(routed, TaskRegistry(), None) == ["default"]  # the static ones


def test_workers_serve_the_queues_their_tasks_route_to() -> None:
    router = Router((("report-*", "reports"),), {"a": "billing", "b": "billing", "report-x": "x"})
    assert served_queues(router, ["a", "report-x", "b", "c"]) == ["billing", "reports", "default"]


@pytest.mark.parametrize(
    "routes",
    [
        {"billing.*": "billing", "report": "reports"},
        "billing.*=billing, report=reports",
        [["billing.*", "billing"], ["report", "reports"]],
    ],
)
def test_the_route_table_in_every_shape_keeps_its_order(routes: object) -> None:
    s = load_settings(env={}, overrides={"routes": routes})
    assert s.routes == (("billing.*", "billing"), ("report", "reports"))


def test_the_route_table_and_app_from_a_file_and_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "dueflow.toml"
    cfg.write_text('app = ["myapp.tasks"]\n[routes]\n"billing.*" = "billing"\nreport = "reports"\n')
    s = load_settings(config_file=cfg, env={})
    assert s.routes == (("billing.*", "billing"), ("report", "reports"))
    assert s.app == ("myapp.tasks",)
    s = load_settings(env={"DUEFLOW_ROUTES": "x=y", "DUEFLOW_APP": "a.tasks, b.tasks"})
    assert (s.routes, s.app) == ((("x", "y"),), ("a.tasks", "b.tasks"))


@pytest.mark.parametrize(
    ("routes", "setting", "fragment"),
    [
        ({"billing.*": "bad/queue"}, "routes[billing.*]", "a queue name"),
        ("no-equals-sign", "routes", "PATTERN=QUEUE"),
        ({"x": 3}, "routes[x]", "a string"),
    ],
)
def test_a_bad_route_names_the_setting(routes: object, setting: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, overrides={"routes": routes})
    assert info.value.setting == setting
    assert fragment in str(info.value)


def test_a_bad_app_module_name_is_named() -> None:
    with pytest.raises(ConfigError, match="dotted module name"):
        load_settings(env={"DUEFLOW_APP": "my-app/tasks"})


# ------------------------------------------------------------------ the planner

NOW = 1_800_000_000_000
SETTINGS = load_settings(env={}, overrides={"queues": "default,billing", "routes": {"r*": "r"}})


def _planner(lookup: Any = None) -> TimerPlanner:
    rules = JobRules.from_settings(SETTINGS, declared={"charge": "billing", "gone": "nowhere"})
    return TimerPlanner(
        SETTINGS, recent=RecentJobs(), ids=JobIds(), rules=rules, queue_lookup=lookup
    )


@pytest.mark.parametrize(
    ("req", "queue"),
    [
        (JobRequest("charge"), "billing"),  # @task declaration
        (JobRequest("charge", queue="default"), "default"),  # explicit wins
        (JobRequest("other"), "default"),
        (JobRequest("charge", jitter="1s"), "billing"),  # the general path routes too
    ],
)
def test_the_planner_routes_a_job_without_a_queue(req: JobRequest, queue: str) -> None:
    planned = _planner().plan(req, now_ms=NOW)
    assert isinstance(planned, PlannedTimer)
    assert planned.job.queue == queue
    assert (b"df-queue", queue.encode()) in [(k.encode(), v) for k, v in planned.record.headers]


@pytest.mark.parametrize(
    "req",
    [JobRequest("gone"), JobRequest("rx"), JobRequest("t", queue="billingz", jitter="1s")],
)
def test_a_job_for_a_queue_that_does_not_exist_is_refused_with_the_queue_named(
    req: JobRequest,
) -> None:
    asked: list[str] = []

    def lookup(queue: str) -> bool:
        asked.append(queue)
        return False

    with pytest.raises(UnknownQueue) as info:
        _planner(lookup).plan(req, now_ms=NOW)
    queue = info.value.queue
    assert asked == [queue]  # the registry was asked before refusing
    assert f"dueflow queue create {queue} --partitions N" in str(info.value)


def test_a_queue_the_lookup_finds_is_used() -> None:
    planner = _planner()

    def lookup(queue: str) -> bool:
        planner.set_queues({"default", "billing", queue})  # what the registry watcher does
        return True

    planner.queue_lookup = lookup
    planned = planner.plan(JobRequest("gone"), now_ms=NOW)
    assert isinstance(planned, PlannedTimer)
    assert planned.job.queue == "nowhere"
    assert "nowhere" in planner.rules.queues


# ------------------------------------------------------------ the app's tasks


def _app_planner() -> TimerPlanner:
    """A producer that knows its app (``app=``, ``--app``): the tasks it declares."""
    declared = {"charge": "billing", "send-invoice": "billing"}
    rules = JobRules.from_settings(SETTINGS, declared=declared, known_tasks=declared)
    return TimerPlanner(SETTINGS, recent=RecentJobs(), ids=JobIds(), rules=rules)


@pytest.mark.parametrize(
    "req",
    [
        JobRequest("send-invoce"),  # the plain path of schedule_many
        JobRequest("send-invoce", jitter="1s"),  # the general path
        JobRequest("send-invoce", queue="billing"),  # an explicit queue does not hide it
    ],
)
def test_a_producer_that_knows_its_app_refuses_a_task_it_does_not_declare(
    req: JobRequest,
) -> None:
    with pytest.raises(InvalidInput) as info:
        _app_planner().plan(req, now_ms=NOW)
    text = str(info.value)
    assert info.value.field == "task"
    assert "got 'send-invoce'" in text
    assert "did you mean 'send-invoice'?" in text
    assert "'charge', 'send-invoice'" in text  # what it knows


def test_declared_and_routed_tasks_pass_the_app_check() -> None:
    assert isinstance(_app_planner().plan(JobRequest("charge"), now_ms=NOW), PlannedTimer)
    # "rx": not the app's, but the route table (r* -> r) names it: another service's
    with pytest.raises(UnknownQueue, match="got 'r'"):  # past the task check
        _app_planner().plan(JobRequest("rx"), now_ms=NOW)


def test_without_an_app_any_valid_task_name_is_accepted() -> None:
    assert isinstance(_planner().plan(JobRequest("send-invoce"), now_ms=NOW), PlannedTimer)
    assert JobRules.from_settings(SETTINGS, declared={"charge": "billing"}).known_tasks is None
