"""Searches of the status view's jobs off its event loop (I/O edge of :mod:`.job_search`).

A search of the SQLite job file runs on a thread with a read-only connection
of its own (WAL: it reads what is committed while the fold writes), one
search at a time, and is interrupted after ``budget_s`` (SQLite's progress
handler): a filter too broad to answer in time is refused with
:class:`SearchTooBroad` instead of holding a thread. The in-memory store
(``status_store = "memory"``) is searched on the loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable

from dueflow.errors import DueflowError
from dueflow.streams.status.job_file import JobFile, search_file
from dueflow.streams.status.job_search import Cursor, JobFilter, JobPage
from dueflow.streams.status.job_store import JobStore

SEARCH_BUDGET_S = 5.0
_PROGRESS_STEPS = 1_000  # SQLite VM steps between two looks at the clock


class SearchTooBroad(DueflowError):
    """A search ran out of its time budget."""

    retriable = False


class JobFinder:
    """Runs :func:`~dueflow.streams.status.job_file.search_file` for the HTTP layer."""

    def __init__(
        self,
        store: Callable[[], JobStore],
        *,
        budget_s: float = SEARCH_BUDGET_S,
    ) -> None:
        self._store = store
        self.budget_s = budget_s
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()

    async def find(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        """A page of the jobs ``flt`` finds (this view's partitions), newest first."""
        store = self._store()
        if not isinstance(store.file, JobFile):
            return store.search(flt, before=before, limit=limit)
        store.flush()  # what is acknowledged is in the file before the search reads it
        partitions = store.active
        async with self._lock:
            return await asyncio.to_thread(self._find, store.file, flt, before, limit, partitions)

    def _find(
        self,
        file: JobFile,
        flt: JobFilter,
        before: Cursor | None,
        limit: int,
        partitions: frozenset[int] | None,
    ) -> JobPage:
        with self._thread_lock:
            if self._db is None:
                self._db = file.reader()
            db = self._db
            deadline = time.monotonic() + self.budget_s
            db.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
            try:
                return search_file(db, flt, before=before, limit=limit, partitions=partitions)
            except sqlite3.OperationalError as exc:
                if "interrupted" not in str(exc):
                    raise
                raise SearchTooBroad(
                    f"the search ({flt.kind()}) took longer than {self.budget_s:g} s: narrow "
                    "it (a state, a queue or task, a due range of hours, a longer id prefix)"
                ) from exc
            finally:
                db.set_progress_handler(None, 0)

    def close(self) -> None:
        with self._thread_lock:
            if self._db is not None:
                self._db.close()
                self._db = None
