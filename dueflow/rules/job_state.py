"""What the status view knows about one job, and how an outcome changes it (pure).

A job's view is a plain dict (the value of the faust table, stored as JSON)
built by folding the job's outcome records in log order with
:func:`apply_outcome`. Per-queue counts by state change by the deltas of
:func:`count_deltas`. Nothing here reads the clock: ``now_ms`` is an argument.

Rules:

- the state follows the newest outcome, except ``duplicate`` (a skipped
  second delivery: counted in ``duplicates``, the state stays), a worker's
  ``rescheduled`` without a ``command_id`` (a delivery superseded by a
  reschedule, skipped: the state and the due time stay those of the
  ``rescheduled`` that moved the job, the client's or, answering a command,
  the worker's; see dueflow.records.reschedule and dueflow.rules.steering),
  ``refused`` (a command that was not applied: the job is unchanged),
  ``scheduled`` once the job has any other state (the client writes it
  after the timer, so a fast job's first worker outcome can land before
  it; and a job id scheduled again after it ran stays what it was), and
  ``unknown`` (a state this reader does not know yet: ignored);
- ``deduplicated``: the job id was scheduled with a unique key another job
  held (``first_job_id``); nothing of it runs;
- ``exec_partition``: the exec partition a worker reported the job from
  (Outcome v3), where commands about it go;
- ``attempts`` is the highest attempt seen;
- ``finished_ms`` is set by a final state and cleared when the job moves on
  again (a redriven dead job);
- ``started`` means running: a worker writes it for an attempt that runs long
  or reports progress (``ctx.progress``), maybe several times per attempt;
  history keeps one entry per attempt, and a ``started`` that arrives once the
  job is final (a progress report of an attempt a worker gave up, written
  late) changes nothing;
- ``started_ms`` is when the newest attempt that ran started: its first
  ``started``, then its end outcome's time less its duration (workers write
  outcomes when an attempt ends);
- ``fired_ms`` is when the emitter fired the delivery a worker reported on:
  the ``df-fired`` header the worker copies from the exec record onto its
  outcome (``fired_ms`` argument), or a ``fired`` outcome (a redrive);
- ``next_due_ms`` is when the next attempt of a ``retrying`` job is due: the
  ``df-next-due`` header of its ``retrying`` outcome (``next_due_ms``
  argument), also kept in that outcome's history entry; it is left out while
  the job is in any other state, and a ``retrying`` outcome without the header
  (a worker of the release before) leaves it unknown. ``due_ms`` stays the
  job's own due time (every attempt's outcome carries it);
- ``last_error`` keeps the newest error (type, message, attempt, time);
- texts are kept at most :data:`TEXT_MAX_CHARS` long (:data:`MESSAGE_MAX_CHARS`
  for an error message), so a view stays small whatever an outcome holds (the
  view is written to the table's changelog topic, which has a size limit); an
  outcome whose job id is longer than :data:`JOB_ID_MAX_CHARS` cannot be a job
  (``ValueError``: the reader skips it).
- ``history`` keeps the newest :data:`HISTORY_LIMIT` outcomes as
  ``[state, attempt, at_ms]``, with a fourth element when the outcome names a
  worker, a duration or an error (:func:`history_detail`);
- ``queues`` appears when a job id has outcomes in more than one queue (an id
  reused across queues): every queue, first seen first;
- an outcome that answers a command (its ``command_id``: a worker's
  ``cancelled``, ``rescheduled``, ``updated`` or ``refused``) sets
  ``last_command`` (``command_id``, ``outcome``, ``at_ms``, and for a refusal
  its ``error``, which is not the job's ``last_error``: the job did not fail);
  ``version`` (the command that made the job's current version) follows every
  outcome that carries one but ``refused``; a ``cancelled`` verdict while an
  attempt runs (``started``) leaves the state: the attempt finishes, and its
  end (or the skipped retry's ``cancelled``) ends the job;
- ``deduplicated`` (the job was not admitted: ``first_job_id`` holds the key)
  is final;
- ``progress`` (fraction), ``progress_detail`` (JSON), ``progress_attempt``
  and ``progress_ms`` are the newest progress any outcome carried (kept after
  the job ends);
- ``result`` (the handler's return value, JSON) and ``result_error`` come from
  the newest ``succeeded`` outcome;
- bytes fields (``result``, ``progress_detail``: UTF-8 JSON) are kept as the
  JSON value they hold; one that is not JSON, or longer than
  :data:`JSON_FIELD_MAX_BYTES`, is left out and said why in
  ``<field>_error``;
- any other field of the outcome (a newer schema's, e.g. a result or a
  progress report) is carried into the view when it is set, newest value
  first, unless the view has a field of that name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from dueflow.rules.wire_bounds import MAX_DUE_MS, MIN_TIME_MS

# The `state` enum of the outcome schema (outcome.avsc), in symbol order: each
# version appends its symbols to those of the version before. The only table of
# them: the fast codec (dueflow.records.worker_codec) encodes a state as its index here.
OUTCOME_STATES_V1 = (
    "scheduled",
    "fired",
    "started",
    "succeeded",
    "retrying",
    "dead",
    "cancelled",
    "duplicate",
    "unknown",  # the reader's default for a symbol it does not know
)
OUTCOME_STATES_V2 = (
    *OUTCOME_STATES_V1,
    "rescheduled",  # the client moved the job (pending, at its new due time)
    "expired",  # not started by its deadline: not run
    "skipped",  # a cron occurrence skipped by its schedule's overlap policy
)
OUTCOME_STATES = (
    *OUTCOME_STATES_V2,
    "updated",  # its payload was updated by a command (pending)
    "refused",  # a command that was not applied: the job is unchanged
    "deduplicated",  # not admitted: a job with its unique key exists (first_job_id)
)
# The states a job's view can be in: every outcome state but `unknown` (ignored)
# and `refused` (changes nothing).
STATES = tuple(s for s in OUTCOME_STATES if s not in ("unknown", "refused"))
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled", "expired", "skipped", "deduplicated"})
# Outcomes of an attempt that ran: their duration is the handler's.
RAN_STATES = frozenset({"succeeded", "retrying", "dead"})
HISTORY_LIMIT = 20
JOB_ID_MAX_CHARS = 255  # dueflow.records.job_request.MAX_NAME_CHARS
TEXT_MAX_CHARS = 500
MESSAGE_MAX_CHARS = 2_000
# A result or progress detail larger than this is left out of the view: the view
# goes to the changelog topic as one record (the broker's default limit is 1 MiB).
JSON_FIELD_MAX_BYTES = 256 * 1024
HISTORY_ERROR_CHARS = TEXT_MAX_CHARS  # of an error's text kept in each history entry
# Outcome fields the fold reads itself; others are carried into the view as they are.
FOLDED_FIELDS = frozenset(
    {
        "job_id",
        "queue",
        "task",
        "idempotency_key",
        "state",
        "attempt",
        "at_ms",
        "due_ms",
        "duration_ms",
        "error_type",
        "error",
        "worker",
        "trace_id",
        "schedule_id",
        "command_id",
        "version",
        "result",
        "result_error",
        "progress",
        "progress_detail",
    }
)
VIEW_FIELDS = frozenset(
    {
        "job_id",
        "queue",
        "queues",
        "task",
        "idempotency_key",
        "state",
        "attempts",
        "first_seen_ms",
        "updated_ms",
        "due_ms",
        "fired_ms",
        "started_ms",
        "finished_ms",
        "duration_ms",
        "last_error",
        "duplicates",
        "worker",
        "trace_id",
        "schedule_id",
        "partition",
        "history",
        "content_hash",
        "last_command",
        "version",
        "next_due_ms",
    }
)

JobView = dict[str, Any]


def apply_outcome(
    prev: Mapping[str, Any] | None,
    outcome: Mapping[str, Any],
    *,
    partition: int,
    history_limit: int = HISTORY_LIMIT,
    fired_ms: int | None = None,
    next_due_ms: int | None = None,
) -> JobView:
    """The job's view after ``outcome`` (an ``outcome.avsc`` record dict); ``fired_ms``
    and ``next_due_ms``: the outcome record's ``df-fired`` and ``df-next-due`` headers
    (:func:`header_ms`), if it has them (``next_due_ms`` counts on ``retrying`` only)."""
    state = str(outcome["state"])
    at = int(outcome["at_ms"])
    if len(str(outcome["job_id"])) > JOB_ID_MAX_CHARS:
        raise ValueError(f"a job id of {len(str(outcome['job_id']))} characters")
    attempt = int(outcome.get("attempt") or 0)
    view: JobView = dict(prev) if prev else _new_view(outcome, at, partition)
    step = _Step(
        state=state,
        at=at,
        attempt=attempt,
        next_due_ms=next_due_ms if state == "retrying" else None,
        # Another `started` of the attempt that runs (a progress report): the same run.
        running_again=(
            state == "started" and view["state"] == "started" and int(view["attempts"]) == attempt
        ),
        # A worker's `rescheduled` that answers no command: the delivery it skipped had
        # the old due time.
        superseded=(
            state == "rescheduled"
            and outcome.get("worker") is not None
            and outcome.get("command_id") is None
        ),
    )
    _fold_identity(view, outcome, step, partition)
    if state == "started" and view["state"] in FINAL_STATES:
        return _late_started(view, state, attempt, at, history_limit)
    _TRANSITIONS.get(state, _enter_state)(view, outcome, step)
    _fold_run(view, outcome, step, fired_ms)
    _fold_command(view, outcome, step)
    _fold_error(view, outcome, step)
    _fold_queues(view, outcome)
    _carry_other_fields(view, outcome)
    _fold_progress(view, outcome, step)
    _fold_result(view, outcome, step)
    if not step.running_again:
        detail = history_detail(outcome, next_due_ms=step.next_due_ms)
        history = [*list(view["history"]), [state, attempt, at, *detail]]
        view["history"] = history[-history_limit:]
    return view


@dataclass(slots=True)
class _Step:
    """What :func:`apply_outcome` derived from one outcome, passed to each part of the fold."""

    state: str
    at: int
    attempt: int
    next_due_ms: int | None  # None but on `retrying`
    running_again: bool
    superseded: bool


def _new_view(outcome: Mapping[str, Any], at: int, partition: int) -> JobView:
    """The view of a job before its first outcome is folded in."""
    return {
        "job_id": outcome["job_id"],
        "queue": _short(outcome["queue"]),
        "task": _short(outcome["task"]),
        "idempotency_key": _short(outcome.get("idempotency_key")),
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


def _fold_identity(view: JobView, outcome: Mapping[str, Any], step: _Step, partition: int) -> None:
    """Times seen, attempts, the due time and where the job is: every outcome's part."""
    view["partition"] = partition
    view["updated_ms"] = max(int(view["updated_ms"]), step.at)
    view["first_seen_ms"] = min(int(view["first_seen_ms"]), step.at)
    view["attempts"] = max(int(view["attempts"]), step.attempt)
    keeps_due = step.superseded or step.state == "refused"
    for key in ("due_ms", "worker", "trace_id", "schedule_id"):
        if outcome.get(key) is not None and not (keeps_due and key == "due_ms"):
            view[key] = _short(outcome[key])
    if outcome.get("exec_partition") is not None:
        # where the job is delivered (a job admitted under a unique key: its key's)
        view["exec_partition"] = int(outcome["exec_partition"])
    if outcome.get("first_job_id") is not None:
        view["first_job_id"] = _short(outcome["first_job_id"])


