"""States of idempotency keys, one store per owned partition: final (done, dead,
cancelled) or the last attempt handed on to a retry.

The source of truth is the compacted topic ``<prefix>.idempotency.<queue>``;
a store is a local copy of one partition of it, loaded on assignment and
kept current by tailing. Keys expire ``retention_ms`` after the record's
time, like the topic (``cleanup.policy=compact,delete``), so a store stays
bounded by what arrives in one window.

Two implementations behind one interface:

- :class:`MemoryKeyStore` (default): a dict, ~150 bytes per key, lookups
  well under a microsecond. Rebuilt from the topic on every assignment of a
  partition the process did not own before.
- :class:`SqliteKeyStore` (``worker.store = "disk"``): a SQLite file per
  queue and partition, for key sets that do not fit in memory (tens of
  millions of keys per process). Memory stays flat; lookups cost a few
  microseconds and writes are batched. The file remembers the topic offset
  it has applied up to, so a restarted process reads only what is newer
  instead of the whole partition. It is a cache: a corrupt or deleted file
  is rebuilt from the topic.

Besides final states a store keeps the partition's reschedules (see
:mod:`dueflow.records.reschedule`): per key, the due time of the one delivery that
may run. They are apart from the final states, so neither replaces the
other whatever the order they arrive in (a final state always wins at
dispatch), and a tombstone (a redrive clearing ``dead``) leaves them; they
expire like the final states, ``retention_ms`` after they were written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from dueflow.consumers.sqlite_cache import open_cache, transaction

DONE, DEAD, CANCELLED = 0, 1, 2
STATE_NAMES = ("done", "dead", "cancelled")
STATE_OF = {name: i for i, name in enumerate(STATE_NAMES)}
# Not final: attempt n failed and was handed on (a retry record or a wheel timer
# written in the same transaction), stored as RETRIED + n - 1. A delivery of that
# key with attempt <= n is a redelivery of work already passed on: skipped.
RETRIED = 3
RETRYING = "retrying"
_STATE_BITS = 24  # the memory store packs (at_ms << 24) | state


_STATE_MASK = (1 << _STATE_BITS) - 1


def retried(attempt: int) -> int:
    """The stored state of a key whose attempt ``attempt`` was handed on to a retry."""
    return RETRIED + min(max(attempt, 1), (1 << _STATE_BITS) - RETRIED) - 1


def state_of(name: str, attempts: int) -> int:
    """The stored state of an idempotency record (its ``state`` and ``attempts``)."""
    return retried(attempts) if name == RETRYING else STATE_OF[name]


def skips(state: int, attempt: int) -> bool:
    """Whether a delivery of ``attempt`` must not run given its key's stored ``state``:
    always for a final state; for a retried key, up to the attempt handed on."""
    return state < RETRIED or attempt <= state - RETRIED + 1


def is_final(state: int) -> bool:
    return state < RETRIED


class KeyStore(Protocol):
    """Final states of the keys of one partition of one queue."""

    #: the next idempotency-topic offset to apply (``None``: from the beginning)
    next_offset: int | None

    def get(self, key: bytes) -> int | None:
        """The key's state (:data:`DONE`, :data:`DEAD`, :data:`CANCELLED`, or
        :func:`retried` of the attempt handed on last), if any."""
        ...

    def apply(
        self, records: Iterable[tuple[bytes, int | None, int]], next_offset: int | None
    ) -> None:
        """Apply ``(key, state, at_ms)`` records (state ``None`` deletes), then remember
        that the topic is applied up to ``next_offset`` (``None``: the records are the
        worker's own, committed but not read back from the topic yet)."""
        ...

    def expire(self, now_ms: int) -> int:
        """Forget keys (and reschedules) older than the retention; return how many keys
        were dropped."""
        ...

    def run_only_due(self, key: bytes) -> int | None:
        """The due time of the one delivery of ``key`` that may run, set by a
        reschedule; None: no reschedule (any delivery may)."""
        ...

    def reschedule(self, records: Iterable[tuple[bytes, int, int]]) -> None:
        """Apply ``(key, run_only_due_ms, at_ms)`` reschedules in order (the latest of a
        key wins)."""
        ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


# (queue, partition, retention_ms) -> store
StoreFactory = Callable[[str, int, int], KeyStore]


class MemoryKeyStore:
    """A dict of key -> ``at_ms << 24 | state``, with an insertion-ordered expiry queue;
    reschedules in a dict of their own (there are few)."""

    __slots__ = ("_dues", "_keys", "_order", "_retention", "next_offset")

    def __init__(self, retention_ms: int) -> None:
        self._retention = retention_ms
        self._keys: dict[bytes, int] = {}
        self._order: deque[tuple[int, bytes]] = deque()
        self._dues: dict[bytes, tuple[int, int]] = {}  # key -> (run only due, at)
        self.next_offset: int | None = None

    def run_only_due(self, key: bytes) -> int | None:
        if not self._dues:
            return None
        found = self._dues.get(key)
        return None if found is None else found[0]

    def reschedule(self, records: Iterable[tuple[bytes, int, int]]) -> None:
        for key, due_ms, at_ms in records:
            self._dues[key] = (due_ms, at_ms)

    def get(self, key: bytes) -> int | None:
        packed = self._keys.get(key)
        return None if packed is None else packed & _STATE_MASK

    def apply(
        self, records: Iterable[tuple[bytes, int | None, int]], next_offset: int | None
    ) -> None:
        keys, order = self._keys, self._order
        for key, state, at_ms in records:
            if state is None:
                keys.pop(key, None)
            else:
                keys[key] = (at_ms << _STATE_BITS) | state
                order.append((at_ms, key))
        if next_offset is not None and (self.next_offset is None or next_offset > self.next_offset):
            self.next_offset = next_offset

    def expire(self, now_ms: int) -> int:
        # Records arrive roughly in time order; one that is out of order only
        # delays the expiry of those behind it.
        cutoff = now_ms - self._retention
        keys, order = self._keys, self._order
        if self._dues:
            self._dues = {k: v for k, v in self._dues.items() if v[1] >= cutoff}
        dropped = 0
        while order and order[0][0] < cutoff:
            at_ms, key = order.popleft()
            packed = keys.get(key)
            if packed is not None and packed >> _STATE_BITS == at_ms:
                del keys[key]
                dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._keys)

    def close(self) -> None:
        self._keys.clear()
        self._order.clear()
        self._dues.clear()


