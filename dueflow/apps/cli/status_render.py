"""What ``dueflow status`` and ``dueflow job`` print (pure): one status document for
both sources (the status view's overview, or the cluster read from Kafka), its text
form, a job's view as rows, and what an overdue pending job waits for."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from dueflow.apps.cli.common import format_table
from dueflow.control_chars import escape_text, json_text
from dueflow.rules.job_status import PENDING_STATES


def status_from_overview(overview: dict[str, Any]) -> dict[str, Any]:
    counts = {q: v.get("counts", {}) for q, v in overview.get("queues", {}).items()}
    cluster = overview.get("cluster") or {}
    doc = status_from_cluster(cluster, counts=counts, source="status-view")
    doc["recent_failures"] = overview.get("recent_failures", [])
    return doc


def status_from_cluster(
    cluster: dict[str, Any], *, counts: dict[str, dict[str, int]] | None, source: str
) -> dict[str, Any]:
    """One document for both sources (the shape of ``status --json``)."""
    queues: dict[str, Any] = {}
    names = set(cluster.get("lag_by_queue", {})) | set(counts or {})
    for q in sorted(names):
        queues[q] = {
            "counts": None if counts is None else counts.get(q, {}),
            "lag": cluster.get("lag_by_queue", {}).get(q),
            "dlq_depth": cluster.get("dlq_depth", {}).get(q),
            "paused": cluster.get("paused", {}).get(q),
        }
    return {
        "source": source,
        "queues": queues,
        "timers_pending": cluster.get("timers_pending", {}),
        "active_emitter": cluster.get("active_emitter"),
        "emitter_members": cluster.get("emitter_members"),
        "emitter_shards": cluster.get("emitter_shards", {}),
        "dlq_tail": cluster.get("failures", []),
        "recent_failures": [],
        "errors": cluster.get("errors", []),
    }


def render_status(doc: dict[str, Any]) -> str:
    """The human form of ``status``."""
    lines = [f"source: {doc['source']}"]
    states = ["scheduled", "fired", "started", "retrying", "succeeded", "dead", "cancelled"]
    rows = []
    for q, info in doc["queues"].items():
        counts = info["counts"]
        cells = ["-" if counts is None else counts.get(s, 0) for s in states]
        paused = info.get("paused")
        state = f"paused by {paused.get('by') or '?'}" if paused else "running"  # a cell: escaped
        rows.append([q, *cells, _dash(info["lag"]), _dash(info["dlq_depth"]), state])
    lines += ["", format_table(["queue", *states, "lag", "dlq", "workers"], rows)]
    if doc["source"] == "kafka":
        lines.append("(counts by state need the status view: `dueflow status-view`)")
    timers = doc["timers_pending"]
    if timers:
        lines += [
            "",
            "pending timers: "
            + ", ".join(f"{escape_text(k)}={escape_text(v)}" for k, v in timers.items()),
        ]
    holder = doc["active_emitter"]
    if holder:
        lines.append(
            f"active emitter: {escape_text(holder['client_id'])} {escape_text(holder['host'])} "
            f"({doc['emitter_members']} member(s) in the group)"
        )
    else:
        lines.append("active emitter: NONE")
    shards = doc.get("emitter_shards") or {}
    if len(shards) > 1:
        lines.append(
            "emitter shards: "
            + ", ".join(
                f"{escape_text(k)}={escape_text(v or 'NONE')}"
                for k, v in sorted(shards.items(), key=lambda kv: _shard_order(kv[0]))
            )
        )
    if doc["dlq_tail"]:
        lines += ["", "newest dead letters:"]
        lines.append(
            format_table(
                ["queue", "job", "task", "reason", "error", "attempts", "dead at"],
                [
                    [
                        f["queue"],
                        f["job_id"],
                        f["task"],
                        f["reason"],
                        _short(escape_text(f"{f['error_type']}: {f['error_message']}")),
                        f["attempts"],
                        _when(f["dead_ms"]),
                    ]
                    for f in doc["dlq_tail"][:10]
                ],
            )
        )
    for err in doc["errors"]:
        lines.append(f"warning: {escape_text(err)}")
    return "\n".join(lines)


# What the status view says of a job it does not know (its table keeps every job
# until it ends, and an ended one for observability.status_retention_ms).
UNKNOWN_JOB = (
    "the status view has no outcome of it: no such job, a job of a client with "
    "scheduled_outcomes=False not run yet, or one that ended longer ago than "
    "observability.status_retention_ms"
)


# No outcome of the job: a client writes `scheduled` for every job it schedules
# unless scheduled_outcomes=False, so a job without one is most likely not there.
UNKNOWN = (
    "unknown: no outcome found (no such job; or scheduled by a client with "
    "scheduled_outcomes=False and not run yet)"
)


# A job still pending this long after its due time is waiting for something.
OVERDUE_MS = 5_000


def overdue(view: dict[str, Any], *, now_ms: int) -> bool:
    """Pending (no worker has reported on it) well past its due time."""
    due_ms = view.get("due_ms")
    return (
        view.get("state") in PENDING_STATES
        and due_ms is not None
        and now_ms - int(due_ms) >= OVERDUE_MS
    )


def waiting_note(view: dict[str, Any], *, now_ms: int, emitter_active: bool | None) -> str | None:
    """What an overdue pending job waits for (pure): an emitter, or a worker."""
    late = _span(now_ms - int(view["due_ms"]))
    if emitter_active is False:
        return (
            f"due {late} ago and no emitter is active: nothing fires due jobs until one "
            "runs (start one: `dueflow emitter`)"
        )
    if emitter_active:
        return (
            f"due {late} ago; an emitter is active, so it has fired or is about to, and no "
            f"worker has reported on it yet: is a worker serving queue {view['queue']!r}? "
            "(`dueflow status` shows its lag)"
        )
    return None


# Shown on their own rows by render_job.
_PROGRESS_AND_RESULT = frozenset(
    {"progress", "progress_detail", "progress_attempt", "progress_ms", "result", "result_error"}
)


def render_job(view: dict[str, Any], *, now_ms: int | None = None) -> str:
    """The human form of ``job`` (``now_ms``: say how far the due time is)."""
    err = view.get("last_error")
    state = str(view["state"])
    due_ms = view.get("due_ms")
    due = _when(due_ms)
    if state in PENDING_STATES:
        state += " (pending: not started)"
        due = _due_in(due_ms, now_ms)
    history = view.get("history") or []
    last = "-"
    if history and len(history[-1]) >= 3:
        what, attempt, at = history[-1][:3]
        last = f"{what} (attempt {attempt}) at {_when(at)}"
    rows = [
        ("job", view["job_id"]),
        ("queue / task", f"{view['queue']} / {view['task']}"),
        ("state", state),
        ("attempts", view["attempts"]),
        ("due", due),
        ("last outcome", last),
        ("first seen", _when(view.get("first_seen_ms"))),
        ("fired", _when(view.get("fired_ms"))),
        ("started", _when(view.get("started_ms"))),
        ("finished", _when(view.get("finished_ms"))),
        ("last update", _when(view.get("updated_ms"))),
        ("duration", "-" if view.get("duration_ms") is None else f"{view['duration_ms']:.1f} ms"),
        ("last error", "-" if not err else f"{err.get('type')}: {err.get('message')}"),
        ("trace id", view.get("trace_id") or "-"),
    ]
    next_due_ms = view.get("next_due_ms")
    if view.get("state") == "retrying" and next_due_ms is not None:
        rows.insert(5, ("next attempt due", _due_in(next_due_ms, now_ms)))
    if view.get("progress") is not None or view.get("progress_detail") is not None:
        rows.insert(3, ("progress", render_progress(view)))
    if view.get("result") is not None:
        rows.append(("result", _short(json_text(view["result"]), 200)))
    if view.get("result_error"):
        rows.append(("result error", view["result_error"]))
    # Fields of newer outcomes as they come.
    rows += [
        (k.replace("_", " "), _short(json.dumps(v, default=str), 200))
        for k, v in view.items()
        if k not in _RENDERED and k not in _PROGRESS_AND_RESULT and v is not None
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {escape_text(v)}" for k, v in rows)


def _due_in(due_ms: Any, now_ms: int | None) -> str:
    """``2030-01-01 00:00:01.000Z (in 42s)``: a due time and how far it is from now."""
    due = _when(due_ms)
    if due_ms is None or now_ms is None:
        return due
    try:
        ahead = int(due_ms) - now_ms
    except (TypeError, ValueError):  # another writer's value: shown as it is
        return due
    return due + (f" (in {_span(ahead)})" if ahead >= 0 else f" ({_span(-ahead)} ago)")


def render_progress(view: dict[str, Any]) -> str:
    """``40% {"rows": 4} (attempt 1, 2030-01-01 00:00:01.000Z)``: a job's newest progress."""
    parts = []
    fraction = view.get("progress")
    if isinstance(fraction, int | float):
        parts.append(f"{fraction * 100:.0f}%")
    if view.get("progress_detail") is not None:
        parts.append(_short(json_text(view["progress_detail"]), 120))
    parts.append(f"(attempt {view.get('progress_attempt')}, {_when(view.get('progress_ms'))})")
    return " ".join(parts)


# View fields render_job shows above, or keeps to --json.
_RENDERED = frozenset(
    {
        "job_id",
        "queue",
        "queues",
        "task",
        "idempotency_key",
        "state",
        "attempts",
        "due_ms",
        "next_due_ms",
        "history",
        "first_seen_ms",
        "fired_ms",
        "started_ms",
        "finished_ms",
        "updated_ms",
        "duration_ms",
        "last_error",
        "trace_id",
        "worker",
        "schedule_id",
        "duplicates",
        "partition",
    }
)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, ValueError, OSError, TypeError):  # another writer's number
        return f"{escape_text(ms)} ms (not a date)"


def _span(ms: int) -> str:
    """``1d 2h``, ``3m 5s``, ``800ms``: the two largest units of a duration."""
    if ms < 1000:
        return f"{ms}ms"
    parts: list[str] = []
    rest = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if rest >= size or parts:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return " ".join(p for p in parts[:2])


def _shard_order(key: object) -> tuple[int, str]:
    """Shards by number; a key that is no number (another writer's) last."""
    text = str(key)
    return (int(text), "") if text.isdigit() and text.isascii() else (1 << 62, text)


def _dash(v: object) -> object:
    return "-" if v is None else v


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
