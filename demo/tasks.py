"""The demo's task handlers (``dueflow worker --app demo.tasks``).

Each records its attempt in the demo ledger (:mod:`demo.ledger`) and,
when it succeeds, applies its "effect" there. The payload says how a job
behaves: ``fail_times`` makes the first attempts fail (retried with
backoff), ``always_fail`` makes every attempt fail (the job ends in the DLQ).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from demo.ledger import ENV, LedgerWriter
from dueflow.consumers import TaskContext, task
from dueflow.wall_clock import wall_ms

_writer: LedgerWriter | None = None


class DemoFailure(RuntimeError):
    """What a demo job raises when its payload says it fails (retriable)."""


def _ledger() -> LedgerWriter:
    # One writer per worker process, created on the first job (not at import:
    # the module is also imported where no ledger is configured).
    global _writer
    if _writer is None:
        _writer = LedgerWriter(Path(os.environ[ENV]))
    return _writer


def _run(payload: Any, ctx: TaskContext, started_ms: int) -> None:
    """Fail as the payload says, else apply the effect; record the attempt either way."""
    fail = isinstance(payload, dict) and (
        payload.get("always_fail") or ctx.attempt <= int(payload.get("fail_times", 0))
    )
    _ledger().record(
        key=ctx.idempotency_key,
        task=ctx.task,
        attempt=ctx.attempt,
        due_ms=ctx.due_ms,
        started_ms=started_ms,
        ok=not fail,
    )
    if fail:
        raise DemoFailure(f"{ctx.task}: attempt {ctx.attempt} failed as planned")


@task("email.send", queue="emails")
async def send_email(payload: Any, ctx: TaskContext) -> None:
    """An I/O-bound job: waits ~1 ms as a mail API call would, then applies its effect."""
    started = wall_ms()
    await asyncio.sleep(0.001)
    _run(payload, ctx, started)


@task("payment.charge", queue="emails")
async def charge(payload: Any, ctx: TaskContext) -> None:
    """A flaky job: its first ``fail_times`` attempts fail (a gateway timeout)."""
    _run(payload, ctx, wall_ms())


@task("webhook.deliver", queue="emails", max_attempts=3)
async def deliver_webhook(payload: Any, ctx: TaskContext) -> None:
    """A job whose endpoint is down for good: three attempts, then the DLQ."""
    _run(payload, ctx, wall_ms())


@task("report.build", queue="reports", timeout=10)
def build_report(payload: Any, ctx: TaskContext) -> None:
    """A blocking job on a worker thread (a 2 ms call to a reporting database)."""
    started = wall_ms()
    time.sleep(0.002)
    _run(payload, ctx, started)


@task("metrics.rollup", queue="reports")
def rollup(payload: Any, ctx: TaskContext) -> None:
    """Run by a cron schedule (every 2 seconds)."""
    _run(payload, ctx, wall_ms())


@task("digest.send", queue="emails")
async def digest(payload: Any, ctx: TaskContext) -> None:
    """Run by a cron schedule in Europe/Paris (every 5 seconds)."""
    _run(payload, ctx, wall_ms())
