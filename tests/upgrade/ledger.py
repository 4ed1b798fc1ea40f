"""The ledger of the upgrade tests: one row per handler run, in a SQLite file.

The handler (``tests/upgrade/app/upgrade_tasks.py``, run by workers of both
releases) inserts a row into ``started`` when an attempt starts and one into
``runs`` when it ends, naming the columns below; the test creates the tables
before any worker starts, watches them (:meth:`Ledger.busy`) and reads them at
the end.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLUMNS = (
    "job_id TEXT, kind TEXT, attempt INTEGER, due_ms INTEGER, started_ms INTEGER, "
    "ended_ms INTEGER, result TEXT, pid INTEGER, release TEXT, dueflow_path TEXT, "
    "redriven INTEGER, tag TEXT"
)
STARTED_COLUMNS = (
    "job_id TEXT, attempt INTEGER, pid INTEGER, started_ms INTEGER, works_until_ms INTEGER"
)
# A job counts as in hand when its work has at least this long to go: one about to
# end may have ended (its end time taken) before its row is written.
IN_HAND_MS = 300


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a handler: which job and attempt, when, how it ended, on which release."""

    job_id: str
    kind: str
    attempt: int
    due_ms: int  # what the worker told the handler (TaskContext.due_ms)
    started_ms: int
    ended_ms: int
    result: str  # "ok", "fail" (retriable) or "permanent"
    pid: int
    release: str  # the release of the worker that ran it
    dueflow_path: str  # where that worker imported dueflow from
    redriven: bool  # the exec record came from `dueflow dlq redrive`
    tag: str = ""  # the payload's ``tag`` (which version of a job's payload ran)


class Ledger:
    """Every run, as the workers wrote it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute(f"CREATE TABLE IF NOT EXISTS runs ({COLUMNS})")
            db.execute(f"CREATE TABLE IF NOT EXISTS started ({STARTED_COLUMNS})")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def runs(self) -> list[Run]:
        with self._db() as db:
            rows: list[tuple[Any, ...]] = db.execute(
                "SELECT job_id, kind, attempt, due_ms, started_ms, ended_ms, result, pid, "
                "release, dueflow_path, redriven, tag FROM runs ORDER BY started_ms"
            ).fetchall()
        return [
            Run(
                job_id=str(row[0]),
                kind=str(row[1]),
                attempt=int(row[2]),
                due_ms=int(row[3]),
                started_ms=int(row[4]),
                ended_ms=int(row[5]),
                result=str(row[6]),
                pid=int(row[7]),
                release=str(row[8]),
                dueflow_path=str(row[9]),
                redriven=bool(row[10]),
                tag=str(row[11] or ""),
            )
            for row in rows
        ]

    def busy(self, pid: int, now_ms: int) -> tuple[int, int]:
        """What process ``pid`` has in hand at ``now_ms``: attempts running (started, not
        ended, with at least :data:`IN_HAND_MS` of work to go), and first attempts it
        failed whose retry has not run yet."""
        with self._db() as db:
            running = db.execute(
                "SELECT count(*) FROM started s WHERE s.pid = ? AND s.works_until_ms >= ? "
                "AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = s.job_id AND "
                "r.attempt = s.attempt AND r.pid = s.pid)",
                (pid, now_ms + IN_HAND_MS),
            ).fetchone()[0]
            retries = db.execute(
                "SELECT count(*) FROM runs f WHERE f.pid = ? AND f.result = 'fail' AND "
                "f.attempt = 1 AND f.redriven = 0 AND NOT EXISTS (SELECT 1 FROM started s "
                "WHERE s.job_id = f.job_id AND s.attempt = 2)",
                (pid,),
            ).fetchone()[0]
        return int(running), int(retries)

    def count(self) -> int:
        with self._db() as db:
            return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])
