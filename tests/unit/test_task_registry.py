"""@task, TaskRegistry and TaskContext (no broker)."""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any

import pytest

from dueflow.consumers import TaskContext, TaskRegistry, task
from dueflow.consumers.registry import TaskSpec, spec_of
from dueflow.errors import InvalidInput
from dueflow.model import Backoff, Job
from dueflow.records import codec
from dueflow.records.worker_codec import decode_job_fields


@task("send-invoice", queue="billing", timeout=30, max_attempts=5, rate_limit=10)
async def send_invoice(payload: Any, ctx: TaskContext) -> None:
    return None


@task
def plain(payload: Any, ctx: TaskContext) -> str:
    return "called"


def test_task_attaches_a_spec_and_returns_the_function_unchanged() -> None:
    assert plain(None, None) == "called"  # type: ignore[arg-type]
    assert spec_of(send_invoice) == TaskSpec(
        "send-invoice", queue="billing", timeout_s=30.0, max_attempts=5, rate_limit=10.0
    )
    assert spec_of(plain) == TaskSpec("plain")


def test_registry_from_functions_and_lookup() -> None:
    registry = TaskRegistry([send_invoice, plain])
    entry = registry.get("send-invoice")
    assert entry is not None
    assert entry.is_async
    assert entry.ref == f"{__name__}:send_invoice"
    assert registry.get("plain") is not None
    assert not registry.get("plain").is_async  # type: ignore[union-attr]
    assert registry.get("nope") is None
    assert "plain" in registry
    assert len(registry) == 2
    assert registry.queues == ["billing", "default"]


def test_registry_scans_modules() -> None:
    module = types.ModuleType("dueflow_test_tasks")

    @task("scanned", queue="q1")
    def scanned(payload: Any, ctx: TaskContext) -> None:
        return None

    module.scanned = scanned  # type: ignore[attr-defined]
    module.not_a_task = lambda: None  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        registry = TaskRegistry.from_modules([module.__name__])
    finally:
        del sys.modules[module.__name__]
    assert [t.spec.name for t in registry] == ["scanned"]
    with pytest.raises(InvalidInput, match="importable module"):
        TaskRegistry.from_modules(["no.such.module.anywhere"])
    with pytest.raises(InvalidInput, match=r"at least one @task"):
        TaskRegistry.from_modules(["json"])


def test_two_functions_cannot_share_a_task_name() -> None:
    @task("same")
    def one(payload: Any, ctx: TaskContext) -> None:
        return None

    @task("same")
    def two(payload: Any, ctx: TaskContext) -> None:
        return None

    registry = TaskRegistry([one])
    registry.add(one)  # the same function again is fine
    with pytest.raises(InvalidInput, match=r"task\.name"):
        registry.add(two)
    with pytest.raises(InvalidInput, match="decorated with @task"):
        registry.add(lambda p, c: None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout": 0}, "task.timeout"),
        ({"max_attempts": 0}, "task.max_attempts"),
        ({"rate_limit": -1}, "task.rate_limit"),
        ({"queue": "bad queue"}, "task.queue"),
        ({"isolation": "fiber"}, "task.isolation"),
        ({"backoff": 5}, "task.backoff"),
    ],
)
def test_bad_task_options_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        task("ok", **kwargs)(lambda p, c: None)


def test_async_handlers_cannot_be_process_isolated() -> None:
    async def handler(payload: Any, ctx: TaskContext) -> None:
        return None

    with pytest.raises(InvalidInput, match="isolation"):
        task("x", isolation="process")(handler)


def test_context_exposes_the_job_and_pickles_for_children() -> None:
    job = Job(
        "job-1",
        "billing",
        "send-invoice",
        b'{"a": 1}',
        1_000,
        "key-1",
        900,
        backoff=Backoff(),
        trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )
    fields = decode_job_fields(codec.encode("job", job.to_record()))
    ctx = TaskContext(fields, attempt=2, max_attempts=3, headers={}, source=("t", 1, 7))
    assert (ctx.job_id, ctx.idempotency_key, ctx.task, ctx.queue, ctx.due_ms) == (
        "job-1",
        "key-1",
        "send-invoice",
        "billing",
        1_000,
    )
    assert ctx.job == job
    assert ctx.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert not ctx.is_last_attempt
    again = pickle.loads(pickle.dumps(ctx))
    assert again.job == job
    assert (again.attempt, again.max_attempts, again.source) == (2, 3, ("t", 1, 7))
    assert ctx.logger.extra == {
        "job_id": "job-1",
        "queue": "billing",
        "task": "send-invoice",
        "attempt": 2,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
    }
