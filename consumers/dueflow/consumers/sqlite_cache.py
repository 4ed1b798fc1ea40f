"""The SQLite files of the disk stores (:mod:`dueflow.consumers.store`,
:mod:`dueflow.consumers.steering_store`): local caches of a compacted topic's
partition, opened without fsync and made anew when corrupt."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path


def open_cache(path: Path, schema: Sequence[str], *, check_table: str) -> sqlite3.Connection:
    """The SQLite file at ``path`` (its folder made if missing), in autocommit mode,
    with the ``schema`` statements run on it. A file that is no database, or whose
    ``check_table`` cannot be counted, is deleted with its WAL and shared-memory
    files and made anew, empty: the topic holds what it had.

    The connection may be used from any thread, one at a time: a store is built on
    the event loop and closed from a revoke callback.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _connect(path, schema, check_table)
    except sqlite3.DatabaseError:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        return _connect(path, schema, check_table)


def _connect(path: Path, schema: Sequence[str], check_table: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    # A cache of the topic: losing the last writes on a crash only means reading
    # them from the topic again, so no fsync per batch.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    for statement in schema:
        db.execute(statement)
    db.execute(f"SELECT count(*) FROM {check_table}").fetchone()  # fails fast on a corrupt file
    return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN`` ... ``COMMIT`` on an autocommit connection; ``ROLLBACK`` when the
    body or the commit raises."""
    db.execute("BEGIN")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
