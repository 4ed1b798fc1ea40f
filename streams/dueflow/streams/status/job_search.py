"""Finding jobs in the status view's job file: the filter, its indexes, its query (pure).

A search names any of: states, queues, tasks, a due-time range, a job id
prefix and a piece of error text (type or message of the job's newest
error, case-insensitive for ASCII). Answers are the newest jobs first (by
their last change, ``updated_ms``), a page at a time: the page's
:attr:`JobPage.next` cursor (the ``(updated_ms, rowid)`` of its last row)
asks for the page after it (keyset paging: a page costs the same however
deep it is, and a job changed meanwhile moves to the front instead of being
shown twice on one page).

The job file keeps each job's view as JSON; the indexes below are on
expressions over it (:data:`SEARCH_INDEXES`), so the rows and the changelog
need no new column and a file of an older layout only gains the indexes
(``JobFile.ensure_search_indexes``, on a thread at the store's start). A
search uses the same expressions, so SQLite can use them.

:func:`parse_filter` reads a filter from query parameters with an error
naming the field, the value and what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dueflow.errors import InvalidInput
from dueflow.rules.job_state import STATES

# The view's fields as SQL expressions over the row's JSON.
_VIEW = "CAST(view AS TEXT)"
STATE = f"json_extract({_VIEW}, '$.state')"
QUEUE = f"json_extract({_VIEW}, '$.queue')"
TASK = f"json_extract({_VIEW}, '$.task')"
DUE = f"json_extract({_VIEW}, '$.due_ms')"
LAST_ERROR = f"json_extract({_VIEW}, '$.last_error')"
# "<type>: <message>" of the newest error, its first 300 characters.
ERROR_TEXT = (
    f"substr(coalesce(json_extract({_VIEW}, '$.last_error.type'), '') || ': ' || "
    f"coalesce(json_extract({_VIEW}, '$.last_error.message'), ''), 1, 300)"
)

SEARCH_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs ({STATE}, updated_ms)",
    f"CREATE INDEX IF NOT EXISTS jobs_by_queue ON jobs ({QUEUE}, updated_ms)",
    f"CREATE INDEX IF NOT EXISTS jobs_by_task ON jobs ({TASK}, updated_ms)",
    f"CREATE INDEX IF NOT EXISTS jobs_by_due ON jobs ({DUE})",
    # Covering: a text search (with states, queues, tasks) reads this index only,
    # newest first, never the rows.
    f"CREATE INDEX IF NOT EXISTS jobs_error_text ON jobs "
    f"(updated_ms, {ERROR_TEXT}, {STATE}, {QUEUE}, {TASK}, partition) "
    f"WHERE {LAST_ERROR} IS NOT NULL",
    # Covering: the per-queue counts at recovery read this index only, never the rows.
    f"CREATE INDEX IF NOT EXISTS jobs_by_partition_state ON jobs (partition, {QUEUE}, {STATE})",
)
# A due range or id prefix matching fewer rows than this is read through its own
# index (then sorted); a wider one is checked row by row along the newest-first
# order, which finds a page after a few thousand rows at most.
SELECTIVE_ROWS = 2000
_NEWEST = "updated_ms DESC, rowid DESC"

# "running" is what an operator calls a started job.
STATE_ALIASES = {"running": "started"}
SEARCH_STATES = (*STATES, "running")
PAGE_DEFAULT = 50
PAGE_MAX = 500
MAX_VALUES = 20  # states, queues or tasks in one filter
MAX_TEXT = 200  # characters of an id prefix or an error text

FILTER_FIELDS = ("state", "queue", "task", "due_from", "due_to", "id_prefix", "error")


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a search looks for (every field optional; all given must hold)."""

    states: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    due_from_ms: int | None = None  # inclusive
    due_to_ms: int | None = None  # exclusive
    id_prefix: str | None = None
    error: str | None = None

    def kind(self) -> str:
        """The fields this filter uses, joined (``"all"`` for none): for logs and
        benchmarks."""
        used = [
            name
            for name, on in (
                ("state", self.states),
                ("queue", self.queues),
                ("task", self.tasks),
                ("due", self.due_from_ms is not None or self.due_to_ms is not None),
                ("id_prefix", self.id_prefix),
                ("error", self.error),
            )
            if on
        ]
        return "+".join(used) or "all"

    def to_json(self) -> dict[str, Any]:
        return {
            "state": list(self.states),
            "queue": list(self.queues),
            "task": list(self.tasks),
            "due_from_ms": self.due_from_ms,
            "due_to_ms": self.due_to_ms,
            "id_prefix": self.id_prefix,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: the ``updated_ms`` and rowid of its last row."""

    updated_ms: int
    rowid: int

    def text(self) -> str:
        return f"{self.updated_ms}.{self.rowid}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        head, _, tail = text.partition(".")
        if not (head.isdigit() and tail.isdigit()):
            raise InvalidInput("before", text, "the `next` cursor of an earlier page")
        return cls(int(head), int(tail))


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of views (JSON documents as stored), newest first, and the cursor of
    the next page (None: this was the last)."""

    views: list[bytes]
    next: Cursor | None


def _values(query: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = query.get(name)
    if raw is None or not raw.strip():
        return ()
    values = tuple(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))
    if len(values) > MAX_VALUES:
        raise InvalidInput(name, raw, f"at most {MAX_VALUES} comma-separated values")
    return values


def parse_time_ms(name: str, raw: str) -> int:
    """An instant from a query parameter: epoch milliseconds, or ISO 8601 with a
    UTC offset (``2026-12-05T02:00:00Z``)."""
    text = raw.strip()
    if text.isdigit():
        return int(text)
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidInput(
            name, raw, "epoch milliseconds or ISO 8601 with an offset (2026-12-05T02:00:00Z)"
        )
    return int(at.timestamp() * 1000)


def _text(query: Mapping[str, str], name: str) -> str | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_TEXT:
        raise InvalidInput(name, raw[:40] + "...", f"at most {MAX_TEXT} characters")
    return raw


def parse_filter(query: Mapping[str, str]) -> JobFilter:
    """The filter of a search's query parameters (:data:`FILTER_FIELDS`); raises
    :class:`InvalidInput` naming the field for a bad value."""
    states = _values(query, "state")
    for s in states:
        if s not in SEARCH_STATES:
            raise InvalidInput("state", s, f"one of {', '.join(SEARCH_STATES)}")
    due_from = query.get("due_from")
    due_to = query.get("due_to")
    flt = JobFilter(
        states=tuple(dict.fromkeys(STATE_ALIASES.get(s, s) for s in states)),
        queues=_values(query, "queue"),
        tasks=_values(query, "task"),
        due_from_ms=None if not due_from else parse_time_ms("due_from", due_from),
        due_to_ms=None if not due_to else parse_time_ms("due_to", due_to),
        id_prefix=_text(query, "id_prefix"),
        error=_text(query, "error"),
    )
    if (
        flt.due_from_ms is not None
        and flt.due_to_ms is not None
        and flt.due_to_ms <= flt.due_from_ms
    ):
        raise InvalidInput("due_to", due_to, "a time after due_from")
    return flt


def parse_limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return PAGE_DEFAULT
    if not raw.isdigit() or not 1 <= int(raw) <= PAGE_MAX:
        raise InvalidInput("limit", raw, f"an integer from 1 to {PAGE_MAX}")
    return int(raw)


def _like(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere (``\\`` escapes)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def prefix_end(prefix: str) -> str:
    """The smallest string after every string starting with ``prefix``."""
    return prefix + "\U0010ffff"


def due_terms(flt: JobFilter, *, indexed: bool = True) -> tuple[list[str], list[Any]]:
    """The due-range terms of ``flt`` (``indexed`` False: written so that SQLite
    cannot use their index, a unary ``+``)."""
    expr = DUE if indexed else f"+{DUE}"
    where: list[str] = []
    args: list[Any] = []
    if flt.due_from_ms is not None:
        where.append(f"{expr} >= ?")
        args.append(flt.due_from_ms)
    if flt.due_to_ms is not None:
        where.append(f"{expr} < ?")
        args.append(flt.due_to_ms)
    return where, args


def prefix_terms(flt: JobFilter, *, indexed: bool = True) -> tuple[list[str], list[Any]]:
    """The id-prefix terms of ``flt`` (``indexed`` as for :func:`due_terms`)."""
    if not flt.id_prefix:
        return [], []
    col = "job_id" if indexed else "+job_id"
    return [f"{col} >= ? AND {col} < ?"], [flt.id_prefix, prefix_end(flt.id_prefix)]


def probe_sql(terms: tuple[list[str], list[Any]]) -> tuple[str, list[Any]]:
    """Counts up to :data:`SELECTIVE_ROWS` rows matching ``terms`` (through their index)."""
    where, args = terms
    sql = (
        f"SELECT count(*) FROM (SELECT 1 FROM jobs WHERE {' AND '.join(where)} "
        f"LIMIT {SELECTIVE_ROWS})"
    )
    return sql, args


def search_sql(
    flt: JobFilter,
    *,
    before: Cursor | None,
    limit: int,
    partitions: frozenset[int] | None = None,
    selective: frozenset[str] = frozenset({"due", "id_prefix"}),
) -> tuple[str, list[Any]]:
    """The SQL of one page (``limit`` + 1 rows: the extra one tells there is a next
    page) and its parameters. ``selective``: of ``"due"`` and ``"id_prefix"``, those
    narrow enough to read through their own index (:data:`SELECTIVE_ROWS`)."""
    where: list[str] = []
    args: list[Any] = []

    def any_of(expr: str, values: tuple[str, ...]) -> None:
        where.append(f"{expr} IN ({', '.join('?' * len(values))})")
        args.extend(values)

    if flt.states:
        any_of(STATE, flt.states)
    if flt.queues:
        any_of(QUEUE, flt.queues)
    if flt.tasks:
        any_of(TASK, flt.tasks)
    for terms in (
        due_terms(flt, indexed="due" in selective),
        prefix_terms(flt, indexed="id_prefix" in selective),
    ):
        where.extend(terms[0])
        args.extend(terms[1])
    if flt.error:
        where.append(f"{LAST_ERROR} IS NOT NULL AND {ERROR_TEXT} LIKE ? ESCAPE '\\'")
        args.append(_like(flt.error))
    if partitions is not None:
        where.append(f"partition IN ({', '.join(str(int(p)) for p in sorted(partitions))})")
    if before is not None:
        where.append("(updated_ms < ? OR (updated_ms = ? AND rowid < ?))")
        args.extend((before.updated_ms, before.updated_ms, before.rowid))
    # The page's rowids first (from an index alone where one covers the terms), then
    # their views.
    inner = "SELECT rowid FROM jobs"
    has_due = flt.due_from_ms is not None or flt.due_to_ms is not None
    narrow = ("due" in selective and has_due) or ("id_prefix" in selective and flt.id_prefix)
    if flt.error and not narrow:
        inner += " INDEXED BY jobs_error_text"
    if where:
        inner += " WHERE " + " AND ".join(where)
    inner += f" ORDER BY {_NEWEST} LIMIT ?"
    args.append(limit + 1)
    sql = f"SELECT rowid, updated_ms, view FROM jobs WHERE rowid IN ({inner}) ORDER BY {_NEWEST}"
    return sql, args


def page_of(rows: list[tuple[int, int, bytes]], limit: int) -> JobPage:
    """The page of ``limit + 1`` rows read by :func:`search_sql`'s query."""
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = Cursor(int(rows[-1][1]), int(rows[-1][0])) if more and rows else None
    return JobPage([bytes(r[2]) for r in rows], cursor)


def matches(flt: JobFilter, job_id: str, view: Mapping[str, Any]) -> bool:
    """Whether a view passes ``flt`` (the in-memory store's search; same rules as
    the SQL)."""
    if flt.states and view.get("state") not in flt.states:
        return False
    if flt.queues and view.get("queue") not in flt.queues:
        return False
    if flt.tasks and view.get("task") not in flt.tasks:
        return False
    due = view.get("due_ms")
    if flt.due_from_ms is not None and (due is None or due < flt.due_from_ms):
        return False
    if flt.due_to_ms is not None and (due is None or due >= flt.due_to_ms):
        return False
    if flt.id_prefix and not job_id.startswith(flt.id_prefix):
        return False
    if flt.error:
        err = view.get("last_error")
        if not err:
            return False
        text = f"{err.get('type') or ''}: {err.get('message') or ''}"[:300]
        if flt.error.lower() not in text.lower():
            return False
    return True
