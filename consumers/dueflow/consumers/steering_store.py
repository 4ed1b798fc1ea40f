"""The steering states of one owned exec partition: memory, or a SQLite file.

The source of truth is partition p of the compacted ``<prefix>.steering.<queue>``,
which only the owner of exec partition p writes (in the transaction that
commits what changed it). A store holds the states read from it up to
:attr:`next_offset` plus the owner's own committed changes
(:meth:`SteeringStore.put`), which are later in that partition. So reading
``[next_offset, last stable offset)`` again and applying it on top
(:meth:`SteeringStore.load`) always gives the partition's state, whoever wrote
in between: the owner does that at every assignment, before the partition's
records are judged. The records of such a read are applied at once at the
end, skipping keys the owner changed since the read began, so no decision
ever sees a half-read state.

Two implementations behind one interface, as the key stores
(:mod:`dueflow.consumers.store`): :class:`MemorySteeringStore` (default) and
:class:`SqliteSteeringStore` (``worker.store = "disk"``, for deployments that
steer millions of far-future jobs; the file remembers ``next_offset``, so a
restart reads only what is newer; a file older than
:data:`STALE_FILE_MS` is read again from the start, because compaction may
have removed tombstones it never saw). Both index each state by the time the
sweep may change it (:func:`dueflow.rules.steering.sweep_due`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from dueflow.consumers.sqlite_cache import open_cache, transaction
from dueflow.records.steering_state import SCHEMA, Entry, decode_entry, encode_entry
from dueflow.rules import unique
from dueflow.rules.steering import sweep_due as job_sweep_due
from dueflow.steering_model import UniqueEntry

# A disk store not read for longer than this is read again from the start: the
# topic keeps tombstones for its delete.retention.ms (a day by default) only.
STALE_FILE_MS = 12 * 3_600_000


def sweep_due(state: Entry, *, grace_ms: int) -> int | None:
    """When the sweep may change ``state`` (a job's, or a unique key's entry)."""
    if isinstance(state, UniqueEntry):
        return unique.sweep_due(state)
    return job_sweep_due(state, grace_ms=grace_ms)


class SteeringStore(Protocol):
    """The steering states of one partition: jobs' (keyed by idempotency key) and unique
    keys' entries (keyed by their steering-topic key, ``u\\x00<unique key>``)."""

    #: the next steering-topic offset to read (``None``: from the beginning)
    next_offset: int | None

    def get(self, key: bytes) -> Entry | None: ...

    def put(self, items: Iterable[tuple[bytes, Entry | None]]) -> None:
        """The owner's committed changes (``None`` removes)."""
        ...

    def begin_load(self) -> None:
        """A read of the topic starts: remember the keys :meth:`put` changes from now."""
        ...

    def load(self, records: Mapping[bytes, Entry | None], next_offset: int) -> None:
        """The last record of each key read up to ``next_offset`` (``None``: a
        tombstone), applied at once but for keys :meth:`put` changed since
        :meth:`begin_load`; :attr:`next_offset` becomes ``next_offset``."""
        ...

    def reset(self) -> None:
        """Forget everything (the topic is read again from its start)."""
        ...

    def due_for_sweep(self, now_ms: int) -> list[tuple[bytes, Entry]]:
        """States the sweep may change at ``now_ms``."""
        ...

    def items(self) -> Iterator[tuple[bytes, Entry]]: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


# (queue, partition, grace_ms) -> store
SteeringStoreFactory = Callable[[str, int, int], SteeringStore]


class MemorySteeringStore:
    """A dict of key -> state, and a heap of (sweep time, key) with lazy deletion."""

    def __init__(self, grace_ms: int) -> None:
        self._grace = grace_ms
        self._states: dict[bytes, Entry] = {}
        self._sweeps: list[tuple[int, bytes]] = []
        self._written: set[bytes] | None = None
        self.next_offset: int | None = None

    def get(self, key: bytes) -> Entry | None:
        return self._states.get(key) if self._states else None

    def _set(self, key: bytes, state: Entry | None) -> None:
        if state is None:
            self._states.pop(key, None)
            return
        self._states[key] = state
        due = sweep_due(state, grace_ms=self._grace)
        if due is not None:
            heapq.heappush(self._sweeps, (due, key))

    def put(self, items: Iterable[tuple[bytes, Entry | None]]) -> None:
        written = self._written
        for key, state in items:
            self._set(key, state)
            if written is not None:
                written.add(key)

    def begin_load(self) -> None:
        self._written = set()

    def load(self, records: Mapping[bytes, Entry | None], next_offset: int) -> None:
        written = self._written or set()
        for key, state in records.items():
            if key not in written:
                self._set(key, state)
        self._written = None
        self.next_offset = next_offset

    def reset(self) -> None:
        self._states.clear()
        self._sweeps.clear()
        self.next_offset = None

    def due_for_sweep(self, now_ms: int) -> list[tuple[bytes, Entry]]:
        out: dict[bytes, Entry] = {}
        heap = self._sweeps
        while heap and heap[0][0] <= now_ms:
            _due, key = heapq.heappop(heap)
            state = self._states.get(key)
            if state is None:
                continue
            due = sweep_due(state, grace_ms=self._grace)
            if due is not None and due <= now_ms:
                out[key] = state
            elif due is not None and due != _due:
                heapq.heappush(heap, (due, key))
        return list(out.items())

    def items(self) -> Iterator[tuple[bytes, Entry]]:
        return iter(list(self._states.items()))

    def __len__(self) -> int:
        return len(self._states)

    def close(self) -> None:
        self.reset()


