"""One job's page in the console: its timeline, its attempts, its payload (pure).

The timeline is the job's history as the status view folded it (the newest
``HISTORY_LIMIT`` outcomes, each ``[state, attempt, at_ms, detail?]``), plus
the times the view keeps beside it (due; fired, when the emitter's fire time
of the newest delivery is not an outcome of its own), and after each
``retrying`` whose worker said when the next attempt is due (its
``next_due_ms``) a ``retry_due`` event at that time, for that next attempt.
The attempts group it by attempt number (worker, start, end, outcome, error,
and a retried attempt's ``retry_due_ms``). A dead job's dead
letter, read from its DLQ on request, adds the traceback, the payload and
where the job died from; payloads and results are shown as indented JSON cut
to :data:`SHOW_BYTES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from dueflow.rules.job_state import HISTORY_LIMIT

SHOW_BYTES = 64 * 1024  # of a payload or result shown
ENDED = frozenset({"succeeded", "retrying", "dead"})
RETRY_DUE = "retry_due"  # the timeline's event: when a retried job's next attempt is due


def timeline(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The job's events, oldest first: each ``{state, attempt, at_ms, ...detail}``."""
    events: list[dict[str, Any]] = []
    for entry in view.get("history") or ():
        if len(entry) < 3:
            continue
        event: dict[str, Any] = {"state": entry[0], "attempt": entry[1], "at_ms": entry[2]}
        if len(entry) > 3 and isinstance(entry[3], Mapping):
            event.update(entry[3])
        events.append(event)
        if event["state"] == "retrying" and event.get("next_due_ms") is not None:
            attempt = int(event["attempt"] or 0) + 1
            events.append({"state": RETRY_DUE, "attempt": attempt, "at_ms": event["next_due_ms"]})
    if view.get("due_ms") is not None:
        events.append({"state": "due", "attempt": 0, "at_ms": view["due_ms"]})
    fired = view.get("fired_ms")
    if fired is not None and not any(e["state"] == "fired" and e["at_ms"] == fired for e in events):
        # The emitter's fire time of the newest delivery (the df-fired header).
        events.append({"state": "fired", "attempt": 0, "at_ms": fired})
    events.sort(key=lambda e: (e["at_ms"], e["state"] != "due"))
    return events


def attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per attempt that ran: worker, start, end, outcome, error; a retried
    attempt's ``retry_due_ms`` (when the next one is due), when its worker said."""
    rows: dict[int, dict[str, Any]] = {}
    for e in events:
        n = int(e.get("attempt") or 0)
        if n < 1 or e["state"] == RETRY_DUE:  # of an attempt that has not run (yet)
            continue
        row = rows.setdefault(n, {"attempt": n, "worker": None, "started_ms": None})
        if e.get("worker"):
            row["worker"] = e["worker"]
        if e["state"] == "started":
            row["started_ms"] = e["at_ms"]
        if e["state"] in ENDED:
            row["outcome"] = e["state"]
            row["ended_ms"] = e["at_ms"]
            if e.get("duration_ms") is not None:
                row["duration_ms"] = e["duration_ms"]
                row["started_ms"] = row["started_ms"] or int(e["at_ms"] - e["duration_ms"])
            if e.get("error") is not None or e.get("error_type") is not None:
                row["error"] = {"type": e.get("error_type"), "message": e.get("error")}
            if e["state"] == "retrying" and e.get("next_due_ms") is not None:
                row["retry_due_ms"] = e["next_due_ms"]
    return [rows[n] for n in sorted(rows)]


def pretty_json(raw: bytes) -> str | None:
    """``raw`` indented when it is JSON; None when it is not."""
    try:
        return orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return None


def shown(value: Any, *, limit: int = SHOW_BYTES) -> dict[str, Any]:
    """``value`` as indented JSON text cut to ``limit`` bytes: ``{text, bytes,
    truncated}`` (bytes that are not UTF-8 are shown as ``\\xNN`` escapes)."""
    if isinstance(value, bytes | bytearray | str):
        raw_in = (
            value.encode("utf-8", "backslashreplace") if isinstance(value, str) else bytes(value)
        )
        text = pretty_json(raw_in) or raw_in.decode("utf-8", "backslashreplace")
    else:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
    raw = text.encode("utf-8", "backslashreplace")
    cut = raw[:limit].decode("utf-8", "ignore")
    return {"text": cut, "bytes": len(raw), "truncated": len(raw) > limit}


def job_page(view: Mapping[str, Any], *, payloads: bool) -> dict[str, Any]:
    """The job's page document (``payloads`` False: result fields are withheld)."""
    events = timeline(view)
    doc: dict[str, Any] = {
        "job": {k: v for k, v in view.items() if k != "history"},
        "timeline": events,
        "attempts": attempts(events),
        "history_limited": len(view.get("history") or ()) >= HISTORY_LIMIT,
    }
    if "result" in view:
        doc["job"].pop("result", None)
        doc["result"] = shown(view["result"]) if payloads else None
    return doc


def dead_letter_page(details: Mapping[str, Any], *, payloads: bool) -> dict[str, Any]:
    """A DLQ record's details (``dueflow.apps.ops.dlq.DeadLetterEntry.details``) as the
    job page shows them: traceback, origin, payload (``payloads`` False: withheld)."""
    job = details.get("job") or {}
    out = {
        k: details.get(k)
        for k in (
            "ref",
            "queue",
            "reason",
            "error_type",
            "error_message",
            "attempts",
            "dead_ms",
            "first_failure_ms",
            "last_failure_ms",
            "original",
            "trace_id",
        )
    }
    out["traceback"] = shown(details.get("traceback") or "")["text"]
    out["redriven_by"] = (details.get("job_headers") or {}).get("df-redriven-by")
    out["payload"] = shown(job.get("payload")) if payloads else None
    return out
