"""Task handlers of the chaos suite (run by `dueflow worker --app tests.chaos.handlers`).

Every handler records its run in the ledger (``DUEFLOW_CHAOS_LEDGER``, with the
delivery's ``df-version`` and the payload's ``v``: which version of a steered job
ran), then
makes its idempotent effect, unless it is meant to fail, and records when and
how the run ended (the judge checks retries against it):

- ``chaos-ok``: succeeds (after ``sleep_ms``);
- ``chaos-flaky``: fails its first ``fail_times`` attempts, then succeeds;
- ``chaos-doomed``: always fails (retriable): ends in the DLQ, ``exhausted``;
- ``chaos-permanent``: raises ``PermanentJobError``: DLQ at once;
- ``chaos-cron``: the cron schedules' task, succeeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dueflow.consumers import TaskContext, task
from dueflow.errors import JobError, PermanentJobError
from dueflow.model import Backoff, BackoffKind
from tests.chaos.ledger import Ledger, Run, now_ms

QUEUE = "chaos"
_LEDGER: Ledger | None = None
# Short fixed retries: a flaky job is done within seconds. The judge reads these
# (tests/chaos/evidence.py: retry plans).
RETRY_BACKOFF_MS = 500
FLAKY_MAX_ATTEMPTS = 5
DOOMED_MAX_ATTEMPTS = 3
_RETRY = Backoff(
    kind=BackoffKind.FIXED, base_ms=RETRY_BACKOFF_MS, max_ms=RETRY_BACKOFF_MS, jitter=False
)


def _ledger() -> Ledger:
    global _LEDGER
    if _LEDGER is None:
        _LEDGER = Ledger(os.environ["DUEFLOW_CHAOS_LEDGER"])
    return _LEDGER


@contextmanager
def _attempt(payload: Any, ctx: TaskContext) -> Iterator[Ledger]:
    """Record the run, sleep its ``sleep_ms``, and when the body returns or raises, the end."""
    ledger = _ledger()
    not_before = ctx.headers.get("df-due")
    version = ctx.headers.get("df-version")
    payload_v = payload.get("v") if isinstance(payload, dict) else None
    run_id = ledger.record_run(
        Run(
            key=ctx.idempotency_key,
            job_id=ctx.job_id,
            task=ctx.task,
            attempt=ctx.attempt,
            started_ms=now_ms(),
            due_ms=ctx.due_ms,
            not_before_ms=int(not_before) if not_before else ctx.due_ms,
            pid=os.getpid(),
            version=version.decode() if version else None,
            payload_v=payload_v if isinstance(payload_v, int) else None,
        )
    )
    result = "failed"
    try:
        sleep_ms = payload.get("sleep_ms", 0) if isinstance(payload, dict) else 0
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        yield ledger
        result = "ok"
    finally:
        ledger.record_end(run_id, ended_ms=now_ms(), result=result)


def _effect(ledger: Ledger, ctx: TaskContext) -> None:
    ledger.apply_effect(ctx.idempotency_key, ctx.job_id, ctx.task, ctx.attempt)


@task("chaos-ok", queue=QUEUE, timeout=60)
def chaos_ok(payload: Any, ctx: TaskContext) -> None:
    with _attempt(payload, ctx) as ledger:
        _effect(ledger, ctx)


@task("chaos-flaky", queue=QUEUE, timeout=60, max_attempts=FLAKY_MAX_ATTEMPTS, backoff=_RETRY)
def chaos_flaky(payload: Any, ctx: TaskContext) -> None:
    with _attempt(payload, ctx) as ledger:
        if ctx.attempt <= int(payload.get("fail_times", 1)):
            raise JobError(f"flaky: attempt {ctx.attempt} fails on purpose")
        _effect(ledger, ctx)


@task("chaos-doomed", queue=QUEUE, timeout=60, max_attempts=DOOMED_MAX_ATTEMPTS, backoff=_RETRY)
def chaos_doomed(payload: Any, ctx: TaskContext) -> None:
    with _attempt(payload, ctx):
        raise JobError(f"doomed: attempt {ctx.attempt} fails on purpose")


@task("chaos-permanent", queue=QUEUE, timeout=60)
def chaos_permanent(payload: Any, ctx: TaskContext) -> None:
    with _attempt(payload, ctx):
        raise PermanentJobError("permanent: this job can never succeed")


@task("chaos-cron", queue=QUEUE, timeout=60)
def chaos_cron(payload: Any, ctx: TaskContext) -> None:
    with _attempt(payload, ctx) as ledger:
        _effect(ledger, ctx)
