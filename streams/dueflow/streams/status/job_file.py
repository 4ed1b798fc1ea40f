"""The status view's jobs on disk: one SQLite file (I/O edge).

One row per job: its view as the JSON the changelog carries, the changelog
partition it belongs to, and two columns for the indexes the view needs
without reading every row:

- ``updated_ms`` (indexed): the newest jobs, for the page's recent list after
  a restart;
- ``final_ms`` (a partial index over finished jobs only): the retention
  sweep's "finished before T", which never sees a pending job.

Beside the rows, per changelog partition, the offset of the newest changelog
record the rows include (``offsets``), written in the same transaction as the
rows. The file is a cache of the changelog: a restart reads only the records
after those offsets, and a missing or unreadable file is made again from the
whole changelog (:meth:`JobFile.open` moves a corrupt one aside).

Writes are WAL with ``synchronous=NORMAL`` (no fsync per transaction; after a
power loss the file may miss its last transactions, and the offsets with
them, which the changelog then brings back). While the file is being filled
from nothing (:attr:`JobFile.fresh`) it runs ``synchronous=OFF`` until
:meth:`JobFile.settle`.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dueflow.observability.logs import event
from dueflow.rules.job_state import FINAL_STATES
from dueflow.streams.status.job_search import (
    QUEUE,
    SEARCH_INDEXES,
    SELECTIVE_ROWS,
    STATE,
    Cursor,
    JobFilter,
    JobPage,
    due_terms,
    matches,
    page_of,
    prefix_terms,
    probe_sql,
    search_sql,
)

log = logging.getLogger("dueflow.status")

FORMAT = 1  # the layout below; a file of another format is made again
GET_MANY_CHUNK = 500  # job ids per query of get_many (SQLite's variable limit is higher)
_FINAL = frozenset(FINAL_STATES)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jobs ("
    " job_id TEXT PRIMARY KEY,"
    " partition INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " final_ms INTEGER,"
    " view BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS jobs_updated ON jobs (updated_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_final ON jobs (final_ms, job_id) WHERE final_ms IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS offsets (partition INTEGER PRIMARY KEY, offset INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as the file keeps it (``view`` is the JSON of the changelog record)."""

    job_id: str
    partition: int
    updated_ms: int
    final_ms: int | None
    view: bytes

    @classmethod
    def of(cls, job_id: str, partition: int, view: bytes) -> JobRow:
        """The row of a job's view JSON (its state and update time are read from it)."""
        return cls.of_doc(job_id, partition, view, orjson.loads(view))

    @classmethod
    def of_doc(cls, job_id: str, partition: int, view: bytes, doc: Mapping[str, Any]) -> JobRow:
        """The row of a job's view JSON ``view`` whose parsed value is ``doc``."""
        updated = int(doc.get("updated_ms") or 0)
        final = updated if doc.get("state") in _FINAL else None
        return cls(job_id, partition, updated, final, view)


