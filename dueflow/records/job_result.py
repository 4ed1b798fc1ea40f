"""A handler's return value and progress reports, as the outcome carries them (pure).

A handler's return value is the job's result: UTF-8 JSON in the ``result``
field of its ``succeeded`` outcome (Outcome version 3). ``None`` is no
result (the outcome stays version 1, nothing new on the wire). A value that
JSON cannot hold, or whose JSON is longer than the cap
(``worker.result_max_bytes``, or the task's ``result_max_bytes``), is not
kept: the outcome carries ``result_error`` instead and the job still
succeeded (its side effects happened; running it again would repeat them).

Progress is a fraction from 0 to 1 and/or a small JSON detail (at most
:data:`PROGRESS_DETAIL_MAX_BYTES`), checked when the handler reports it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import orjson

from dueflow.errors import InvalidInput
from dueflow.records.job_request import _non_finite

PROGRESS_DETAIL_MAX_BYTES = 1_024


class JobResult(NamedTuple):
    """What an attempt's return value became: ``json`` (UTF-8 JSON) or ``error``
    (why it was not kept). Picklable: a child process sends one back."""

    json: bytes | None
    error: str | None = None


def encode_result(value: Any, *, max_bytes: int) -> JobResult | None:
    """The result of a handler that returned ``value``: None for ``None``."""
    if value is None:
        return None
    return limit_result(to_json(value), max_bytes=max_bytes)


def to_json(value: Any) -> JobResult:
    """``value`` as JSON, without a size limit (a child process encodes it so; the
    worker applies the cap with :func:`limit_result`)."""
    if isinstance(value, JobResult):
        return value
    try:
        raw = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        return JobResult(None, f"result is not JSON: {type(value).__name__} value ({exc})")
    if b"null" in raw:  # orjson writes NaN and Infinity as null: look only then
        found = _non_finite(value)
        if found is not None:
            steps, number = found
            path = "result" + "".join(f"[{s!r}]" for s in reversed(steps))
            return JobResult(
                None, f"result is not JSON: {path} is {number!r} (JSON has no NaN or Infinity)"
            )
    return JobResult(raw)


def limit_result(result: JobResult, *, max_bytes: int) -> JobResult:
    """``result`` if its JSON holds within ``max_bytes``, else its error."""
    raw = result.json
    if raw is not None and len(raw) > max_bytes:
        return JobResult(
            None,
            f"result of {len(raw):,} bytes exceeds worker.result_max_bytes = {max_bytes:,} "
            "(a task's own: @task(result_max_bytes=...))",
        )
    return result


def decode_result(raw: bytes | None) -> Any:
    """A ``result`` field's value (``None``: no result)."""
    return None if raw is None else orjson.loads(raw)


class Progress(NamedTuple):
    """One progress report: ``fraction`` (0..1) and ``detail`` (UTF-8 JSON); either
    may be None, not both."""

    fraction: float | None
    detail: bytes | None


def check_progress(fraction: Any, detail: Any) -> Progress:
    """A handler's ``ctx.progress(fraction, detail)``, checked;
    :class:`~dueflow.errors.InvalidInput` names what is wrong."""
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise InvalidInput("fraction", fraction, "a number from 0 to 1, or None")
        fraction = float(fraction)
        if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
            raise InvalidInput("fraction", fraction, "a number from 0 to 1, or None")
    raw: bytes | None = None
    if detail is not None:
        encoded = to_json(detail)
        if encoded.json is None:
            raise InvalidInput("detail", detail, f"a JSON value ({encoded.error})")
        raw = encoded.json
        if len(raw) > PROGRESS_DETAIL_MAX_BYTES:
            raise InvalidInput(
                "detail",
                f"{len(raw):,} bytes of JSON",
                f"at most {PROGRESS_DETAIL_MAX_BYTES:,} bytes of JSON",
            )
    if fraction is None and raw is None:
        raise InvalidInput("fraction", None, "a number from 0 to 1, or a detail (both None)")
    return Progress(fraction, raw)
