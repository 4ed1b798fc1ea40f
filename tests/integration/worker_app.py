"""Task handlers for worker tests that run in other processes (CLI workers, isolation).

The ledger path comes from ``DUEFLOW_TEST_LEDGER`` (set by the test that
starts the process) or from the payload.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, task
from tests.integration.worker_support import Ledger


def _ledger(payload: dict[str, Any]) -> Ledger:
    return Ledger(Path(payload.get("ledger") or os.environ["DUEFLOW_TEST_LEDGER"]))


@task("ledger-effect", queue="jobs")
def ledger_effect(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Record the run, wait ``sleep_s``, then make the effect (count per key)."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    time.sleep(float(payload.get("sleep_s", 0)))
    ledger.effect(ctx.idempotency_key)


@task("hang-first", queue="jobs", isolation="process", timeout=1.0)
def hang_first(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Hangs on the first attempt (killed at its timeout), succeeds on the next."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(3600)
    ledger.effect(ctx.idempotency_key)


@task("fails-once", queue="jobs", max_attempts=3)
def fails_once(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Records the run; the first attempt fails, the next one makes the effect."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    ledger.effect(ctx.idempotency_key)
