"""The chaos suite's truth: a SQLite ledger written by the handlers.

A handler writes like a real application with an external side effect:

- ``runs``: one row per handler invocation (raw executions, with the time it
  started, the job's due time, the attempt's "not before", the pid of the
  process, and which version of a steered job ran: its timer's ``df-version``
  and its payload's ``v``), committed before the effect, so a process killed between the two
  still shows the run; when the handler returns or raises, the same row gets
  the time it ended and how (``ok``, ``failed``; a run killed first has none);
- ``effects``: the side effect, written in one SQLite transaction keyed by
  ``ctx.idempotency_key`` with INSERT OR IGNORE: an execution that finds the
  key already applied records a row in ``conflicts`` instead and changes
  nothing (the handler is idempotent, as docs/workers.md asks of handlers).

Effects can therefore never be applied twice; what the suite checks against
Kafka (succeeded outcomes, dead letters) is counted elsewhere.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, job_id TEXT NOT NULL, task TEXT NOT NULL,"
    " attempt INTEGER NOT NULL, started_ms INTEGER NOT NULL, due_ms INTEGER NOT NULL,"
    " not_before_ms INTEGER NOT NULL, pid INTEGER NOT NULL, ended_ms INTEGER, result TEXT,"
    " version TEXT, payload_v INTEGER)",
    "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, job_id TEXT NOT NULL,"
    " task TEXT NOT NULL, attempt INTEGER NOT NULL, at_ms INTEGER NOT NULL, pid INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS conflicts (key TEXT NOT NULL, attempt INTEGER NOT NULL,"
    " at_ms INTEGER NOT NULL, pid INTEGER NOT NULL)",
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Run:
    key: str
    job_id: str
    task: str
    attempt: int
    started_ms: int
    due_ms: int
    not_before_ms: int
    pid: int
    ended_ms: int | None = None  # when the handler returned or raised (its own clock)
    result: str | None = None  # "ok" or "failed"; None: it never ended (killed)
    version: str | None = None  # the delivery's df-version (None: the original timer)
    payload_v: int | None = None  # the payload's "v" (2: updated by a command)


@dataclass(frozen=True, slots=True)
class Effect:
    """The idempotent effect of one key: which attempt applied it, when, in which process."""

    attempt: int
    at_ms: int
    pid: int


class Ledger:
    """One SQLite file shared by every worker process of a run (WAL, short transactions)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=60, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in SCHEMA:
            self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ handlers
    def record_run(self, run: Run) -> int:
        """Insert a run (committed at once); its row id, for :meth:`record_end`."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.key,
                    run.job_id,
                    run.task,
                    run.attempt,
                    run.started_ms,
                    run.due_ms,
                    run.not_before_ms,
                    run.pid,
                    run.ended_ms,
                    run.result,
                    run.version,
                    run.payload_v,
                ),
            )
            return int(cur.lastrowid or 0)

    def record_end(self, run_id: int, *, ended_ms: int, result: str) -> None:
        """The run ``run_id`` ended at ``ended_ms`` (``ok`` or ``failed``)."""
        with self._lock:
            self._db.execute(
                "UPDATE runs SET ended_ms = ?, result = ? WHERE rowid = ?",
                (ended_ms, result, run_id),
            )

    def apply_effect(self, key: str, job_id: str, task: str, attempt: int) -> bool:
        """The idempotent side effect: True when applied now, False when it was already."""
        at = now_ms()
        pid = os.getpid()
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                cur = db.execute(
                    "INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?)",
                    (key, job_id, task, attempt, at, pid),
                )
                applied = cur.rowcount == 1
                if not applied:
                    db.execute("INSERT INTO conflicts VALUES (?, ?, ?, ?)", (key, attempt, at, pid))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return applied

    # ------------------------------------------------------------------ analysis
    def runs(self) -> list[Run]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM runs").fetchall()
        return [Run(*row) for row in rows]

    def effects(self) -> dict[str, Effect]:
        """key -> the attempt, time and process that applied its effect."""
        with self._lock:
            rows = self._db.execute("SELECT key, attempt, at_ms, pid FROM effects").fetchall()
        return {str(k): Effect(int(a), int(at), int(pid)) for k, a, at, pid in rows}

    def effect_keys(self) -> dict[str, int]:
        """key -> the time its effect was applied."""
        with self._lock:
            rows = self._db.execute("SELECT key, at_ms FROM effects").fetchall()
        return {str(k): int(at) for k, at in rows}

    def conflicts(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM conflicts").fetchone()[0])

    def effect_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM effects").fetchone()[0])
