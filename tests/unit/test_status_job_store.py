"""The status view's job file and store: rows and offsets written together, only what
the changelog has stored, the sweep over finished jobs only, waiting for a job."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.observability.metrics import Metrics
from dueflow.records.worker_codec import encode_outcome, outcome_header
from dueflow.streams.status.app import Changed, StatusView
from dueflow.streams.status.job_file import JobFile, JobRow, JobRows, MemoryJobFile
from dueflow.streams.status.job_store import Staged, job_id_of_key

DAY = 86_400_000


def _row(job_id: str, state: str, updated: int, partition: int = 0) -> JobRow:
    view = {"job_id": job_id, "state": state, "updated_ms": updated, "queue": "q"}
    return JobRow.of(job_id, partition, orjson.dumps(view))


def test_rows_and_offsets_survive_a_reopen(tmp_path: Path) -> None:
    f = JobFile(tmp_path / "jobs.sqlite").open()
    assert f.fresh
    assert f.offsets == {}
    f.write([("a", _row("a", "scheduled", 5)), ("b", _row("b", "succeeded", 6, 3))], {0: 10, 3: 4})
    f.write([("a", _row("a", "started", 7)), ("b", None)], {0: 9, 3: 8})  # 9 < 10: kept
    f.close()
    again = JobFile(tmp_path / "jobs.sqlite").open()
    assert not again.fresh
    assert again.offsets == {0: 10, 3: 8}
    found = again.get("a")
    assert found is not None
    assert orjson.loads(found[1])["state"] == "started"
    assert again.get("b") is None
    assert again.count() == 1


def _open(kind: str, tmp_path: Path) -> JobRows:
    path = tmp_path / "jobs.sqlite"
    return JobFile(path).open() if kind == "sqlite" else MemoryJobFile(path).open()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_the_last_change_of_a_key_in_one_write_wins(kind: str, tmp_path: Path) -> None:
    f = _open(kind, tmp_path)
    f.write([("a", _row("a", "scheduled", 1)), ("a", None)], {0: 1})
    assert f.get("a") is None
    f.write([("a", None), ("a", _row("a", "started", 2))], {0: 2})
    assert f.get("a") is not None


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_finished_before_pages_through_finished_jobs_only(kind: str, tmp_path: Path) -> None:
    f = _open(kind, tmp_path)
    rows = [(f"f{i:02d}", _row(f"f{i:02d}", "succeeded", 100 + i)) for i in range(25)]
    rows += [(f"p{i}", _row(f"p{i}", "scheduled", 1)) for i in range(5)]  # pending, old
    rows += [("r", _row("r", "retrying", 1)), ("late", _row("late", "dead", 10_000))]
    f.write(rows, {0: 1})
    seen: list[str] = []
    after = None
    while page := f.finished_before(200, after=after, limit=10):
        seen += [r.job_id for r in page]
        after = (int(page[-1].final_ms or 0), page[-1].job_id)
    assert seen == [f"f{i:02d}" for i in range(25)], "oldest first, never a pending one"
    assert f.newest(3) == ["late", "f24", "f23"]
    assert f.newest(2, partitions=[1]) == []


def test_an_unreadable_file_is_set_aside_and_made_again(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    path.write_bytes(b"this is not a SQLite file, whatever it was" * 100)
    f = JobFile(path).open()
    assert f.fresh
    assert f.count() == 0
    assert [p.name for p in tmp_path.iterdir() if ".unreadable-" in p.name]


def test_a_file_of_another_format_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    f = JobFile(path).open()
    f.write([("a", _row("a", "scheduled", 1))], {0: 1})
    f.db.execute("UPDATE meta SET value = '0' WHERE name = 'format'")
    f.close()
    again = JobFile(path).open()
    assert again.fresh
    assert again.get("a") is None
    assert again.offsets == {}


def test_job_id_of_key() -> None:
    assert job_id_of_key(b'"abc"') == "abc"
    assert job_id_of_key(b'"a\\"b"') == 'a"b'
    assert job_id_of_key(b"raw-id") == "raw-id"


# ------------------------------------------------------------------ the store in the view


def _view(tmp_path: Path, **obs: Any) -> tuple[StatusView, list[tuple[str, int, Any, Staged]]]:
    settings = Settings()
    if obs:
        from dataclasses import replace

        settings = replace(settings, observability=replace(settings.observability, **obs))
    view = StatusView(settings, metrics=Metrics(), data_dir=tmp_path)
    view.fold.quarantine = None
    sent: list[tuple[str, int, Any, Staged]] = []

    def send_job(job_id: str, p: int, raw: bytes | None, staged: Staged) -> None:
        sent.append((job_id, p, None if raw is None else orjson.loads(raw), staged))

    view.fold._send_job = send_job  # type: ignore[method-assign,assignment]
    return view, sent


def _fold(view: StatusView, p: int, job_id: str, state: str, at: int, **extra: Any) -> None:
    changed = Changed()
    value = encode_outcome(
        job_id=job_id,
        queue="default",
        task="t",
        idempotency_key=f"k-{job_id}",
        state=state,
        attempt=0,
        at_ms=at,
        **extra,
    )
    view.fold.apply_event(p, at, [(hdr.SCHEMA, outcome_header(state))], value, changed)
    view.fold.write_changed(changed)


def _ack(view: StatusView, sent: list[tuple[str, int, Any, Staged]], offset: int) -> None:
    """The broker stored the oldest record sent and not acknowledged yet."""
    job_id, _p, _v, staged = sent.pop(0)
    view.store.saved(job_id, staged, offset)


def test_a_view_is_answered_at_once_and_written_once_its_record_is_stored(
    tmp_path: Path,
) -> None:
    view, sent = _view(tmp_path)
    store = view.store
    _fold(view, 2, "a", "scheduled", 1, due_ms=DAY * 365 * 50)
    assert view.reads.job("a")["state"] == "scheduled"  # type: ignore[index]
    assert store.file.get("a") is None, "not before the changelog has it"
    _fold(view, 2, "a", "started", 2)
    _ack(view, sent, 40)  # the first record (scheduled) is stored
    store.flush()
    row = store.file.get("a")
    assert row is not None
    assert orjson.loads(row[1])["state"] == "scheduled"
    assert store.file.offsets == {2: 40}
    assert view.reads.job("a")["state"] == "started", "the newer staged view still answers"  # type: ignore[index]
    _ack(view, sent, 41)
    store.flush()
    assert store.unsaved == 0
    assert orjson.loads(store.file.get("a")[1])["state"] == "started"  # type: ignore[index]
    assert store.file.offsets == {2: 41}


def test_a_restart_answers_from_the_file_and_reads_only_newer_records(tmp_path: Path) -> None:
    view, sent = _view(tmp_path)
    for i in range(5):
        _fold(view, i % 2, f"j{i}", "scheduled", 10 + i, due_ms=DAY * 365 * 100)
    for offset in range(5):
        _ack(view, sent, offset)
    view.store.flush()
    view.store.file.close()

    again, _ = _view(tmp_path)
    store = again.store
    assert store.persisted_offset(SimpleNamespace(partition=0)) == 4
    assert store.persisted_offset(SimpleNamespace(partition=1)) == 3
    assert store.persisted_offset(SimpleNamespace(partition=5)) is None
    assert again.reads.job("j3")["due_ms"] == DAY * 365 * 100  # type: ignore[index]
    # faust's recovery hands over the records after those offsets
    newer = orjson.dumps({"job_id": "j1", "state": "succeeded", "updated_ms": 99, "queue": "q"})
    batch = [
        SimpleNamespace(message=SimpleNamespace(key=b'"j1"', value=newer, partition=1, offset=9)),
        SimpleNamespace(message=SimpleNamespace(key=b'"j0"', value=None, partition=0, offset=7)),
    ]
    store.apply_changelog_batch(batch, lambda k: k, lambda v: v)
    assert store.restored == 2
    assert again.metrics.status_restored._value.get() == 2
    assert again.reads.job("j1")["state"] == "succeeded"  # type: ignore[index]
    assert again.reads.job("j0") is None
    assert store.file.offsets == {0: 7, 1: 9}


def test_jobs_of_partitions_owned_elsewhere_are_not_answered(tmp_path: Path) -> None:
    view, sent = _view(tmp_path)
    _fold(view, 4, "x", "scheduled", 1)
    _ack(view, sent, 0)
    view.store.flush()
    view.store.active = frozenset({0, 1})
    assert view.reads.job("x") is None
    view.store.active = frozenset({4})
    assert view.reads.job("x") is not None


def test_the_sweep_removes_finished_jobs_after_the_retention_and_never_a_pending_one(
    tmp_path: Path,
) -> None:
    view, sent = _view(tmp_path)
    now = 100 * DAY
    retention = 7 * DAY
    _fold(view, 0, "old-done", "succeeded", now - retention - 1)
    _fold(view, 0, "new-done", "dead", now - retention + 1000)
    _fold(view, 0, "old-pending", "scheduled", now - 400 * DAY, due_ms=now + 3650 * DAY)
    _fold(view, 0, "old-running", "started", now - 30 * DAY)
    _fold(view, 1, "elsewhere", "succeeded", now - 30 * DAY)
    _fold(view, 0, "changing", "succeeded", now - 30 * DAY)
    for offset in range(len(sent)):
        _ack(view, sent, offset)
    view.store.flush()
    _fold(view, 0, "changing", "fired", now - 29 * DAY)  # a redrive: staged, not saved yet

    removed = asyncio.run(view.fold.sweep(now_ms=now, retention_ms=retention, partitions={0}))

    assert removed == 1
    tombstones = [(job_id, p) for job_id, p, v, _ in sent if v is None]
    assert tombstones == [("old-done", 0)]
    assert view.reads.job("old-done") is None
    for kept in ("new-done", "old-pending", "old-running", "changing"):
        assert view.reads.job(kept) is not None, kept
    assert view.store.file.get("elsewhere") is not None, "another view's partition"
    assert view.counts.of_partition(0) == {
        "default": {"dead": 1, "scheduled": 1, "started": 1, "fired": 1}
    }


def test_a_big_sweep_yields_and_removes_every_expired_job(tmp_path: Path) -> None:
    view, sent = _view(tmp_path)
    for i in range(2500):
        _fold(view, 0, f"d{i}", "succeeded", 1 + i)
    for offset in range(len(sent)):
        _ack(view, sent, offset)
    view.store.flush()
    removed = asyncio.run(view.fold.sweep(now_ms=DAY * 10, retention_ms=DAY, partitions={0}))
    assert removed == 2500
    for offset in range(len(sent)):
        _ack(view, sent, 10_000 + offset)
    view.store.flush()
    assert view.store.file.count() == 0


def test_the_recent_list_after_a_restart_comes_from_the_file(tmp_path: Path) -> None:
    view, sent = _view(tmp_path)
    for i in range(5):
        _fold(view, 0, f"j{i}", "scheduled", 100 - i)
    for offset in range(len(sent)):
        _ack(view, sent, offset)
    view.store.flush()
    view.store.file.close()
    again, _ = _view(tmp_path)
    again._seed_after_recovery()
    assert [j["job_id"] for j in again.reads.recent_jobs()] == ["j0", "j1", "j2", "j3", "j4"]


def test_the_memory_store_reads_the_whole_changelog_at_each_start(tmp_path: Path) -> None:
    view, sent = _view(tmp_path, status_store="memory")
    _fold(view, 0, "m", "scheduled", 1)
    _ack(view, sent, 0)
    view.store.flush()
    assert view.reads.job("m") is not None
    assert view.store.persisted_offset(SimpleNamespace(partition=0)) == 0
    assert not list(tmp_path.iterdir()), "nothing on disk"
    again, _ = _view(tmp_path, status_store="memory")
    assert again.store.persisted_offset(SimpleNamespace(partition=0)) is None
    assert again.reads.job("m") is None


def test_the_hot_views_are_bounded(tmp_path: Path) -> None:
    view, sent = _view(tmp_path, status_hot_jobs=3)
    for i in range(10):
        _fold(view, 0, f"j{i}", "scheduled", i)
    assert len(view.store._hot) == 3
    for offset in range(len(sent)):
        _ack(view, sent, offset)
    view.store.flush()
    assert view.store.unsaved == 0
    assert all(view.reads.job(f"j{i}") is not None for i in range(10))


def test_waiting_for_a_job_to_end_or_change(tmp_path: Path) -> None:
    view, _sent = _view(tmp_path)

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        final = asyncio.ensure_future(view.reads.wait_job("w", until="final", timeout_s=10))
        change = asyncio.ensure_future(view.reads.wait_job("w", until="change", timeout_s=10))
        await asyncio.sleep(0)
        _fold(view, 0, "w", "scheduled", 1)  # unknown -> known: a change
        out["change"] = await change
        assert not final.done()
        _fold(view, 0, "w", "started", 2)
        await asyncio.sleep(0)
        assert not final.done()
        _fold(view, 0, "w", "succeeded", 3)
        out["final"] = await final
        out["final_again"] = await view.reads.wait_job("w", until="final", timeout_s=10)
        out["timeout"] = await view.reads.wait_job("nope", until="change", timeout_s=0.05)
        out["waiters"] = dict(view.waiters.pending)
        return out

    got = asyncio.run(run())
    assert got["change"]["state"] == "scheduled"
    assert got["final"]["state"] == "succeeded"
    assert got["final_again"]["state"] == "succeeded", "already final: at once"
    assert got["timeout"] is None
    assert got["waiters"] == {}
    with pytest.raises(ValueError, match="until"):
        asyncio.run(view.reads.wait_job("w", until="soon", timeout_s=1))


def test_unknown_outcome_fields_are_carried_into_the_view(tmp_path: Path) -> None:
    from dueflow.rules.job_state import apply_outcome

    base = {"job_id": "a", "queue": "q", "task": "t", "state": "started", "at_ms": 1}
    view = apply_outcome(None, {**base, "progress": 0.5, "result": None}, partition=0)
    assert view["progress"] == 0.5
    assert "result" not in view
    view = apply_outcome(
        view, {**base, "state": "succeeded", "at_ms": 2, "result": {"n": 1}}, partition=0
    )
    assert view["result"] == {"n": 1}
    assert view["progress"] == 0.5
    # (a redrive's attempt: a `started` after the end would be a late report, ignored)
    again = {**base, "state": "retrying"}
    view = apply_outcome(view, {**again, "history": "not mine", "at_ms": 3}, partition=0)
    assert isinstance(view["history"], list), "the view's own fields are not overwritten"
    view = apply_outcome(view, {**again, "queue": "other", "at_ms": 4}, partition=0)
    assert view["queue"] == "q"
    assert view["queues"] == ["q", "other"]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_after_a_kill_the_counts_are_counted_from_the_job_views(kind: str, tmp_path: Path) -> None:
    """A view killed after its jobs' changelog records were stored (rows written)
    restarts with counts that say what the job views say: nothing else holds them."""
    store_kind = "memory" if kind == "memory" else "sqlite"
    view, sent = _view(tmp_path, status_store=store_kind)
    for i in range(80):
        _fold(view, i % 2, f"old{i}", "scheduled", 1 + i, due_ms=DAY * 365 * 100)
    for i in range(30):
        _fold(view, i % 2, f"k{i}", "scheduled", 100 + i, due_ms=DAY * 365 * 100)
    _fold(view, 0, "old0", "succeeded", 200)
    for offset in range(len(sent)):
        _ack(view, sent, offset)
    view.store.flush()
    _fold(view, 1, "old1", "started", 201)  # staged: its record is not stored yet
    expected = {"scheduled": 108, "succeeded": 1, "started": 1}
    assert view.reads.queues()["queues"]["default"]["counts"] == expected
    file = view.store.file  # a kill -9: nothing more is written, the file stays

    again, _ = _view(tmp_path, status_store=store_kind)
    if kind == "memory":
        again.store.file = file  # what the changelog brings back into memory
    again.store._staged = dict(view.store._staged)  # a view staged before a rebalance
    changelog = again.jobs.changelog_topic.get_topic_name()
    recovered = again.store.on_recovery_completed  # faust's hook after each recovery
    asyncio.run(recovered({TP(changelog, 0), TP(changelog, 1)}, set()))

    assert again.reads.queues()["queues"]["default"]["counts"] == expected
    assert again.metrics.status_jobs.labels("default", "scheduled")._value.get() == 108
    asyncio.run(recovered({TP(changelog, 1)}, set()))  # partition 0 went to another view
    assert again.reads.queues()["queues"]["default"]["counts"] == {"scheduled": 54, "started": 1}
    assert again.metrics.status_jobs.labels("default", "succeeded")._value.get() == 0