_STATE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS states (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
    "sweep_at INTEGER) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS states_sweep ON states (sweep_at)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER)",
)


class SqliteSteeringStore:
    """States of one partition in a SQLite file that survives restarts."""

    def __init__(
        self, path: Path, grace_ms: int, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._path = path
        self._grace = grace_ms
        self._clock = clock
        self._db = open_cache(path, _STATE_SCHEMA, check_table="states")
        meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        read_ms = int(meta.get("read_ms", 0))
        self.next_offset: int | None = int(meta["next_offset"]) if "next_offset" in meta else None
        if self.next_offset is not None and self._now_ms() - read_ms > STALE_FILE_MS:
            self.reset()
        self._count = int(self._db.execute("SELECT count(*) FROM states").fetchone()[0])
        self._written: set[bytes] | None = None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    @staticmethod
    def _decode(raw: bytes) -> Entry:
        return decode_entry(bytes(raw), SCHEMA)

    def get(self, key: bytes) -> Entry | None:
        if not self._count:
            return None
        row = self._db.execute("SELECT value FROM states WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._decode(row[0])

    def _write(self, items: Iterable[tuple[bytes, Entry | None]]) -> None:
        puts: list[tuple[bytes, bytes, int | None]] = []
        deletes: list[tuple[bytes]] = []
        for key, state in items:
            if state is None:
                deletes.append((key,))
            else:
                puts.append((key, encode_entry(state), sweep_due(state, grace_ms=self._grace)))
        with transaction(self._db) as db:
            if deletes:
                db.executemany("DELETE FROM states WHERE key = ?", deletes)
            if puts:
                db.executemany("INSERT OR REPLACE INTO states VALUES (?, ?, ?)", puts)
        if puts or deletes:
            self._count = int(db.execute("SELECT count(*) FROM states").fetchone()[0])

    def put(self, items: Iterable[tuple[bytes, Entry | None]]) -> None:
        rows = list(items)
        self._write(rows)
        if self._written is not None:
            self._written.update(k for k, _ in rows)

    def begin_load(self) -> None:
        self._written = set()

    def load(self, records: Mapping[bytes, Entry | None], next_offset: int) -> None:
        written = self._written or set()
        self._write((k, v) for k, v in records.items() if k not in written)
        self._written = None
        self.next_offset = next_offset
        self._db.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [("next_offset", next_offset), ("read_ms", self._now_ms())],
        )

    def reset(self) -> None:
        self._db.execute("DELETE FROM states")
        self._db.execute("DELETE FROM meta")
        self._count = 0
        self.next_offset = None

    def due_for_sweep(self, now_ms: int) -> list[tuple[bytes, Entry]]:
        rows = self._db.execute(
            "SELECT key, value FROM states WHERE sweep_at IS NOT NULL AND sweep_at <= ?",
            (now_ms,),
        ).fetchall()
        return [(bytes(k), self._decode(v)) for k, v in rows]

    def items(self) -> Iterator[tuple[bytes, Entry]]:
        rows = self._db.execute("SELECT key, value FROM states").fetchall()
        return iter([(bytes(k), self._decode(v)) for k, v in rows])

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        self._db.close()


def memory_steering_stores() -> SteeringStoreFactory:
    return lambda _queue, _partition, grace_ms: MemorySteeringStore(grace_ms)


def sqlite_steering_stores(directory: str | Path) -> SteeringStoreFactory:
    """States on disk: ``<directory>/<queue>-<partition>.steering.sqlite``."""
    root = Path(directory)

    def make(queue: str, partition: int, grace_ms: int) -> SteeringStore:
        return SqliteSteeringStore(root / f"{queue}-{partition}.steering.sqlite", grace_ms)

    return make


def decode_state_record(value: bytes | None, schema: bytes | None) -> Entry | None:
    """A steering-topic record's job state or unique entry (``None``: a tombstone);
    :class:`UndecodableRecord` for a value that is neither."""
    if value is None:
        return None
    return decode_entry(value, schema)
