"""What the status view accepts of an ``Outcome`` record (pure).

The status view folds every outcome into its tables and shows its times as
dates: a number out of range there would fail the fold or the page. An
outcome that decodes but holds one is quarantined (``field out of range``)
instead; docs/wire-format.md#accepted-ranges lists the ranges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dueflow.rules.wire_bounds import (
    MAX_DUE_MS,
    MAX_ID_CHARS,
    MAX_INT32,
    MAX_LONG,
    MIN_TIME_MS,
    MS_ACCEPTED,
    finite,
    in_range,
    name,
)


def check_outcome(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """``rec`` (a decoded Outcome) when its fields are in range; else
    :class:`FieldOutOfRange` naming the first one that is not."""
    name(rec["job_id"], "job_id", most=MAX_ID_CHARS)
    in_range(rec["attempt"], "attempt", low=0, high=MAX_INT32, accepted=f"0 to {MAX_INT32}")
    in_range(rec["at_ms"], "at_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=MS_ACCEPTED)
    due = rec.get("due_ms")
    if due is not None:
        in_range(due, "due_ms", low=MIN_TIME_MS, high=MAX_DUE_MS, accepted=f"null or {MS_ACCEPTED}")
    duration = rec.get("duration_ms")
    if duration is not None:
        finite(
            duration,
            "duration_ms",
            low=0.0,
            high=float(MAX_LONG),
            accepted=f"null or a number of ms from 0 to {MAX_LONG}",
        )
    progress = rec.get("progress")  # version 3: a bar on the status page
    if progress is not None:
        finite(progress, "progress", low=0.0, high=1.0, accepted="null or a number from 0 to 1")
    return rec
