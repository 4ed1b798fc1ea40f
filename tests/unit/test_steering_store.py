"""The steering stores of an owned partition: memory and SQLite behave alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dueflow.consumers.steering_store import (
    STALE_FILE_MS,
    MemorySteeringStore,
    SqliteSteeringStore,
    SteeringStore,
)
from dueflow.steering_model import JobSteering, Outstanding

GRACE = 1_000


def state(key: str, *, due: int = 100, current: str = "", cancelled: bool = False) -> JobSteering:
    return JobSteering(
        "j-" + key,
        key,
        current=current,
        cancelled=cancelled,
        outstanding=(Outstanding("", due), Outstanding("c1", due + 5)),
        updated_ms=50,
    )


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SteeringStore]:
    if request.param == "memory":
        return lambda: MemorySteeringStore(GRACE)
    return lambda: SqliteSteeringStore(tmp_path / "s.sqlite", GRACE)


def test_put_get_and_remove(make: Callable[[], SteeringStore]) -> None:
    store = make()
    assert store.get(b"a") is None
    assert len(store) == 0
    store.put([(b"a", state("a")), (b"b", state("b"))])
    assert store.get(b"a") == state("a")
    assert len(store) == 2
    store.put([(b"a", None)])
    assert store.get(b"a") is None
    assert len(store) == 1
    assert dict(store.items()) == {b"b": state("b")}


def test_a_load_never_overwrites_what_the_owner_changed_since_it_began(
    make: Callable[[], SteeringStore],
) -> None:
    """Reading the topic again applies its records at once, but a key the owner
    committed meanwhile keeps the owner's newer state."""
    store = make()
    store.put([(b"a", state("a", due=1))])
    store.begin_load()
    store.put([(b"a", state("a", due=2))])  # committed by the owner during the read
    store.load({b"a": state("a", due=1), b"b": state("b"), b"gone": None}, 17)
    assert store.get(b"a") == state("a", due=2)
    assert store.get(b"b") == state("b")
    assert store.next_offset == 17
    store.begin_load()
    store.load({b"a": None}, 18)  # a tombstone read later applies
    assert store.get(b"a") is None


def test_the_sweep_asks_only_for_states_whose_time_has_come(
    make: Callable[[], SteeringStore],
) -> None:
    store = make()
    store.put([(b"old", state("old", due=10, current="c1")), (b"new", state("new", due=10**9))])
    assert store.due_for_sweep(10 + GRACE) == []
    assert [k for k, _ in store.due_for_sweep(10 + GRACE + 1)] == [b"old"]
    # a job to run whose only token is its current one is never asked about
    store.put([(b"run", JobSteering("j", "run", outstanding=(Outstanding("", 1),)))])
    assert b"run" not in [k for k, _ in store.due_for_sweep(10**15)]


def test_reset_forgets_everything(make: Callable[[], SteeringStore]) -> None:
    store = make()
    store.put([(b"a", state("a"))])
    store.begin_load()
    store.load({}, 9)
    store.reset()
    assert (len(store), store.next_offset, store.get(b"a")) == (0, None, None)


def test_a_disk_store_survives_a_restart_and_reads_only_what_is_newer(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    store = SqliteSteeringStore(path, GRACE, clock=lambda: 1_000.0)
    store.put([(b"a", state("a"))])
    store.begin_load()
    store.load({b"b": state("b")}, 42)
    store.close()
    again = SqliteSteeringStore(path, GRACE, clock=lambda: 1_000.0 + 60)
    assert (again.next_offset, again.get(b"a"), again.get(b"b")) == (42, state("a"), state("b"))
    again.close()
    # not read for longer than the topic keeps tombstones: read again from the start
    stale = SqliteSteeringStore(path, GRACE, clock=lambda: 1_000.0 + STALE_FILE_MS / 1000 + 1)
    assert (stale.next_offset, len(stale)) == (None, 0)


def test_a_corrupt_disk_store_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    path.write_bytes(b"not a database" * 100)
    store = SqliteSteeringStore(path, GRACE)
    assert (store.next_offset, len(store)) == (None, 0)
    store.put([(b"a", state("a"))])
    assert store.get(b"a") == state("a")
