"""Finding jobs in the status view's job file: filters, paging, plans, the HTTP route."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dueflow.errors import InvalidInput
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.access import StatusAccess
from dueflow.streams.status.job_file import JobFile, JobRow, MemoryJobFile
from dueflow.streams.status.job_finder import JobFinder, SearchTooBroad
from dueflow.streams.status.job_search import (
    Cursor,
    JobFilter,
    JobPage,
    parse_filter,
    parse_limit,
    search_sql,
)
from dueflow.streams.status.job_store import JobStore
from dueflow.streams.status.web import build_web_app

T0 = 1_800_000_000_000
STATES = ("succeeded", "dead", "retrying", "scheduled", "cancelled", "started")


def opened(path: Path) -> JobFile:
    """A job file as the store opens it: with its search indexes."""
    file = JobFile(path).open()
    file.ensure_search_indexes()
    return file


def view(i: int, rng: random.Random) -> dict[str, Any]:
    state = STATES[i % len(STATES)]
    failed = state in ("dead", "retrying")
    return {
        "job_id": f"{i % 7:x}job-{i:05d}",
        "queue": ("billing", "email")[i % 2],
        "task": f"task_{i % 5}",
        "state": state,
        "updated_ms": T0 + (i // 3) * 1000,  # three jobs per millisecond value: ties
        "due_ms": T0 + rng.randrange(0, 100) * 60_000,
        "last_error": (
            {"type": ("ValueError", "IOError")[i % 2], "message": f"disk {i % 10} 50% full_x"}
            if failed
            else None
        ),
        "history": [["scheduled", 0, T0]],
    }


def fill(file: JobFile | MemoryJobFile, n: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    views = [view(i, rng) for i in range(n)]
    file.write(
        [
            (v["job_id"], JobRow.of(v["job_id"], i % 3, orjson.dumps(v)))
            for i, v in enumerate(views)
        ],
        {0: n},
    )
    return views


FILTERS = [
    JobFilter(),
    JobFilter(states=("dead",)),
    JobFilter(states=("dead", "retrying"), queues=("email",)),
    JobFilter(tasks=("task_3",)),
    JobFilter(due_from_ms=T0 + 10 * 60_000, due_to_ms=T0 + 20 * 60_000),
    JobFilter(due_from_ms=T0 + 50 * 60_000),
    JobFilter(id_prefix="3job-"),
    JobFilter(id_prefix="3job-001"),
    JobFilter(error="disk 4"),
    JobFilter(error="50%"),  # a LIKE wildcard, matched as text
    JobFilter(error="full_x"),
    JobFilter(error="ioerror", states=("dead",)),
    JobFilter(error="no such text"),
    JobFilter(states=("scheduled",), tasks=("task_1",), due_to_ms=T0 + 50 * 60_000),
]


def expected(views: list[dict[str, Any]], flt: JobFilter) -> list[str]:
    """What a search must find, newest change first (ties: the later written first)."""
    from dueflow.streams.status.job_search import matches

    found = [(v["updated_ms"], i, v["job_id"]) for i, v in enumerate(views)]
    return [j for _u, _i, j in sorted(found, reverse=True) if matches(flt, j, views[_i])]


def all_pages(file: JobFile | MemoryJobFile, flt: JobFilter, limit: int) -> list[str]:
    out: list[str] = []
    before: Cursor | None = None
    while True:
        page = file.search(flt, before=before, limit=limit)
        assert len(page.views) <= limit
        out.extend(orjson.loads(v)["job_id"] for v in page.views)
        if page.next is None:
            return out
        before = Cursor.parse(page.next.text())


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: f.kind())
def test_sqlite_and_memory_find_the_same_jobs_newest_first_page_by_page(
    tmp_path: Path, flt: JobFilter
) -> None:
    sql = opened(tmp_path / "jobs.sqlite")
    mem = MemoryJobFile(tmp_path / "none")
    views = fill(sql, 600)
    fill(mem, 600)
    want = expected(views, flt)
    assert all_pages(sql, flt, 7) == want
    assert all_pages(mem, flt, 7) == want
    assert all_pages(sql, flt, 500) == want
    sql.close()


def test_a_changed_job_moves_to_the_front(tmp_path: Path) -> None:
    file = opened(tmp_path / "jobs.sqlite")
    views = fill(file, 30)
    first = file.search(JobFilter(), limit=5)
    assert first.next is not None
    oldest = dict(views[0], updated_ms=T0 + 10**6)
    file.write([(oldest["job_id"], JobRow.of(oldest["job_id"], 0, orjson.dumps(oldest)))], {})
    again = file.search(JobFilter(), limit=5)
    assert orjson.loads(again.views[0])["job_id"] == views[0]["job_id"]
    # Only this view's partitions are answered.
    only = file.search(JobFilter(), limit=100, partitions=[1])
    assert {orjson.loads(v)["job_id"] for v in only.views} == {
        v["job_id"] for i, v in enumerate(views) if i % 3 == 1 and i != 0
    }


def plan(file: JobFile, flt: JobFilter, selective: frozenset[str]) -> str:
    sql, args = search_sql(flt, before=None, limit=50, selective=selective)
    return " | ".join(str(r[3]) for r in file.db.execute("EXPLAIN QUERY PLAN " + sql, args))


def test_searches_read_through_their_indexes(tmp_path: Path) -> None:
    """The plans the benchmark's figures rely on (benchmarks/job_search.py)."""
    file = opened(tmp_path / "jobs.sqlite")
    fill(file, 200)
    assert "jobs_error_text" in plan(file, JobFilter(error="disk"), frozenset())
    assert "jobs_by_state" in plan(file, JobFilter(states=("dead",)), frozenset())
    assert "jobs_by_task" in plan(file, JobFilter(tasks=("task_1",)), frozenset())
    narrow_due = JobFilter(due_from_ms=T0, due_to_ms=T0 + 1)
    assert "jobs_by_due" in plan(file, narrow_due, frozenset({"due"}))
    # A wide range is checked along the newest-first order, not read through its index.
    assert "jobs_by_due" not in plan(file, narrow_due, frozenset())
    assert "jobs_updated" in plan(file, narrow_due, frozenset())


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "runing"}, "state"),
        ({"due_from": "yesterday"}, "due_from"),
        ({"due_from": "2026-12-05T02:00:00"}, "due_from"),  # no offset
        ({"due_from": "2000", "due_to": "1000"}, "due_to"),
        ({"id_prefix": "x" * 201}, "id_prefix"),
        ({"queue": ",".join(f"q{i}" for i in range(21))}, "queue"),
    ],
)
def test_bad_filters_name_the_field(query: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_filter(query)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_filter_parsing() -> None:
    flt = parse_filter(
        {
            "state": "running,dead,dead",
            "queue": "billing",
            "due_from": "2026-12-05T02:00:00Z",
            "due_to": "1796436000001",
            "error": "timed out",
        }
    )
    assert flt.states == ("started", "dead")
    assert flt.queues == ("billing",)
    assert flt.due_from_ms == 1_796_436_000_000
    assert flt.kind() == "state+queue+due+error"
    for bad in ("0", "501", "x", "-1"):
        with pytest.raises(InvalidInput, match="limit"):
            parse_limit(bad)
    for bad in ("1.x", "x.1", "12", ""):
        with pytest.raises(InvalidInput, match="before"):
            Cursor.parse(bad)


class FakeStore:
    def __init__(self, file: JobFile | MemoryJobFile) -> None:
        self.file = file
        self.active: frozenset[int] | None = None

    def flush(self) -> int:
        return 0

    def search(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        return self.file.search(flt, before=before, limit=limit, partitions=self.active)


def test_a_search_out_of_time_is_refused_with_how_to_narrow_it(tmp_path: Path) -> None:
    # A directory name a file: URI must escape (the reader opens the file by URI).
    file = opened(tmp_path / "a dir?#%" / "jobs.sqlite")
    fill(file, 3000)
    finder = JobFinder(lambda: cast(JobStore, FakeStore(file)), budget_s=0.0)
    with pytest.raises(SearchTooBroad, match="narrow it"):
        asyncio.run(finder.find(JobFilter(error="no such text"), before=None, limit=50))
    finder.budget_s = 30.0
    page = asyncio.run(finder.find(JobFilter(error="disk 4"), before=None, limit=50))
    assert page.views
    finder.close()


class FakeConsole:
    def __init__(self, finder: JobFinder) -> None:
        self.finder = finder

    async def find_jobs(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        return await self.finder.find(flt, before=before, limit=limit)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return None

    async def dead_letter(self, view: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def payloads_for(self) -> str:
        return "operator"

    async def watch_doc(self) -> dict[str, Any]:
        return {"queues": {}}

    def trace_url(self, trace_id: str) -> str | None:
        return None

    def queue_names(self) -> list[str]:
        return []

    def operations(self) -> None:
        return None


class Source:
    """The status source the HTTP layer needs beside the console (unused here)."""

    def job(self, job_id: str) -> dict[str, Any] | None:
        return None

    async def wait_job(self, job_id: str, *, until: str, timeout_s: float) -> dict[str, Any] | None:
        return None

    def identity(self) -> dict[str, str]:
        return {}

    def queues(self) -> dict[str, Any]:
        return {"queues": {}}

    def overview(self) -> dict[str, Any]:
        return {}

    def cluster(self) -> dict[str, Any] | None:
        return None

    def queue_names(self) -> list[str]:
        return []


def test_get_api_jobs_pages_and_refuses_bad_parameters(tmp_path: Path) -> None:
    file = MemoryJobFile(tmp_path / "none")
    views = fill(file, 120)
    finder = JobFinder(lambda: cast(JobStore, FakeStore(file)))
    app = build_web_app(
        Source(), Metrics(), access=StatusAccess(token="t" * 20), console=FakeConsole(finder)
    )

    async def run() -> tuple[list[str], dict[str, Any], int]:
        async with TestClient(TestServer(app)) as client:
            seen: list[str] = []
            url = "/api/jobs?state=dead&limit=4"
            while True:
                resp = await client.get(url)
                assert resp.status == 200
                doc = await resp.json()
                assert all("history" not in j for j in doc["jobs"])
                seen.extend(j["job_id"] for j in doc["jobs"])
                if doc["next"] is None:
                    break
                url = f"/api/jobs?state=dead&limit=4&before={doc['next']}"
            bad = await client.get("/api/jobs?state=nope")
            return seen, await bad.json(), bad.status

    seen, bad, status = asyncio.run(run())
    assert seen == expected(views, JobFilter(states=("dead",)))
    assert status == 400
    assert bad["field"] == "state"
    assert "running" in bad["error"]


def test_a_file_without_the_search_indexes_gains_them_at_start_off_the_loop(
    tmp_path: Path,
) -> None:
    """Building them over a big file takes minutes: on the loop, the probes would fail
    meanwhile (and a liveness probe would restart the view before they are done)."""
    import threading

    from dueflow.config import Settings
    from dueflow.streams.status.app import StatusView

    view = StatusView(Settings(), metrics=Metrics(), data_dir=tmp_path)
    older = JobFile(view.job_file_path).open()  # as a version without the indexes left it
    fill(older, 50)
    older.close()
    store = view.store
    file = cast(JobFile, store.file)
    threads: list[int] = []
    build = file.ensure_search_indexes

    def on_a_thread() -> float:
        threads.append(threading.get_ident())
        return build()

    file.ensure_search_indexes = on_a_thread  # type: ignore[method-assign]

    async def start() -> int:
        await store.on_start()
        return threading.get_ident()

    loop_thread = asyncio.run(start())
    assert threads
    assert loop_thread not in threads
    names = {r[0] for r in file.db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {
        "jobs_by_state",
        "jobs_by_queue",
        "jobs_by_task",
        "jobs_by_due",
        "jobs_error_text",
    } <= names
    file.close()
