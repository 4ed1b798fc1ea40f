"""The handler of the steering failover tests (run by ``dueflow worker`` subprocesses):
every run goes to the ledger file named by ``STEER_LEDGER``. No test imports here: a
worker process loads this module."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow.consumers import TaskContext, task

QUEUE = "jobs"


class RunLedger:
    """Every handler run: job id, attempt, payload (JSON text), version header, wall
    time, pid; in a SQLite file, so processes can share it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs (job TEXT, attempt INTEGER, payload TEXT, "
                "version TEXT, at REAL, pid INTEGER)"
            )

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def add(self, payload: Any, ctx: TaskContext) -> None:
        version = (ctx.headers.get(hdr.VERSION) or b"").decode()
        with self._db() as db:
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                (
                    ctx.job_id,
                    ctx.attempt,
                    orjson.dumps(payload).decode(),
                    version,
                    time.time(),
                    os.getpid(),
                ),
            )

    def runs(self, job_id: str | None = None) -> list[tuple[str, int, Any, str, float, int]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT job, attempt, payload, version, at, pid FROM runs ORDER BY at"
            ).fetchall()
        return [
            (str(j), int(a), orjson.loads(p), str(v), float(t), int(pid))
            for j, a, p, v, t, pid in rows
            if job_id is None or j == job_id
        ]


@task("steered", queue=QUEUE)
def steered(payload: Any, ctx: TaskContext) -> None:
    RunLedger(Path(os.environ["STEER_LEDGER"])).add(payload, ctx)