def _enter_state(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    """The job takes the outcome's state (one it knows: ``unknown`` is ignored)."""
    state = step.state
    if state not in STATES:
        return
    view["state"] = state
    if step.next_due_ms is not None:
        view["next_due_ms"] = step.next_due_ms
    else:  # waits for nothing, or for a retry whose due time it was not told
        view.pop("next_due_ms", None)
    if state == "fired":
        view["fired_ms"] = step.at
    elif state == "started" and not step.running_again:
        view["started_ms"] = step.at
    if state in FINAL_STATES:
        view["finished_ms"] = step.at
    else:
        view["finished_ms"] = None


def _on_duplicate(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    view["duplicates"] = int(view["duplicates"]) + 1
    if view["state"] is None:
        view["state"] = "duplicate"


def _on_rescheduled(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    if not step.superseded:
        _enter_state(view, outcome, step)
    elif view["state"] is None:
        view["state"] = "rescheduled"


def _on_refused(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    """A command not applied: nothing changed (history keeps it)."""


def _on_scheduled(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    # late or repeated once the job has moved on: nothing changes (history keeps it)
    if view["state"] in (None, "scheduled"):
        _enter_state(view, outcome, step)


def _on_cancelled(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    # cancelled while an attempt runs: that attempt's end ends the job
    if not (outcome.get("command_id") and view["state"] == "started"):
        _enter_state(view, outcome, step)


# How an outcome changes the job's state, by outcome state; any other: _enter_state.
_TRANSITIONS: dict[str, Callable[[JobView, Mapping[str, Any], _Step], None]] = {
    "duplicate": _on_duplicate,
    "rescheduled": _on_rescheduled,
    "refused": _on_refused,
    "scheduled": _on_scheduled,
    "cancelled": _on_cancelled,
}


def _fold_run(view: JobView, outcome: Mapping[str, Any], step: _Step, fired_ms: int | None) -> None:
    """The duration of an attempt, when it started, and when its delivery fired."""
    if outcome.get("duration_ms") is not None:
        view["duration_ms"] = outcome["duration_ms"]
        if step.state in RAN_STATES:
            view["started_ms"] = int(step.at - outcome["duration_ms"])
    if fired_ms is not None and step.state != "duplicate":
        view["fired_ms"] = fired_ms


def _fold_command(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    """``last_command`` of an outcome that answers one, and the job's ``version``."""
    command_id = outcome.get("command_id")
    if command_id is not None:
        view["last_command"] = {
            "command_id": _short(command_id),
            "outcome": step.state,
            "at_ms": step.at,
            **(
                {"error": _short(outcome.get("error"), MESSAGE_MAX_CHARS)}
                if step.state == "refused"
                else {}
            ),
        }
    if outcome.get("version") is not None and step.state != "refused":
        view["version"] = _short(outcome["version"])


def _fold_error(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    if step.state == "refused":
        return  # the refusal's reason is the command's (last_command), not the job's
    if outcome.get("error") is not None or outcome.get("error_type") is not None:
        view["last_error"] = {
            "type": _short(outcome.get("error_type")),
            "message": _short(outcome.get("error"), MESSAGE_MAX_CHARS),
            "attempt": step.attempt,
            "at_ms": step.at,
        }


def _fold_queues(view: JobView, outcome: Mapping[str, Any]) -> None:
    """``queues``: every queue a job id has outcomes in, once there is more than one."""
    queue = outcome["queue"]
    if queue != view["queue"]:
        queues = list(view.get("queues") or [view["queue"]])
        if queue not in queues:
            view["queues"] = [*queues, queue]


def _carry_other_fields(view: JobView, outcome: Mapping[str, Any]) -> None:
    """Fields of the outcome the fold does not read (a newer schema's), as they are."""
    for key, value in outcome.items():
        if value is None or key in FOLDED_FIELDS or key in VIEW_FIELDS:
            continue
        if isinstance(value, bytes):
            decoded, error = _json_field(value)
            if error is not None:
                view.pop(key, None)
                view[f"{key}_error"] = error
                continue
            view.pop(f"{key}_error", None)
            value = decoded
        view[key] = value


def _fold_progress(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    if outcome.get("progress") is not None or outcome.get("progress_detail") is not None:
        view["progress"] = outcome.get("progress")
        detail = outcome.get("progress_detail")
        view["progress_detail"], error = _json_value(detail)
        _set_error(view, "progress_detail_error", error)
        view["progress_attempt"] = step.attempt
        view["progress_ms"] = step.at


def _fold_result(view: JobView, outcome: Mapping[str, Any], step: _Step) -> None:
    """``result`` and ``result_error`` of a ``succeeded`` outcome."""
    raw = outcome.get("result")
    if step.state == "succeeded" and (
        raw is not None or outcome.get("result_error") is not None or "result" in view
    ):
        value, error = _json_value(raw)
        if error is not None:  # not JSON, or too large for the view
            view.pop("result", None)
            view["result_error"] = error
        else:
            view["result"] = value
            view["result_error"] = _short(outcome.get("result_error"), MESSAGE_MAX_CHARS)


def _late_started(view: JobView, state: str, attempt: int, at: int, history_limit: int) -> JobView:
    """A ``started`` after the job's end: only its history records it."""
    history = [*list(view["history"]), [state, attempt, at]]
    view["history"] = history[-history_limit:]
    return view


def _json_value(raw: Any) -> tuple[Any, str | None]:
    """An outcome's JSON field as a value: its bytes decoded (:func:`_json_field`);
    None, or a value already decoded (a record made in memory), as it is."""
    if isinstance(raw, bytes | bytearray):
        return _json_field(bytes(raw))
    return raw, None


def _set_error(view: JobView, key: str, error: str | None) -> None:
    if error is None:
        view.pop(key, None)
    else:
        view[key] = error


def history_detail(
    outcome: Mapping[str, Any], *, next_due_ms: int | None = None
) -> list[dict[str, Any]]:
    """The fourth element of a history entry (none when the outcome has nothing to
    add): the worker, duration and error of an attempt, the error text cut to
    :data:`HISTORY_ERROR_CHARS`, and a retry's ``next_due_ms`` (the timeline of the
    console; readers of the first three elements are unaffected)."""
    detail: dict[str, Any] = {}
    if next_due_ms is not None:
        detail["next_due_ms"] = next_due_ms
    for key in ("worker", "duration_ms", "error_type"):
        if outcome.get(key) is not None:
            detail[key] = outcome[key]
    if outcome.get("error") is not None:
        detail["error"] = _short(str(outcome["error"]), HISTORY_ERROR_CHARS)
    return [detail] if detail else []


def header_ms(raw: bytes | None) -> int | None:
    """A time header (``df-fired``, ``df-next-due``: ASCII epoch ms) as an int; None when
    absent or bad."""
    if raw is None:
        return None
    try:
        ms = int(raw)
    except ValueError:
        return None
    # another writer's number out of the times a record may hold: as if absent
    return ms if MIN_TIME_MS <= ms <= MAX_DUE_MS else None


def _json_field(raw: bytes) -> tuple[Any, str | None]:
    """The JSON value a bytes field holds, or why it is not kept."""
    if len(raw) > JSON_FIELD_MAX_BYTES:
        return None, f"{len(raw)} bytes: over the status view's {JSON_FIELD_MAX_BYTES}"
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as exc:
        return None, _short(f"not UTF-8 JSON: {exc}")


def _short(value: Any, limit: int = TEXT_MAX_CHARS) -> Any:
    """A text cut to ``limit`` characters (marked); anything else as it is."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 3] + "..."
    return value


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
