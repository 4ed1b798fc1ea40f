"""Idempotency key stores: states, deletes, expiry, and the disk store's restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from dueflow.consumers.store import (
    CANCELLED,
    DEAD,
    DONE,
    KeyStore,
    MemoryKeyStore,
    SqliteKeyStore,
    memory_stores,
    sqlite_stores,
)

HOUR = 3_600_000


def _offset(store: KeyStore) -> int | None:
    return store.next_offset


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> KeyStore:
    if request.param == "memory":
        return MemoryKeyStore(HOUR)
    return SqliteKeyStore(tmp_path / "q-0.sqlite", HOUR)


def test_states_deletes_and_offsets(store: KeyStore) -> None:
    assert store.get(b"a") is None
    assert _offset(store) is None
    store.apply([(b"a", DONE, 1_000), (b"b", DEAD, 1_000), (b"c", CANCELLED, 1_000)], 3)
    assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (DONE, DEAD, CANCELLED)
    assert store.next_offset == 3
    assert len(store) == 3
    store.apply([(b"a", CANCELLED, 2_000), (b"b", None, 2_000)], 5)  # overwrite, tombstone
    assert (store.get(b"a"), store.get(b"b")) == (CANCELLED, None)
    assert len(store) == 2
    store.apply([], 4)  # never goes back
    assert store.next_offset == 5


def test_keys_expire_after_the_window(store: KeyStore) -> None:
    store.apply([(b"old", DONE, 0), (b"new", DONE, HOUR)], 2)
    assert store.expire(HOUR) == 0  # "old" is exactly one window old: kept
    assert store.expire(HOUR + 1) == 1
    assert store.get(b"old") is None
    assert store.get(b"new") == DONE
    assert len(store) == 1


def test_a_rewritten_key_expires_by_its_latest_time() -> None:
    store = MemoryKeyStore(HOUR)
    store.apply([(b"k", DONE, 0)], 1)
    store.apply([(b"k", CANCELLED, HOUR)], 2)
    assert store.expire(HOUR + 1) == 0
    assert store.get(b"k") == CANCELLED
    assert store.expire(2 * HOUR + 1) == 1


def test_the_disk_store_resumes_after_a_restart(tmp_path: Path) -> None:
    make = sqlite_stores(tmp_path)
    first = make("billing", 3, HOUR)
    first.apply([(b"k%d" % i, DONE, 10) for i in range(100)], 100)
    first.close()
    again = make("billing", 3, HOUR)
    assert again.next_offset == 100
    assert len(again) == 100
    assert again.get(b"k42") == DONE
    again.close()
    assert (tmp_path / "billing-3.sqlite").exists()


def test_a_corrupt_disk_store_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "q-1.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    store = SqliteKeyStore(path, HOUR)
    assert store.next_offset is None
    assert len(store) == 0
    store.apply([(b"a", DONE, 1)], 1)
    assert store.get(b"a") == DONE


def test_memory_factory_gives_fresh_stores() -> None:
    make = memory_stores()
    a, b = make("q", 0, HOUR), make("q", 0, HOUR)
    a.apply([(b"x", DONE, 1)], 1)
    assert b.get(b"x") is None


def test_reschedules_are_apart_from_final_states_and_the_latest_wins(store: KeyStore) -> None:
    assert store.run_only_due(b"a") is None
    store.reschedule([(b"a", 50_000, 1_000), (b"a", 70_000, 1_001), (b"b", 9, 1_000)])
    assert (store.run_only_due(b"a"), store.run_only_due(b"b")) == (70_000, 9)
    store.apply([(b"a", DONE, 2_000), (b"b", None, 2_000)], 3)  # a final state; a tombstone
    # both kept: a final state wins at dispatch, and a redrive's tombstone clears `dead` only
    assert (store.get(b"a"), store.run_only_due(b"a"), store.run_only_due(b"b")) == (
        DONE,
        70_000,
        9,
    )
    assert len(store) == 1  # counts keys with a final state


def test_reschedules_expire_after_the_window_from_when_they_were_written(store: KeyStore) -> None:
    store.reschedule([(b"old", 10 * HOUR, 0), (b"new", 10 * HOUR, HOUR)])
    store.expire(HOUR)
    assert store.run_only_due(b"old") == 10 * HOUR
    store.expire(HOUR + 1)
    assert (store.run_only_due(b"old"), store.run_only_due(b"new")) == (None, 10 * HOUR)


def test_the_disk_store_keeps_its_reschedules_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "q-1.sqlite"
    first = SqliteKeyStore(path, HOUR)
    first.reschedule([(b"k", 123, 1_000)])
    first.apply([], 7)
    first.close()
    again = SqliteKeyStore(path, HOUR)
    assert (again.run_only_due(b"k"), again.next_offset) == (123, 7)
