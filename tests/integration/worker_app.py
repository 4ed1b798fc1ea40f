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


@task("hang-first", queue="jobs", isolation="process", timeout=5.0)
def hang_first(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Hangs on the first attempt (killed at its timeout), succeeds on the next.

    The timeout counts the child's start too, which took over a second on a loaded
    CI machine: the second attempt then timed out as well."""
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


@task("block-loop-first", queue="jobs", timeout=1.0, max_attempts=3)
async def block_loop_first(payload: dict[str, Any], ctx: TaskContext) -> None:
    """An async handler that blocks the event loop (``time.sleep``) on its first
    attempt for ``block_s``, then makes the effect; a later attempt just makes it."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(float(payload["block_s"]))  # noqa: ASYNC251 - the mistake under test
    ledger.effect(ctx.idempotency_key)


@task("ledger-async", queue="jobs", timeout=10.0)
async def ledger_async(payload: dict[str, Any], ctx: TaskContext) -> None:
    """A well-behaved async handler: records its run, the process's resident memory
    and the effect."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    ledger.mark(ctx.idempotency_key, _rss())
    ledger.effect(ctx.idempotency_key)


_HOARD: list[bytes] = []  # what grow-memory keeps alive (the leak under test)


@task("grow-memory", queue="jobs", timeout=60.0)
def grow_memory(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Keeps ``mb`` MiB referenced for the life of the process (a leak), then makes
    the effect and records the process's resident memory."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    for _ in range(int(payload["mb"])):
        _HOARD.append(os.urandom(1) * 2**20)
    ledger.mark(ctx.idempotency_key, _rss())
    ledger.effect(ctx.idempotency_key)


def _rss() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@task("grow-without-end", queue="jobs", timeout=60.0, max_attempts=2)
def grow_without_end(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Allocates 10 MiB every 50 ms (up to ``cap_mb``) and never returns by itself."""
    ledger = _ledger(payload)
    ledger.run(ctx.idempotency_key, ctx.attempt)
    for _ in range(int(payload["cap_mb"]) // 10):
        _HOARD.append(os.urandom(1) * (10 * 2**20))
        time.sleep(0.05)
    time.sleep(3600)
