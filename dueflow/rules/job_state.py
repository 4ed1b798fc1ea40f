"""What the status view knows about one job, and how an outcome changes it (pure).

A job's view is a plain dict (the value of the faust table, stored as JSON)
built by folding the job's outcome records in log order with
:func:`apply_outcome`. Per-queue counts by state change by the deltas of
:func:`count_deltas`. Nothing here reads the clock: ``now_ms`` is an argument.

Rules:

- the state follows the newest outcome, except ``duplicate`` (a skipped
  second delivery: counted in ``duplicates``, the state stays), a worker's
  ``rescheduled`` (a delivery superseded by a reschedule, skipped: the state
  and the due time stay those of the client's ``rescheduled``, which moved
  the job; see dueflow.records.reschedule),
  ``scheduled`` once the job has any other state (the client writes it
  after the timer, so a fast job's first worker outcome can land before
  it; and a job id scheduled again after it ran stays what it was), and
  ``unknown`` (a state this reader does not know yet: ignored);
- ``attempts`` is the highest attempt seen;
- ``finished_ms`` is set by a final state and cleared when the job moves on
  again (a redriven dead job);
- ``last_error`` keeps the newest error (type, message, attempt, time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATES = (
    "scheduled",
    "fired",
    "started",
    "succeeded",
    "retrying",
    "dead",
    "cancelled",
    "duplicate",
    # outcome schema version 2
    "rescheduled",  # the client moved the job (pending, at its new due time)
    "expired",  # not started by its deadline: not run
    "skipped",  # a cron occurrence skipped by its schedule's overlap policy
)
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled", "expired", "skipped"})
HISTORY_LIMIT = 20

JobView = dict[str, Any]


def apply_outcome(
    prev: Mapping[str, Any] | None,
    outcome: Mapping[str, Any],
    *,
    partition: int,
    history_limit: int = HISTORY_LIMIT,
) -> JobView:
    """The job's view after ``outcome`` (an ``outcome.avsc`` record dict)."""
    state = str(outcome["state"])
    at = int(outcome["at_ms"])
    attempt = int(outcome.get("attempt") or 0)
    view: JobView = (
        dict(prev)
        if prev
        else {
            "job_id": outcome["job_id"],
            "queue": outcome["queue"],
            "task": outcome["task"],
            "idempotency_key": outcome.get("idempotency_key"),
            "state": None,
            "attempts": 0,
            "first_seen_ms": at,
            "updated_ms": at,
            "due_ms": None,
            "fired_ms": None,
            "started_ms": None,
            "finished_ms": None,
            "duration_ms": None,
            "last_error": None,
            "duplicates": 0,
            "worker": None,
            "trace_id": None,
            "schedule_id": None,
            "partition": partition,
            "history": [],
        }
    )
    view["partition"] = partition
    view["updated_ms"] = max(int(view["updated_ms"]), at)
    view["first_seen_ms"] = min(int(view["first_seen_ms"]), at)
    view["attempts"] = max(int(view["attempts"]), attempt)
    # A worker's `rescheduled`: the delivery it skipped had the old due time.
    superseded = state == "rescheduled" and outcome.get("worker") is not None
    for key in ("due_ms", "worker", "trace_id", "schedule_id"):
        if outcome.get(key) is not None and not (superseded and key == "due_ms"):
            view[key] = outcome[key]
    if state == "duplicate":
        view["duplicates"] = int(view["duplicates"]) + 1
        if view["state"] is None:
            view["state"] = "duplicate"
    elif superseded:
        if view["state"] is None:
            view["state"] = "rescheduled"
    elif state == "scheduled" and view["state"] not in (None, "scheduled"):
        pass  # late or repeated: the job has moved on (history keeps it)
    elif state in STATES:
        view["state"] = state
        if state == "fired":
            view["fired_ms"] = at
        elif state == "started":
            view["started_ms"] = at
        if state in FINAL_STATES:
            view["finished_ms"] = at
        else:
            view["finished_ms"] = None
    if outcome.get("duration_ms") is not None:
        view["duration_ms"] = outcome["duration_ms"]
    if outcome.get("error") is not None or outcome.get("error_type") is not None:
        view["last_error"] = {
            "type": outcome.get("error_type"),
            "message": outcome.get("error"),
            "attempt": attempt,
            "at_ms": at,
        }
    history = [*list(view["history"]), [state, attempt, at]]
    view["history"] = history[-history_limit:]
    return view


def count_deltas(
    prev: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> list[tuple[str, str, int]]:
    """``(queue, state, +1/-1)`` changes of the per-queue counts for one job."""
    before = (prev["queue"], prev["state"]) if prev and prev.get("state") else None
    after = (new["queue"], new["state"]) if new and new.get("state") else None
    if before == after:
        return []
    out = []
    if before is not None:
        out.append((before[0], before[1], -1))
    if after is not None:
        out.append((after[0], after[1], 1))
    return out


def apply_deltas(
    counts: Mapping[str, int] | None, deltas: list[tuple[str, str, int]], queue: str
) -> dict[str, int]:
    """A queue's ``{state: count}`` after the deltas that concern ``queue``."""
    out = dict(counts or {})
    for q, state, delta in deltas:
        if q == queue:
            out[state] = max(0, out.get(state, 0) + delta)
    return {k: v for k, v in out.items() if v}


def expired(view: Mapping[str, Any], *, now_ms: int, retention_ms: int) -> bool:
    """True when a finished job has been quiet for ``retention_ms`` (leaves the table)."""
    return view.get("state") in FINAL_STATES and now_ms - int(view["updated_ms"]) >= retention_ms


def counts_key(queue: str, partition: int) -> str:
    """Key of the counts table: per queue *and* source partition.

    Faust writes a table change to the changelog partition of the event that
    caused it, so a key updated from several partitions would be restored in
    an undefined order; one key per (queue, partition) is always restored
    from the one partition that wrote it.
    """
    return f"{queue}@{partition}"


def queue_of_counts_key(key: str) -> str:
    return key.rpartition("@")[0]


def sum_counts(rows: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``{queue: {state: n}}`` summed over partitions from the counts table."""
    out: dict[str, dict[str, int]] = {}
    for key, counts in rows.items():
        q = out.setdefault(queue_of_counts_key(key), {})
        for state, n in counts.items():
            q[state] = q.get(state, 0) + int(n)
    return out
