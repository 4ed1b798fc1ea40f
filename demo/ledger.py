"""The demo's record of what its handlers did: one SQLite file per worker process.

A handler's "external side effect" in the demo is a row in this ledger, so
the summary can count honestly what ran: ``attempts`` has one row per
handler invocation (job key, task, attempt, due and start times, success),
``effects`` one row per key with how often the effect was applied (a count
above 1 is a duplicate effect). Each process writes its own file
(``ledger-<pid>.db`` in the directory given by ``DUEFLOW_DEMO_LEDGER``), so
worker processes never wait on each other's locks; :class:`LedgerReader`
adds them up. A row is committed before the handler returns: a process
killed after that keeps it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV = "DUEFLOW_DEMO_LEDGER"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS attempts (key TEXT NOT NULL, task TEXT NOT NULL, "
    "attempt INTEGER NOT NULL, due_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL, "
    "ok INTEGER NOT NULL, pid INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, task TEXT NOT NULL, "
    "count INTEGER NOT NULL)",
)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    # A crashed process keeps what it committed (the OS has the pages); only a
    # machine crash could lose the tail, which the demo does not simulate.
    db.execute("PRAGMA synchronous=OFF")
    for stmt in _SCHEMA:
        db.execute(stmt)
    return db


class LedgerWriter:
    """Appends this process's attempts and effects to its own file (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = 0

    def _conn(self) -> sqlite3.Connection:
        pid = os.getpid()
        if self._db is None or self._pid != pid:  # a forked child opens its own file
            self.directory.mkdir(parents=True, exist_ok=True)
            self._db = _connect(self.directory / f"ledger-{pid}.db")
            self._pid = pid
        return self._db

    def record(
        self, *, key: str, task: str, attempt: int, due_ms: int, started_ms: int, ok: bool
    ) -> None:
        """One attempt; with ``ok`` the effect is applied in the same SQLite transaction."""
        with self._lock:
            db = self._conn()
            db.execute("BEGIN")
            try:
                db.execute(
                    "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, task, attempt, due_ms, started_ms, int(ok), self._pid),
                )
                if ok:
                    db.execute(
                        "INSERT INTO effects VALUES (?, ?, 1) "
                        "ON CONFLICT(key) DO UPDATE SET count = count + 1",
                        (key, task),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise


@dataclass(frozen=True, slots=True)
class Attempt:
    key: str
    task: str
    attempt: int
    due_ms: int
    started_ms: int
    ok: bool


@dataclass(frozen=True, slots=True)
class LedgerView:
    """Every process's ledger added up."""

    effects: Counter[str]  # key -> times its effect was applied
    attempts: list[Attempt]

    def first_starts(self) -> dict[str, tuple[int, int]]:
        """key -> (due_ms, start of its earliest attempt)."""
        out: dict[str, tuple[int, int]] = {}
        for a in self.attempts:
            seen = out.get(a.key)
            if seen is None or a.started_ms < seen[1]:
                out[a.key] = (a.due_ms, a.started_ms)
        return out

    def retried(self) -> set[str]:
        """Keys that ran more than one attempt."""
        return {a.key for a in self.attempts if a.attempt > 1}


class LedgerReader:
    """Reads every ``ledger-*.db`` in a directory (while the writers run, or after)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _files(self) -> Iterator[Path]:
        yield from sorted(self.directory.glob("ledger-*.db"))

    def effect_count(self) -> int:
        """Effects applied so far (rows of every file's ``effects``, summed counts)."""
        total = 0
        for path in self._files():
            with _readonly(path) as db:
                try:
                    row = db.execute("SELECT COALESCE(SUM(count), 0) FROM effects").fetchone()
                except sqlite3.OperationalError:  # a file its writer has not set up yet
                    continue
                total += int(row[0])
        return total

    def read(self) -> LedgerView:
        effects: Counter[str] = Counter()
        attempts: list[Attempt] = []
        for path in self._files():
            with _readonly(path) as db:
                if not _has_tables(db):
                    continue
                for key, count in db.execute("SELECT key, count FROM effects"):
                    effects[str(key)] += int(count)
                attempts.extend(
                    Attempt(str(k), str(t), int(n), int(d), int(s), bool(ok))
                    for k, t, n, d, s, ok in db.execute(
                        "SELECT key, task, attempt, due_ms, started_ms, ok FROM attempts"
                    )
                )
        return LedgerView(effects, attempts)


def _readonly(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A short-lived connection, closed on exit (sqlite3's own context only commits)."""
    return contextlib.closing(sqlite3.connect(path, timeout=30))


def _has_tables(db: sqlite3.Connection) -> bool:
    found = db.execute(
        "SELECT count(*) FROM sqlite_master "
        "WHERE type = 'table' AND name IN ('attempts', 'effects')"
    ).fetchone()
    return int(found[0]) == 2
