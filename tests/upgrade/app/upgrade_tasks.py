"""The handler of the upgrade tests, loaded by workers of every release.

Workers import it as ``upgrade_tasks`` (``--app upgrade_tasks``) with only
this folder on ``PYTHONPATH``, so a worker of the previous release imports its
own dueflow and nothing else of this tree: the module uses only what every
release has (``task``, ``TaskContext``, ``PermanentJobError``) and the
standard library.

``upgrade-job`` does what its payload's ``kind`` says, on every attempt, then
writes one row to the ledger (``DUEFLOW_UPGRADE_LEDGER``, the table of
``tests/upgrade/ledger.py``; a row in ``started`` when it starts) with the worker's release
(``DUEFLOW_UPGRADE_RELEASE``):

- ``ok``: succeeds after ``work_ms``; ``slow``: the same, with a longer ``work_ms``
- ``flaky``: attempt 1 fails (retriable), attempt 2 succeeds
- ``permanent``: raises a permanent error (dead-lettered at once)
- ``exhausted``: fails every attempt (dead-lettered when they are used up)

A job redriven from the DLQ (``df-redriven-at``) succeeds whatever its kind. The
payload's ``tag``, if any, goes into the row too: it tells which version of an
updated job's payload ran.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import dueflow
from dueflow.consumers import TaskContext, task
from dueflow.errors import PermanentJobError

TASK = "upgrade-job"
QUEUE = "jobs"


def outcome_of(kind: str, attempt: int, *, redriven: bool) -> str:
    """What an attempt of a job of ``kind`` does: ``ok``, ``fail`` or ``permanent``."""
    if redriven or kind in ("ok", "slow"):
        return "ok"
    if kind == "flaky":
        return "fail" if attempt == 1 else "ok"
    if kind == "permanent":
        return "permanent"
    return "fail"  # exhausted, and any kind this module does not know


def _ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["DUEFLOW_UPGRADE_LEDGER"], timeout=30, isolation_level=None)
    # No fsync per row: a write survives its process's kill -9 without one, and on a
    # machine whose disk is busy an fsync held the write lock long enough for other
    # handlers to overrun their 30 s timeout waiting for it.
    db.execute("PRAGMA synchronous=OFF")
    return db


def _started(ctx: TaskContext, started_ms: int, work_ms: float) -> None:
    db = _ledger()
    try:
        db.execute(
            "INSERT INTO started (job_id, attempt, pid, started_ms, works_until_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (ctx.job_id, ctx.attempt, os.getpid(), started_ms, started_ms + int(work_ms)),
        )
    finally:
        db.close()


def _record(
    ctx: TaskContext, payload: dict[str, Any], started_ms: int, result: str, redriven: bool
) -> None:
    db = _ledger()
    try:
        db.execute(
            "INSERT INTO runs (job_id, kind, attempt, due_ms, started_ms, ended_ms, result, "
            "pid, release, dueflow_path, redriven, tag) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                ctx.job_id,
                str(payload.get("kind", "ok")),
                ctx.attempt,
                ctx.due_ms,
                started_ms,
                time.time_ns() // 1_000_000,
                result,
                os.getpid(),
                os.environ["DUEFLOW_UPGRADE_RELEASE"],
                dueflow.__file__,
                int(redriven),
                str(payload.get("tag", "")),
            ),
        )
    finally:
        db.close()


@task(TASK, queue=QUEUE)
def upgrade_job(payload: dict[str, Any], ctx: TaskContext) -> None:
    started_ms = time.time_ns() // 1_000_000
    kind = str(payload.get("kind", "ok"))
    redriven = "df-redriven-at" in ctx.headers
    result = outcome_of(kind, ctx.attempt, redriven=redriven)
    work_ms = float(payload.get("work_ms", 0))
    _started(ctx, started_ms, work_ms)
    time.sleep(work_ms / 1000)  # the job's work: in flight meanwhile
    _record(ctx, payload, started_ms, result, redriven)
    if result == "fail":
        raise RuntimeError(f"{kind} job, attempt {ctx.attempt}: failing as planned")
    if result == "permanent":
        raise PermanentJobError(f"{kind} job: failing for good as planned")