class JobFile:
    """The SQLite file of the jobs table (one connection, used by the event loop only)."""

    def __init__(self, path: Path, *, cache_mib: int = 64) -> None:
        self.path = path
        self.cache_mib = cache_mib
        self._db: sqlite3.Connection | None = None
        self.offsets: dict[int, int] = {}
        self.fresh = False  # made from nothing at open: filled from the whole changelog

    # ------------------------------------------------------------- lifecycle
    def open(self) -> JobFile:
        """Open (or make) the file; a file that cannot be read is moved aside and made
        again. Reads the per-partition offsets."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        try:
            db = self._connect()
            found = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if existed and found.get("format") != str(FORMAT):
                db.close()
                self._set_aside(f"format {found.get('format')!r}, this version reads {FORMAT}")
                db = self._connect()
        except sqlite3.DatabaseError as exc:
            self._set_aside(repr(exc))
            db = self._connect()
        db.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (str(FORMAT),))
        self._db = db
        self.offsets = {
            int(p): int(o) for p, o in db.execute("SELECT partition, offset FROM offsets")
        }
        self.fresh = not self.offsets
        if self.fresh:
            db.execute("PRAGMA synchronous=OFF")
        event(
            log,
            "status.job_file_opened",
            path=str(self.path),
            offsets={str(p): o for p, o in sorted(self.offsets.items())},
            fresh=self.fresh,
        )
        return self

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA cache_size={-1024 * int(self.cache_mib)}")
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute("SELECT count(*) FROM offsets").fetchone()  # fails fast on a corrupt file
        return db

    def _set_aside(self, why: str) -> None:
        """Move an unreadable file (and its WAL) aside: it is made again from the changelog."""
        aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.path}{suffix}").rename(f"{aside}{suffix}")
        event(
            log,
            "status.job_file_set_aside",
            logging.WARNING,
            path=str(self.path),
            moved_to=str(aside),
            reason=why,
        )

    def ensure_search_indexes(self) -> float:
        """Make the console's search indexes (:mod:`.job_search`) that the file lacks;
        returns the seconds it took. Building them over a file of an older layout
        takes a while (about a minute per million jobs on a small machine): the
        store runs this on a thread at start, before the view serves."""
        started = time.monotonic()
        for statement in SEARCH_INDEXES:
            self.db.execute(statement)
        return time.monotonic() - started

    def settle(self) -> None:
        """The file has caught up with the changelog: back to ``synchronous=NORMAL``."""
        if self.fresh:
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.fresh = False

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"the job file {self.path} is not open")
        return self._db

    # ---------------------------------------------------------------- reads
    def get(self, job_id: str) -> tuple[int, bytes] | None:
        """``(partition, view JSON)`` of ``job_id``; None when the file has no row."""
        row = self.db.execute(
            "SELECT partition, view FROM jobs WHERE job_id = ?", (job_id,)
        ).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def get_many(self, job_ids: Iterable[str]) -> dict[str, tuple[int, bytes]]:
        """``(partition, view JSON)`` of those of ``job_ids`` the file has rows of."""
        ids = list(job_ids)
        out: dict[str, tuple[int, bytes]] = {}
        for start in range(0, len(ids), GET_MANY_CHUNK):
            chunk = ids[start : start + GET_MANY_CHUNK]
            rows = self.db.execute(
                "SELECT job_id, partition, view FROM jobs WHERE job_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for job_id, p, view in rows:
                out[str(job_id)] = (int(p), bytes(view))
        return out

    def newest(self, limit: int, partitions: Iterable[int] | None = None) -> list[str]:
        """Ids of the ``limit`` most recently updated jobs (of ``partitions``, default
        all), newest first."""
        wanted = None if partitions is None else set(partitions)
        out: list[str] = []
        cur = self.db.execute("SELECT job_id, partition FROM jobs ORDER BY updated_ms DESC")
        for job_id, p in cur:
            if wanted is None or int(p) in wanted:
                out.append(str(job_id))
                if len(out) >= limit:
                    break
        cur.close()
        return out

    def finished_before(
        self, cutoff_ms: int, *, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[JobRow]:
        """Finished jobs last updated at or before ``cutoff_ms``, oldest first, from the
        key ``after`` (``(final_ms, job_id)`` of the previous page's last row) on."""
        if after is None:
            rows = self.db.execute(
                "SELECT job_id, partition, updated_ms, final_ms, view FROM jobs "
                "WHERE final_ms IS NOT NULL AND final_ms <= ? "
                "ORDER BY final_ms, job_id LIMIT ?",
                (cutoff_ms, limit),
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT job_id, partition, updated_ms, final_ms, view FROM jobs "
                "WHERE final_ms IS NOT NULL AND final_ms <= ? AND (final_ms, job_id) > (?, ?) "
                "ORDER BY final_ms, job_id LIMIT ?",
                (cutoff_ms, after[0], after[1], limit),
            ).fetchall()
        return [JobRow(str(j), int(p), int(u), int(f), bytes(v)) for j, p, u, f, v in rows]

    def count(self) -> int:
        """Rows in the file (reads the whole primary index: for tests and tools)."""
        return int(self.db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def count_states(self, partitions: Iterable[int]) -> list[tuple[int, str, str, int]]:
        """``(partition, queue, state, n)`` of the rows of ``partitions`` (one pass over
        the covering index ``jobs_by_partition_state`` per partition)."""
        out: list[tuple[int, str, str, int]] = []
        for p in sorted(set(partitions)):
            rows = self.db.execute(
                f"SELECT {QUEUE}, {STATE}, count(*) FROM jobs WHERE partition = ? "
                f"GROUP BY {QUEUE}, {STATE}",
                (p,),
            ).fetchall()
            out += [(p, str(q), str(st), int(n)) for q, st, n in rows if q and st]
        return out

    def search(
        self,
        flt: JobFilter,
        *,
        before: Cursor | None = None,
        limit: int = 50,
        partitions: Iterable[int] | None = None,
    ) -> JobPage:
        """A page of the jobs ``flt`` finds, newest first (:mod:`.job_search`)."""
        return search_file(self.db, flt, before=before, limit=limit, partitions=partitions)

    def reader(self) -> sqlite3.Connection:
        """A read-only connection of its own (for searches on another thread: WAL lets
        it read what is committed while the view writes)."""
        db = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=30
        )
        db.execute(f"PRAGMA cache_size={-1024 * int(self.cache_mib)}")
        return db

    # --------------------------------------------------------------- writes
    def write(
        self, changes: Iterable[tuple[str, JobRow | None]], offsets: Mapping[int, int]
    ) -> None:
        """Apply ``changes`` in order (a row, or None: the job leaves) and move the
        partitions' offsets forward, in one transaction."""
        last: dict[str, JobRow | None] = {}
        for job_id, row in changes:
            last[job_id] = row
        moved = {p: o for p, o in offsets.items() if o > self.offsets.get(p, -1)}
        if not last and not moved:
            return
        puts = [
            (r.job_id, r.partition, r.updated_ms, r.final_ms, r.view)
            for r in last.values()
            if r is not None
        ]
        deletes = [(j,) for j, r in last.items() if r is None]
        db = self.db
        db.execute("BEGIN")
        try:
            if puts:
                db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?)", puts)
            if deletes:
                db.executemany("DELETE FROM jobs WHERE job_id = ?", deletes)
            if moved:
                db.executemany("INSERT OR REPLACE INTO offsets VALUES (?, ?)", moved.items())
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.offsets.update(moved)


