"""Handlers and hooks for the chain tests, run by ``dueflow worker --app`` processes.

Every run and every hook call is a row in the test's SQLite ledger
(``DUEFLOW_TEST_LEDGER``, or the payload's ``ledger``): ``runs`` has one row
per handler invocation (key, attempt, time, pid); a hook is a run of the key
``hook:<kind>[:...]``. ``effects`` counts a step's effect per key, made as the
handler's last statement, so a process killed once the effect is there was
killed after the handler returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dueflow.config import load_settings
from dueflow.consumers import TaskContext, WorkerInfo, on_failure, on_shutdown, on_startup, task
from dueflow.consumers.failures import Failure
from dueflow.kafka.topics import names
from tests.integration.worker_support import Ledger, outcomes_of, read_topic

QUEUE = "jobs"


def _ledger(payload: dict[str, Any] | None = None) -> Ledger:
    return Ledger(Path((payload or {}).get("ledger") or os.environ["DUEFLOW_TEST_LEDGER"]))


@task("chain-step", queue=QUEUE)
def chain_step(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Step ``step`` of ``of``: records its run, schedules the next step, then its effect."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    if payload["step"] < payload["of"]:
        ctx.schedule(
            "chain-step",
            {**payload, "step": payload["step"] + 1},
            delay=f"{payload.get('delay_ms', 0)}ms",
        )
    ledger.effect(ctx.idempotency_key)


@task("schedules-then-fails", queue=QUEUE, max_attempts=2)
def schedules_then_fails(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Schedules a follow-up, then fails until attempt ``succeed_at``."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    ctx.schedule("chain-step", {"step": 1, "of": 1, "ledger": payload.get("ledger")})
    if ctx.attempt < payload["succeed_at"]:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    ledger.effect(ctx.idempotency_key)


@on_startup
def opened(worker: WorkerInfo) -> None:
    if os.environ.get("DUEFLOW_TEST_STARTUP_FAILS"):
        raise ConnectionError("the test's database refused the connection")
    _ledger().run(f"hook:startup:{','.join(worker.tasks)}", 0)


@on_failure
def failed(job: TaskContext, error: Failure, will_retry: bool) -> None:
    _ledger().run(f"hook:failure:{job.idempotency_key}:{will_retry}:{error.summary}", job.attempt)


@on_shutdown
def closed(worker: WorkerInfo) -> None:
    """Records how many successes are committed when it runs: all of them, since it
    runs after the worker's last commit."""
    settings = load_settings(env=os.environ)
    records = read_topic(settings, names(settings).outcomes, timeout=20)
    committed = sum(1 for o in outcomes_of(records) if o["state"] == "succeeded")
    _ledger().run("hook:shutdown", committed)
