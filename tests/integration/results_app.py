"""Handlers for the results and progress tests, run by ``dueflow worker --app`` processes.

Every run is a row in the test's SQLite ledger (``DUEFLOW_TEST_LEDGER``):
``runs`` has one row per handler invocation (key, attempt, time, pid), and a
handler's effect, its last statement before it returns, is counted in
``effects`` (a process killed once the effect is there was killed after the
handler returned). A number a handler measured is a run of the key
``<key>:<what>`` with the number as its attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, task
from dueflow.errors import PermanentJobError
from tests.integration.worker_support import Ledger

QUEUE = "jobs"


def _ledger() -> Ledger:
    return Ledger(Path(os.environ["DUEFLOW_TEST_LEDGER"]))


@task("sum-rows", queue=QUEUE)
def sum_rows(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Returns the sum of its rows and the pid of the process that ran it."""
    ledger = _ledger()
    ledger.run(ctx.idempotency_key, ctx.attempt)
    result = {"sum": sum(payload["rows"]), "pid": os.getpid()}
    ledger.effect(ctx.idempotency_key)
    return result


@task("isolated-sum", queue=QUEUE, isolation="process")
def isolated_sum(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """In a child process: reports progress, returns the sum."""
    ctx.progress(0.5, {"half": True})
    _ledger().run(ctx.idempotency_key, ctx.attempt)
    return {"sum": sum(payload["rows"])}


@task("echo", queue=QUEUE)
def echo(payload: Any, ctx: TaskContext) -> Any:
    """Returns what the payload says to return (``{"return": ...}``), ``times`` over."""
    _ledger().run(ctx.idempotency_key, ctx.attempt)
    value = payload["return"]
    return value * payload["times"] if "times" in payload else value


@task("returns-a-set", queue=QUEUE)
def returns_a_set(payload: Any, ctx: TaskContext) -> set[int]:
    _ledger().run(ctx.idempotency_key, ctx.attempt)
    return {1, 2, 3}


@task("small-result", queue=QUEUE, result_max_bytes=1_000)
def small_result(payload: Any, ctx: TaskContext) -> str:
    _ledger().run(ctx.idempotency_key, ctx.attempt)
    return "y" * 2_000


@task("parent", queue=QUEUE)
def parent(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Schedules a child that receives its result."""
    ctx.schedule("child", {"label": payload["label"]}, pass_result=True)
    return {"total": sum(payload["rows"])}


@task("child", queue=QUEUE)
def child(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"label": payload["label"], "parent": ctx.parent_result, "from": ctx.parent_job_id}


@task("fails", queue=QUEUE)
def fails(payload: Any, ctx: TaskContext) -> None:
    raise PermanentJobError("the account is closed")


@task("chatty", queue=QUEUE, timeout=120)
def chatty(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    """Reports progress up to ``rate`` times a second until the file ``stop`` exists
    (or ``seconds`` passed); records its start, its end and its reports."""
    ledger = _ledger()
    key = ctx.idempotency_key
    ledger.run(key, ctx.attempt)
    stop = Path(payload["stop"]) if payload.get("stop") else None
    seconds = float(payload.get("seconds", 60))
    rate = int(payload.get("rate", 10_000))
    started = time.monotonic()
    reports = 0
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds or (stop is not None and reports % 1_000 == 0 and stop.exists()):
            break
        ctx.progress(min(1.0, elapsed / seconds), {"reports": reports})
        reports += 1
        ahead = reports / rate - (time.monotonic() - started)
        if ahead > 0.001:
            time.sleep(ahead)  # no faster than `rate` a second
    elapsed_ms = int((time.monotonic() - started) * 1000)
    ledger.run(f"{key}:reports", reports)
    ledger.run(f"{key}:elapsed_ms", elapsed_ms)
    ledger.effect(key)
    return {"reports": reports}


@task("quiet-slow", queue=QUEUE)
def quiet_slow(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Runs ``seconds`` without a word: a long job shows as running all the same."""
    _ledger().run(ctx.idempotency_key, ctx.attempt)
    time.sleep(float(payload["seconds"]))