def search_file(
    db: sqlite3.Connection,
    flt: JobFilter,
    *,
    before: Cursor | None = None,
    limit: int = 50,
    partitions: Iterable[int] | None = None,
) -> JobPage:
    """A page of the jobs ``flt`` finds in the job file open as ``db``, newest first
    (:mod:`.job_search`): a due range or id prefix is first counted (up to
    ``SELECTIVE_ROWS``) to tell whether its own index is the way in."""
    wanted = None if partitions is None else frozenset(partitions)
    selective = set()
    for name, terms in (("due", due_terms(flt)), ("id_prefix", prefix_terms(flt))):
        if terms[0]:
            probe, probe_args = probe_sql(terms)
            if db.execute(probe, probe_args).fetchone()[0] < SELECTIVE_ROWS:
                selective.add(name)
    sql, args = search_sql(
        flt, before=before, limit=limit, partitions=wanted, selective=frozenset(selective)
    )
    return page_of(db.execute(sql, args).fetchall(), limit)


class MemoryJobFile:
    """:class:`JobFile`'s interface over a dict (``observability.status_store = "memory"``):
    no disk, every start reads the whole changelog, memory grows with the jobs (about
    the size of their JSON plus 150 bytes each); the sweep reads every row."""

    def __init__(self, path: Path) -> None:
        self.path = path  # not written: named in logs only
        self.rows: dict[str, JobRow] = {}
        self.offsets: dict[int, int] = {}
        self.fresh = True
        self._seq: dict[str, int] = {}  # job id -> write number (SQLite's rowid)
        self._writes = 0

    def open(self) -> MemoryJobFile:
        return self

    def ensure_search_indexes(self) -> float:
        """No indexes: a search reads every row."""
        return 0.0

    def settle(self) -> None:
        self.fresh = False

    def close(self) -> None:
        """Nothing to close: the rows stay until the process ends."""

    def get(self, job_id: str) -> tuple[int, bytes] | None:
        row = self.rows.get(job_id)
        return None if row is None else (row.partition, row.view)

    def get_many(self, job_ids: Iterable[str]) -> dict[str, tuple[int, bytes]]:
        rows = self.rows
        return {j: (rows[j].partition, rows[j].view) for j in job_ids if j in rows}

    def newest(self, limit: int, partitions: Iterable[int] | None = None) -> list[str]:
        wanted = None if partitions is None else set(partitions)
        rows = (r for r in self.rows.values() if wanted is None or r.partition in wanted)
        return [r.job_id for r in heapq.nlargest(limit, rows, key=lambda r: r.updated_ms)]

    def finished_before(
        self, cutoff_ms: int, *, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[JobRow]:
        low = after or (-1, "")
        found = (
            r
            for r in self.rows.values()
            if r.final_ms is not None and r.final_ms <= cutoff_ms and (r.final_ms, r.job_id) > low
        )
        return heapq.nsmallest(limit, found, key=lambda r: (r.final_ms, r.job_id))

    def count(self) -> int:
        return len(self.rows)

    def count_states(self, partitions: Iterable[int]) -> list[tuple[int, str, str, int]]:
        """:meth:`JobFile.count_states` over every row."""
        wanted = set(partitions)
        found: dict[tuple[int, str, str], int] = {}
        for r in self.rows.values():
            if r.partition in wanted:
                doc = orjson.loads(r.view)
                if doc.get("queue") and doc.get("state"):
                    key = (r.partition, str(doc["queue"]), str(doc["state"]))
                    found[key] = found.get(key, 0) + 1
        return [(p, q, st, n) for (p, q, st), n in sorted(found.items())]

    def search(
        self,
        flt: JobFilter,
        *,
        before: Cursor | None = None,
        limit: int = 50,
        partitions: Iterable[int] | None = None,
    ) -> JobPage:
        """:meth:`JobFile.search` over every row (no index)."""
        wanted = None if partitions is None else set(partitions)
        found = []
        for r in self.rows.values():
            key = (r.updated_ms, self._seq.get(r.job_id, 0))
            if before is not None and key >= (before.updated_ms, before.rowid):
                continue
            if wanted is not None and r.partition not in wanted:
                continue
            if matches(flt, r.job_id, orjson.loads(r.view)):
                found.append((key[1], key[0], r.view))
        rows = heapq.nlargest(limit + 1, found, key=lambda t: (t[1], t[0]))
        return page_of(rows, limit)

    def write(
        self, changes: Iterable[tuple[str, JobRow | None]], offsets: Mapping[int, int]
    ) -> None:
        rows = self.rows
        for job_id, row in changes:
            if row is None:
                rows.pop(job_id, None)
                self._seq.pop(job_id, None)
            else:
                rows[job_id] = row
                self._writes += 1
                self._seq[job_id] = self._writes
        for p, o in offsets.items():
            if o > self.offsets.get(p, -1):
                self.offsets[p] = o


# Where a JobStore keeps its rows.
JobRows = JobFile | MemoryJobFile