_KEY_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS keys "
    "(key BLOB PRIMARY KEY, state INTEGER NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS keys_at ON keys (at_ms)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER)",
    "CREATE TABLE IF NOT EXISTS reschedules "
    "(key BLOB PRIMARY KEY, due_ms INTEGER NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID",
)


class SqliteKeyStore:
    """Keys of one partition in a SQLite file that survives restarts."""

    def __init__(self, path: Path, retention_ms: int) -> None:
        self._path = path
        self._retention = retention_ms
        self._db = open_cache(path, _KEY_SCHEMA, check_table="keys")
        row = self._db.execute("SELECT value FROM meta WHERE name = 'next_offset'").fetchone()
        self.next_offset: int | None = None if row is None else int(row[0])
        self._count = int(self._db.execute("SELECT count(*) FROM keys").fetchone()[0])
        # Reschedules are few: all of them in memory too (a dispatch asks for each job).
        self._dues: dict[bytes, tuple[int, int]] = {
            bytes(k): (int(d), int(a))
            for k, d, a in self._db.execute("SELECT key, due_ms, at_ms FROM reschedules")
        }

    def get(self, key: bytes) -> int | None:
        row = self._db.execute("SELECT state FROM keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def apply(
        self, records: Iterable[tuple[bytes, int | None, int]], next_offset: int | None
    ) -> None:
        puts: list[tuple[bytes, int, int]] = []
        deletes: list[tuple[bytes]] = []
        for key, state, at_ms in records:
            if state is None:
                deletes.append((key,))
            else:
                puts.append((key, state, at_ms))
        with transaction(self._db) as db:
            if deletes:
                db.executemany("DELETE FROM keys WHERE key = ?", deletes)
            if puts:
                db.executemany("INSERT OR REPLACE INTO keys VALUES (?, ?, ?)", puts)
            if next_offset is not None and (
                self.next_offset is None or next_offset > self.next_offset
            ):
                self.next_offset = next_offset
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('next_offset', ?)", (self.next_offset,)
                )
        if puts or deletes:
            self._count = int(db.execute("SELECT count(*) FROM keys").fetchone()[0])

    def run_only_due(self, key: bytes) -> int | None:
        if not self._dues:
            return None
        found = self._dues.get(key)
        return None if found is None else found[0]

    def reschedule(self, records: Iterable[tuple[bytes, int, int]]) -> None:
        rows = list(records)
        if not rows:
            return
        self._db.executemany("INSERT OR REPLACE INTO reschedules VALUES (?, ?, ?)", rows)
        for key, due_ms, at_ms in rows:
            self._dues[key] = (due_ms, at_ms)

    def expire(self, now_ms: int) -> int:
        cutoff = now_ms - self._retention
        cur = self._db.execute("DELETE FROM keys WHERE at_ms < ?", (cutoff,))
        dropped = max(0, cur.rowcount)
        self._count -= dropped
        if self._dues:
            self._db.execute("DELETE FROM reschedules WHERE at_ms < ?", (cutoff,))
            self._dues = {k: v for k, v in self._dues.items() if v[1] >= cutoff}
        return dropped

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        self._db.close()


def memory_stores() -> StoreFactory:
    """The default: every partition's keys in memory."""
    return lambda _queue, _partition, retention_ms: MemoryKeyStore(retention_ms)


def sqlite_stores(directory: str | Path) -> StoreFactory:
    """Keys on disk: ``<directory>/<queue>-<partition>.sqlite``."""
    root = Path(directory)

    def make(queue: str, partition: int, retention_ms: int) -> KeyStore:
        return SqliteKeyStore(root / f"{queue}-{partition}.sqlite", retention_ms)

    return make
