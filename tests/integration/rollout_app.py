"""Task handler of the rolling-update test (run by ``dueflow worker`` subprocesses).

``rollout-job`` writes one row per run (job id, attempt, due time, start time,
pid) to the SQLite file at ``DUEFLOW_TEST_RUNS``, then works for
``work_ms``: jobs are in flight whenever a worker is told to stop.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, task


class RunLog:
    """Every handler run, in a SQLite file the test owns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs "
                "(job_id TEXT, attempt INTEGER, due_ms INTEGER, started_ms INTEGER, pid INTEGER)"
            )

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def add(self, job_id: str, attempt: int, due_ms: int, started_ms: int) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?)",
                (job_id, attempt, due_ms, started_ms, os.getpid()),
            )

    def runs(self) -> list[tuple[str, int, int, int, int]]:
        with self._db() as db:
            return list(db.execute("SELECT job_id, attempt, due_ms, started_ms, pid FROM runs"))


@task("rollout-job", queue="jobs")
def rollout_job(payload: dict[str, Any], ctx: TaskContext) -> None:
    started = time.time_ns() // 1_000_000
    RunLog(Path(os.environ["DUEFLOW_TEST_RUNS"])).add(ctx.job_id, ctx.attempt, ctx.due_ms, started)
    time.sleep(float(payload.get("work_ms", 0)) / 1000)
